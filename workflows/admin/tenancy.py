"""Organisations, their members and their API keys in the admin."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.template.response import TemplateResponse

from ..models import ApiKey, Membership, Organisation
from ..models.tenancy import API_KEY_SCOPES
from ..services.audit import Actor
from ..services.tenancy import api_key_create, api_key_revoke
from .scoping import OrgScopedMixin, OrgScopedRelatedFilter

QUOTA_FIELDS = [
    "quota_automations", "quota_versions", "quota_running_runs", "quota_starts_per_minute",
    "quota_schedules", "quota_pending_signals",
]  # fmt: skip


@admin.register(Organisation)
class OrganisationAdmin(OrgScopedMixin, admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # An organisation's members may rename it (its name), never raise its own quotas,
        # nor change its slug: the host's code names organisations by slug (a code
        # workflow's @workflow(organisations=[...])), and a member taking a slug listed
        # there would start what only that organisation may.
        fixed = list(super().get_readonly_fields(request, obj))
        return fixed if request.user.is_superuser else [*fixed, "slug", *QUOTA_FIELDS]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A new organisation has no members: only a superuser could ever see it.
        return request.user.is_superuser


@admin.register(Membership)
class MembershipAdmin(OrgScopedMixin, admin.ModelAdmin):
    """Members see who else is in their organisations; only superusers grant or take access."""

    list_display = ["user", "org", "created_at"]
    list_filter = [("org", OrgScopedRelatedFilter)]
    search_fields = ["user__username", "org__slug"]
    list_select_related = ["user", "org"]
    readonly_fields = ["created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser


@admin.register(ApiKey)
class ApiKeyAdmin(OrgScopedMixin, admin.ModelAdmin):
    list_display = ["name", "org", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("org", OrgScopedRelatedFilter)]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    fields = ["org", "name", "read_only", "scopes", "expires_at", *readonly_fields]
    actions = ["revoke"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "scopes":  # boxes to tick, not a comma-separated text
            return forms.MultipleChoiceField(
                choices=sorted(API_KEY_SCOPES.items()), required=False,
                widget=forms.CheckboxSelectMultiple, help_text="Beyond reading and writing.",
            )  # fmt: skip
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        key, raw = api_key_create(
            org=obj.org, name=obj.name, read_only=obj.read_only, expires_at=obj.expires_at,
            actor=Actor.user(request.user), scopes=obj.scopes,
        )  # fmt: skip
        obj.pk, obj.prefix = key.pk, key.prefix
        request._waymark_new_key = raw  # type: ignore[attr-defined]  # for response_add only

    def response_add(self, request: HttpRequest, obj: ApiKey, post_url_continue: Any = None) -> Any:
        """Show the new key once, on this page: not in a message, which would carry it in a
        (signed, not encrypted) cookie, and not after a redirect."""
        raw = getattr(request, "_waymark_new_key", None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        context = {**self.admin_site.each_context(request), "key": obj, "raw_key": raw,
                   "opts": self.opts, "title": "API key created"}  # fmt: skip
        response = TemplateResponse(request, "admin/workflows/apikey/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected keys", permissions=["delete"])
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        for key in queryset:
            api_key_revoke(prefix=key.prefix, actor=Actor.user(request.user))
        messages.success(request, f"Revoked {queryset.count()} key(s).")
