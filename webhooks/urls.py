"""The webhooks API's routes, under ``/api/v1/`` (waymark_config/urls.py). As the other APIs',
each answers with and without a trailing slash; only the bare form is in the schema."""

from django.urls import URLPattern, path
from rest_framework.views import APIView

from . import api

app_name = "webhooks_api"


def route(pattern: str, view: type[APIView], name: str) -> list[URLPattern]:
    return [
        path(pattern, view.as_view(), name=name),
        path(f"{pattern}/", view.as_view(schema=None)),
    ]


DELIVERY = "webhooks/<int:webhook_id>/deliveries/<int:delivery_id>"

urlpatterns = [
    *route("webhooks", api.WebhookListView, "webhooks"),
    *route("webhooks/<int:webhook_id>", api.WebhookDetailView, "webhook"),
    *route("webhooks/<int:webhook_id>/rotate-secret", api.WebhookSecretView, "webhook-secret"),
    *route("webhooks/<int:webhook_id>/deliveries", api.DeliveryListView, "deliveries"),
    *route(DELIVERY, api.DeliveryDetailView, "delivery"),
    *route(f"{DELIVERY}/redeliver", api.DeliveryRedeliverView, "delivery-redeliver"),
]
