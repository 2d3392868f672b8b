"""The API's routes. Each answers with and without a trailing slash: DRF clients add one,
others do not, and a redirect would lose a POST body. Only the bare form is in the schema.
The root, the schema and the docs page are named with their slash; the root without one,
``/api/v1``, is outside this module's prefix: ``root_urls`` routes it."""

from typing import Any

from django.urls import URLPattern, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.views import APIView

from . import audit, erasures, migrations, reruns, signals, views

app_name = "api"


def route(pattern: str, view: type[APIView], name: str) -> list[URLPattern]:
    return [
        path(pattern, view.as_view(), name=name),
        path(f"{pattern}/", view.as_view(schema=None)),
    ]


PUBLIC: dict[str, Any] = {"authentication_classes": [], "permission_classes": []}

urlpatterns = [
    path("", views.ApiRootView.as_view(), name="root"),
    path("schema/", SpectacularAPIView.as_view(**PUBLIC), name="schema"),
    path("schema", SpectacularAPIView.as_view(**PUBLIC)),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema", **PUBLIC), name="docs"),
    path("docs", SpectacularSwaggerView.as_view(url_name="api:schema", **PUBLIC)),
    *route("automations", views.AutomationListView, "automations"),
    *route("automations/<slug:slug>", views.AutomationDetailView, "automation"),
    *route("automations/<slug:slug>/versions", views.VersionListView, "versions"),
    *route("automations/<slug:slug>/versions/<int:number>", views.VersionDetailView, "version"),
    *route(
        "automations/<slug:slug>/versions/<int:number>/publish",
        views.VersionPublishView,
        "version-publish",
    ),
    *route("automations/<slug:slug>/migrations", migrations.MigrationListView, "migrations"),
    *route(
        "automations/<slug:slug>/migrations/<int:migration_id>",
        migrations.MigrationDetailView,
        "migration",
    ),
    *route("runs", views.RunListView, "runs"),
    *route("runs/<int:run_id>", views.RunDetailView, "run"),
    *route("runs/<int:run_id>/steps", views.RunStepListView, "run-steps"),
    *route("runs/<int:run_id>/history", views.RunHistoryView, "run-history"),
    *route("runs/<int:run_id>/rerun", reruns.RunRerunView, "run-rerun"),
    # One operation per route; the view answers 404 for an action it does not know.
    *route("runs/<int:run_id>/<slug:action>", views.RunActionView, "run-act"),
    *route("runs/bulk/<slug:action>", views.RunBulkActionView, "runs-bulk"),
    *route("signals", signals.SignalListView, "signals"),
    *route("inbound-email", signals.InboundEmailView, "inbound-email"),
    *route("audit", audit.AuditListView, "audit"),
    *route("erasures", erasures.ErasureListView, "erasures"),
]
