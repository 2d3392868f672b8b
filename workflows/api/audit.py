"""``GET /api/v1/audit``: the organisation's audit log, newest first, cursor-paginated and
filtered strictly like every list (docs/reference/api-runs.md, "The audit log")."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from ..models import ActorKind, AuditEntry
from .auth import request_key
from .filters import InstantFilter
from .views import CursorPage, ListEndpoint


@extend_schema_field(
    {"type": "string", "enum": ActorKind.values}, component_name="AuditActorKindEnum"
)
class ActorKindField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=ActorKind.choices, **kwargs)


class AuditActorOut(serializers.Serializer):
    kind = ActorKindField(
        help_text="`user` (a person in the admin), `api_key`, `slack_user` (acting as the "
        "person linked to them), `command` (a management command), `system` (Waymark itself)."
    )
    id = serializers.CharField(
        help_text="A user's id, a key's prefix, `team:user` of Slack, the command's OS user."
    )
    display = serializers.CharField(help_text="A name for people: the username, the key's name.")


class AuditEntryOut(serializers.ModelSerializer[AuditEntry]):
    actor = serializers.SerializerMethodField()

    class Meta:
        model = AuditEntry
        fields = ["id", "at", "actor", "action", "target_type", "target_id", "detail"]

    @extend_schema_field(AuditActorOut)
    def get_actor(self, entry: AuditEntry) -> dict[str, str]:
        return {"kind": entry.actor_kind, "id": entry.actor_id, "display": entry.actor_display}


class AuditFilter(django_filters.FilterSet):
    action = django_filters.CharFilter(
        max_length=64, help_text="Only this action (`run.cancel`, `api_key.revoke`, ...)."
    )
    actor_kind = django_filters.ChoiceFilter(
        choices=ActorKind.choices,
        error_messages={"invalid_choice": f"must be one of {', '.join(ActorKind.values)}"},
        help_text="Only actions by this kind of actor.",
    )
    actor_id = django_filters.CharFilter(
        max_length=150, strip=False, help_text="Only actions by this actor (its id)."
    )
    target_type = django_filters.CharFilter(
        max_length=40, help_text="Only actions on this kind of thing (`run`, `connection`, ...)."
    )
    target_id = django_filters.CharFilter(
        max_length=200, strip=False, help_text="Only actions on this one (with `target_type`)."
    )
    at_after = InstantFilter(
        field_name="at", lookup_expr="gte", help_text="Only entries written at or after this."
    )
    at_before = InstantFilter(
        field_name="at", lookup_expr="lt", help_text="Only entries written before this."
    )

    class Meta:
        model = AuditEntry
        fields = ["action", "actor_kind", "actor_id", "target_type", "target_id", "at_after",
                  "at_before"]  # fmt: skip


class AuditListView(ListEndpoint):
    model = AuditEntry
    serializer_class = AuditEntryOut
    pagination_class = CursorPage
    filterset_class = AuditFilter

    def scoped_queryset(self) -> QuerySet[AuditEntry]:
        return AuditEntry.objects.filter(org=request_key(self.request).org)

    @extend_schema(
        operation_id="audit_list",
        responses=AuditEntryOut(many=True),
        description="Who did what in this organisation, newest first: run control, approval "
        "decisions, effect resolutions, API keys, connections (never their secrets), the egress "
        "allowlist, publishing, webhook subscriptions; from the admin, the API and the command "
        "line. Entries are never changed or deleted (but by the operator's retention). An "
        "unknown parameter is refused (400 `invalid_query`).",
    )
    def get(self, request: Request) -> Response:
        return self.list_page()
