"""The webhooks API (``/api/v1/webhooks``; routes in ``webhooks/urls.py``): an organisation's
subscriptions and their deliveries, scoped to the API key's organisation like every list
(another organisation's subscription is a 404), strict about unknown fields and filters.

A subscription's signing secret is returned once, by the creation and by ``rotate-secret``;
no other answer carries it, or its ciphertext.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from workflows.models import Organisation
from workflows.plugins.api import (
    CursorPage,
    ErrorOut,
    ListEndpoint,
    StrictInput,
    request_actor,
    request_key,
)

from .events import EVENT_TYPES
from .models import Delivery, DeliveryStatus, Subscription
from .services import (
    URL_CHARS,
    delivery_get,
    delivery_redeliver,
    webhook_create,
    webhook_delete,
    webhook_get,
    webhook_rotate_secret,
    webhook_update,
)


def _org(request: Request) -> Organisation:
    return request_key(request).org


def _enum(name: str, values: list[str]) -> Any:
    return extend_schema_field({"type": "string", "enum": values}, component_name=name)


@_enum("WebhookEventTypeEnum", list(EVENT_TYPES))
class EventTypeField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        message: dict[str, Any] = {"invalid_choice": f"Must be one of {', '.join(EVENT_TYPES)}."}
        super().__init__(choices=list(EVENT_TYPES), error_messages=message, **kwargs)


@_enum("DeliveryStatusEnum", DeliveryStatus.values)
class DeliveryStatusField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=DeliveryStatus.choices, **kwargs)


class WebhookOut(serializers.ModelSerializer[Subscription]):
    event_types = serializers.ListField(child=EventTypeField())

    class Meta:
        model = Subscription
        fields = ["id", "url", "description", "event_types", "active", "created_at",
                  "updated_at"]  # fmt: skip


class WebhookCreatedOut(WebhookOut):
    secret = serializers.SerializerMethodField(
        help_text="The signing secret (`whsec_…`), shown this once: keep it where your "
        "receiver reads it. Waymark stores it encrypted and never returns it again."
    )

    class Meta(WebhookOut.Meta):
        fields = [*WebhookOut.Meta.fields, "secret"]

    def get_secret(self, subscription: Subscription) -> str:
        return str(self.context["secret"])


class WebhookSecretOut(serializers.Serializer):
    id = serializers.IntegerField()
    secret = serializers.CharField(help_text="The new signing secret, shown this once.")


class WebhookSettingsIn(StrictInput):
    url = serializers.CharField(
        max_length=URL_CHARS, trim_whitespace=False,
        help_text="An https:// URL (http:// only where WAYMARK_WEBHOOK_ALLOW_HTTP is set). "
        "Sent through the egress rules: a private or internal address is refused unless the "
        "organisation's egress allowlist opens it.",
    )  # fmt: skip
    event_types = serializers.ListField(child=EventTypeField(), min_length=1, max_length=50)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    active = serializers.BooleanField(required=False, help_text="Inactive: nothing is queued.")


class WebhookIn(WebhookSettingsIn):
    pass


class WebhookPatchIn(WebhookSettingsIn):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.required = False


class DeliveryOut(serializers.ModelSerializer[Delivery]):
    webhook = serializers.IntegerField(source="subscription_id")
    run = serializers.IntegerField(source="run_id", allow_null=True)
    event_type = EventTypeField()
    status = DeliveryStatusField(
        help_text="`pending`: to be sent from `next_at` (in flight while `lease_until` is "
        "ahead); `delivered`: the endpoint answered 2xx; `failed`: attempts used up or refused "
        "for good (`last_error` says why); `redeliver` sends it again."
    )
    # The metaclass pops declared fields off the class, so this does not shadow
    # Serializer.data at runtime (as ErrorOut's `errors`); the stubs see a class attribute.
    data = serializers.JSONField(  # type: ignore[assignment]
        source="payload", help_text="The body's `data`: what the event says."
    )

    class Meta:
        model = Delivery
        fields = [
            "id", "webhook", "event_type", "event_id", "run", "occurred_at", "status",
            "attempts", "next_at", "lease_until", "last_attempt_at", "last_status",
            "last_error", "last_response", "created_at", "delivered_at", "data",
        ]  # fmt: skip


class DeliveryFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(
        choices=DeliveryStatus.choices,
        error_messages={"invalid_choice": f"must be one of {', '.join(DeliveryStatus.values)}"},
        help_text="Only deliveries in this status (`failed`: given up).",
    )
    event_type = django_filters.ChoiceFilter(
        choices=[(name, name) for name in EVENT_TYPES],
        error_messages={"invalid_choice": f"must be one of {', '.join(EVENT_TYPES)}"},
        help_text="Only deliveries of this event type.",
    )

    class Meta:
        model = Delivery
        fields = ["status", "event_type"]


class WebhookListView(ListEndpoint):
    model = Subscription
    serializer_class = WebhookOut
    pagination_class = CursorPage

    @extend_schema(
        operation_id="webhooks_list",
        responses=WebhookOut(many=True),
        description="The organisation's webhook subscriptions, newest first. Never their secrets.",
    )
    def get(self, request: Request) -> Response:
        return self.list_page()

    @extend_schema(
        operation_id="webhooks_create",
        request=WebhookIn,
        responses={201: WebhookCreatedOut, 400: ErrorOut, 409: ErrorOut},
        description="Subscribe an endpoint to event types. The answer carries the signing "
        "secret, this once. An organisation has at most WAYMARK_WEBHOOK_MAX_SUBSCRIPTIONS "
        "(409 `quota_exceeded`).",
    )
    def post(self, request: Request) -> Response:
        data = WebhookIn(data=request.data)
        data.is_valid(raise_exception=True)
        subscription, secret = webhook_create(
            org=_org(request), actor=request_actor(request), **data.validated_data
        )
        answer = WebhookCreatedOut(subscription, context={"secret": secret}).data
        return Response(answer, status=status.HTTP_201_CREATED)


class WebhookDetailView(APIView):
    @extend_schema(operation_id="webhooks_read", responses={200: WebhookOut, 404: ErrorOut})
    def get(self, request: Request, webhook_id: int) -> Response:
        return Response(WebhookOut(webhook_get(_org(request), webhook_id)).data)

    @extend_schema(
        operation_id="webhooks_update",
        request=WebhookPatchIn,
        responses={200: WebhookOut, 400: ErrorOut, 404: ErrorOut},
        description="Change the URL, the event types, the description, or pause it "
        "(`active`: false; nothing is queued meanwhile, and what was queued fails). Events "
        "already queued go to the URL as it is when they are sent.",
    )
    def patch(self, request: Request, webhook_id: int) -> Response:
        subscription = webhook_get(_org(request), webhook_id)
        data = WebhookPatchIn(data=request.data)
        data.is_valid(raise_exception=True)
        changed = webhook_update(subscription, actor=request_actor(request),
                                 **data.validated_data)  # fmt: skip
        return Response(WebhookOut(changed).data)

    @extend_schema(
        operation_id="webhooks_delete",
        responses={204: None, 404: ErrorOut},
        description="Delete the subscription and its deliveries (pending ones are not sent).",
    )
    def delete(self, request: Request, webhook_id: int) -> Response:
        webhook_delete(webhook_get(_org(request), webhook_id), actor=request_actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookSecretView(APIView):
    @extend_schema(
        operation_id="webhooks_rotate_secret",
        request=None,
        responses={200: WebhookSecretOut, 404: ErrorOut},
        description="A new signing secret, returned this once; every attempt from now on is "
        "signed with it (the old one no longer verifies).",
    )
    def post(self, request: Request, webhook_id: int) -> Response:
        subscription = webhook_get(_org(request), webhook_id)
        secret = webhook_rotate_secret(subscription, actor=request_actor(request))
        return Response(WebhookSecretOut({"id": subscription.pk, "secret": secret}).data)


class DeliveryListView(ListEndpoint):
    model = Delivery
    serializer_class = DeliveryOut
    pagination_class = CursorPage
    filterset_class = DeliveryFilter

    def scoped_queryset(self) -> QuerySet[Delivery]:
        subscription = webhook_get(_org(self.request), self.kwargs["webhook_id"])
        return Delivery.objects.filter(subscription=subscription)

    @extend_schema(
        operation_id="webhooks_deliveries_list",
        responses=DeliveryOut(many=True),
        description="The subscription's deliveries, newest first: `?status=failed` lists "
        "those given up.",
    )
    def get(self, request: Request, webhook_id: int) -> Response:
        return self.list_page()


class DeliveryDetailView(APIView):
    @extend_schema(
        operation_id="webhooks_deliveries_read", responses={200: DeliveryOut, 404: ErrorOut}
    )
    def get(self, request: Request, webhook_id: int, delivery_id: int) -> Response:
        subscription = webhook_get(_org(request), webhook_id)
        return Response(DeliveryOut(delivery_get(subscription, delivery_id)).data)


class DeliveryRedeliverView(APIView):
    @extend_schema(
        operation_id="webhooks_deliveries_redeliver",
        request=None,
        responses={200: DeliveryOut, 404: ErrorOut, 409: ErrorOut},
        description="Send a failed delivery again: a new series of attempts, with the same "
        "`Waymark-Delivery-Id`. A delivery that is not failed is 409 `delivery_not_failed`.",
    )
    def post(self, request: Request, webhook_id: int, delivery_id: int) -> Response:
        delivery = delivery_get(webhook_get(_org(request), webhook_id), delivery_id)
        redone = delivery_redeliver(delivery, actor=request_actor(request))
        return Response(DeliveryOut(redone).data)
