"""The effects API's routes, under ``/api/v1/`` beside the workflows API (waymark_config/urls.py).

As there, each answers with and without a trailing slash (a redirect would lose a POST
body); only the bare form is in the schema."""

from django.urls import URLPattern, path
from rest_framework.views import APIView

from . import api

app_name = "effects_api"


def route(pattern: str, view: type[APIView], name: str) -> list[URLPattern]:
    return [
        path(pattern, view.as_view(), name=name),
        path(f"{pattern}/", view.as_view(schema=None)),
    ]


urlpatterns = [
    *route("connections", api.ConnectionListView, "connections"),
    *route("connections/<str:name>", api.ConnectionDetailView, "connection"),
    *route("connections/<str:name>/check", api.ConnectionCheckView, "connection-check"),
    *route("connections/<str:name>/repair", api.ConnectionRepairView, "connection-repair"),
    *route("suppressions", api.SuppressionListView, "suppressions"),
    *route("suppressions/<int:suppression_id>", api.SuppressionDetailView, "suppression"),
    *route("egress-allowlist", api.EgressAllowListView, "egress-allowlist"),
    *route("egress-allowlist/<int:entry_id>", api.EgressAllowDetailView, "egress-allow"),
    *route("effects", api.EffectListView, "effects"),
    *route("effects/<int:effect_id>", api.EffectDetailView, "effect"),
    *route("effects/<int:effect_id>/resolve", api.EffectResolveView, "effect-resolve"),
]
