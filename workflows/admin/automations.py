"""Automations and their versions in the admin: published versions are read-only."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils.html import format_html

from ..definitions.validator import validate_definition
from ..errors import WaymarkError
from ..models import Automation, AutomationVersion
from ..services.audit import Actor
from ..services.automations import version_publish, version_update_draft
from .display import pretty_json
from .migrations import migrate_runs_view
from .scoping import OrgScopedMixin, OrgScopedRelatedFilter


class VersionInline(OrgScopedMixin, admin.TabularInline):
    model = AutomationVersion
    readonly_fields = ("number", "digest", "published_at")
    fields = readonly_fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Automation)
class AutomationAdmin(OrgScopedMixin, admin.ModelAdmin):
    list_display = ["slug", "name", "org", "current_version", "created_at"]
    list_filter = [("org", OrgScopedRelatedFilter)]
    search_fields = ["slug", "name"]
    list_select_related = ["org", "current_version__automation"]
    readonly_fields = ["current_version", "created_at"]
    inlines = [VersionInline]
    # Its page links to "Migrate runs" (admin/migrations.py): dry run first, then confirm.
    change_form_template = "admin/workflows/automation/change_form.html"

    def get_urls(self) -> list[URLPattern]:
        migrate = path(
            "<path:object_id>/migrate-runs/",
            self.admin_site.admin_view(self.migrate_runs),
            name="workflows_automation_migrate_runs",
        )
        return [migrate, *super().get_urls()]

    def migrate_runs(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return migrate_runs_view(self, request, object_id)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return self.readonly_fields
        # An automation's versions and runs belong to its organisation, and API clients and
        # triggers name it by slug: moving or renaming it would leave them behind.
        return ["org", "slug", *self.readonly_fields]


class DraftVersionForm(forms.ModelForm):
    class Meta:
        model = AutomationVersion
        fields = ["definition"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:  # edited as written, not in jsonb's key order
            self.initial["definition"] = self.instance.document()

    def clean_definition(self) -> Any:
        definition = self.cleaned_data["definition"]
        issues = validate_definition(definition)
        if issues:
            raise forms.ValidationError([f"{i.code}: {i.message}" for i in issues])
        return definition


@admin.register(AutomationVersion)
class AutomationVersionAdmin(OrgScopedMixin, admin.ModelAdmin):
    form = DraftVersionForm
    list_display = ["automation", "number", "org", "published_at", "short_digest"]
    list_filter = [("org", OrgScopedRelatedFilter), ("published_at", admin.EmptyFieldListFilter)]
    list_select_related = ["automation", "org"]
    search_fields = ["automation__slug", "digest"]
    actions = ["publish"]

    @admin.display(description="digest")
    def short_digest(self, obj: AutomationVersion) -> str:
        return obj.digest[:12]

    @admin.display(description="definition")
    def definition_pretty(self, obj: AutomationVersion) -> str:
        """The document as published, verbatim (its keys in the order written)."""
        if obj.definition_text:
            return format_html('<pre style="white-space: pre-wrap">{}</pre>', obj.definition_text)
        return pretty_json(obj.definition)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is not None and obj.is_published:
            return ("org", "automation", "number", "digest", "published_at", "definition_pretty")
        return ("org", "automation", "number", "definition", "digest", "published_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is not None and obj.is_published:
            return self.get_fields(request, obj)
        return ("org", "automation", "number", "digest", "published_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # versions are created through the API or `manage.py publish_automation`

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return (
            obj is not None and not obj.is_published and super().has_delete_permission(request, obj)
        )

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A published version is view-only: it can never change.
        return (obj is None or not obj.is_published) and super().has_change_permission(request, obj)

    def save_model(
        self, request: HttpRequest, obj: AutomationVersion, form: Any, change: bool
    ) -> None:
        # Through the service: its conditional UPDATE refuses a version published meanwhile.
        version_update_draft(version=obj, definition=obj.definition)

    @admin.action(description="Publish selected drafts", permissions=["change"])
    def publish(self, request: HttpRequest, queryset: Any) -> None:
        for version in queryset:
            try:
                version_publish(version=version, actor=Actor.user(request.user))
            except WaymarkError as exc:
                messages.error(request, f"v{version.number}: {exc.code}: {exc.detail}")
            else:
                messages.success(request, f"Published {version.automation.slug} v{version.number}")
