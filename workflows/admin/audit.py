"""The audit log in the admin: read-only, scoped to the user's organisations like every page.
Nobody adds, changes or deletes an entry here (the database refuses it anyway)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from ..models import AuditEntry
from .display import pretty_json
from .scoping import OrgScopedMixin, OrgScopedRelatedFilter

FIELDS = ("at", "org", "actor_kind", "actor_id", "actor_display", "action", "target_type",
          "target_id", "pretty_detail")  # fmt: skip


@admin.register(AuditEntry)
class AuditEntryAdmin(OrgScopedMixin, admin.ModelAdmin):
    list_display = ["at", "org", "actor_kind", "actor_display", "action", "target_type",
                    "target_id"]  # fmt: skip
    list_filter = ["action", "actor_kind", "target_type", ("org", OrgScopedRelatedFilter)]
    search_fields = ["=target_id", "=actor_id", "actor_display"]
    list_select_related = ["org"]
    ordering = ["-id"]
    show_full_result_count = False  # no count of the whole log on every page
    fields = FIELDS
    readonly_fields = FIELDS

    @admin.display(description="detail")
    def pretty_detail(self, entry: AuditEntry) -> str:
        return pretty_json(entry.detail)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
