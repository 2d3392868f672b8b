"""Signals in the admin: what arrived, what a step took, and what nobody waits for yet
(with its age), read-only. Unmatched signals are dropped after WAYMARK_SIGNAL_RETENTION_DAYS;
their rows stay as the record."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.timesince import timesince

from ..models import Signal
from .scoping import OrgScopedMixin, OrgScopedRelatedFilter


class SignalStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("pending", "pending (unmatched)"), ("consumed", "consumed"),
                ("dropped", "dropped")]  # fmt: skip

    def queryset(self, request: HttpRequest, queryset: QuerySet[Signal]) -> QuerySet[Signal]:
        if self.value() == "pending":
            return queryset.filter(consumed_at__isnull=True, dropped_at__isnull=True)
        if self.value() == "consumed":
            return queryset.filter(consumed_at__isnull=False)
        if self.value() == "dropped":
            return queryset.filter(dropped_at__isnull=False)
        return queryset


@admin.register(Signal)
class SignalAdmin(OrgScopedMixin, admin.ModelAdmin):
    list_display = ["name", "correlation", "org", "status", "age", "consumed_by", "source"]
    list_filter = [SignalStatusFilter, "source", ("org", OrgScopedRelatedFilter)]
    search_fields = ["name", "correlation", "identity"]
    ordering = ["-id"]
    readonly_fields = ["org", "name", "correlation", "correlations", "run", "identity",
                       "payload", "source", "received_at", "consumed_at", "consumed_by",
                       "dropped_at"]  # fmt: skip

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # signals come from outside (the API, inbound email)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="status")
    def status(self, signal: Signal) -> str:
        if signal.dropped_at is not None:
            return "dropped"
        return "consumed" if signal.consumed_at is not None else "pending"

    @admin.display(description="age", ordering="received_at")
    def age(self, signal: Signal) -> str:
        return timesince(signal.received_at, timezone.now())
