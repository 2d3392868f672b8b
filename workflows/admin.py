"""The admin is a control room, not an editor: published versions are read-only."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from .definitions.validator import validate_definition
from .errors import WaymarkError
from .models import ApiKey, Automation, AutomationVersion, Organisation, Run, Step
from .services.automations import version_publish, version_update_draft
from .services.tenancy import api_key_create, api_key_revoke

admin.site.site_header = "Waymark"
admin.site.site_title = "Waymark admin"
admin.site.index_title = "Control room"


@admin.register(Organisation)
class OrganisationAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "org", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["org"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    fields = ["org", "name", *readonly_fields]
    actions = ["revoke"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        key, raw = api_key_create(org=obj.org, name=obj.name)
        obj.pk, obj.prefix = key.pk, key.prefix
        messages.warning(request, f"Copy this key now; it is not shown again: {raw}")

    @admin.action(description="Revoke selected keys", permissions=["delete"])
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        for key in queryset:
            api_key_revoke(prefix=key.prefix)
        messages.success(request, f"Revoked {queryset.count()} key(s).")


class VersionInline(admin.TabularInline):
    model = AutomationVersion
    fields = ["number", "digest", "published_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Automation)
class AutomationAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "org", "current_version", "created_at"]
    list_filter = ["org"]
    search_fields = ["slug", "name"]
    readonly_fields = ["current_version", "created_at"]
    inlines = [VersionInline]


class DraftVersionForm(forms.ModelForm):
    class Meta:
        model = AutomationVersion
        fields = ["definition"]

    def clean_definition(self) -> Any:
        definition = self.cleaned_data["definition"]
        issues = validate_definition(definition)
        if issues:
            raise forms.ValidationError([f"{i.code}: {i.message}" for i in issues])
        return definition


@admin.register(AutomationVersion)
class AutomationVersionAdmin(admin.ModelAdmin):
    form = DraftVersionForm
    list_display = ["automation", "number", "org", "published_at", "short_digest"]
    list_filter = ["org", ("published_at", admin.EmptyFieldListFilter)]
    search_fields = ["automation__slug", "digest"]
    actions = ["publish"]

    @admin.display(description="digest")
    def short_digest(self, obj: AutomationVersion) -> str:
        return obj.digest[:12]

    @admin.display(description="definition")
    def definition_pretty(self, obj: AutomationVersion) -> str:
        return _pretty(obj.definition)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is not None and obj.is_published:
            return ["org", "automation", "number", "digest", "published_at", "definition_pretty"]
        return ["org", "automation", "number", "definition", "digest", "published_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is not None and obj.is_published:
            return self.get_fields(request, obj)
        return ["org", "automation", "number", "digest", "published_at"]

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
                version_publish(version=version)
            except WaymarkError as exc:
                messages.error(request, f"v{version.number}: {exc.code}: {exc.detail}")
            else:
                messages.success(request, f"Published {version.automation.slug} v{version.number}")


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StepInline(ReadOnlyInline):
    model = Step
    fields = ["step_id", "iteration", "type", "lane", "status", "attempt", "max_attempts",
              "owner", "lease_until", "error", "finished_at"]  # fmt: skip
    readonly_fields = fields
    ordering = ["id"]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """A control room for runs: every field read-only, the timeline on one screen."""

    list_display = ["id", "org", "automation", "version", "status", "steps_executed",
                    "created_at", "finished_at"]  # fmt: skip
    list_filter = ["status", "org", "automation"]
    search_fields = ["=id", "start_key"]
    list_select_related = ["org", "automation", "version"]
    inlines = [StepInline]
    readonly_fields = [
        "org", "automation", "version", "start_key", "start_key_derived", "status",
        "steps_executed", "max_steps", "deadline_at", "created_at", "finished_at", "error",
        "pretty_input", "pretty_output", "pretty_vars", "timeline",
    ]  # fmt: skip
    exclude = ["input", "output", "vars", "outputs", "entered", "input_digest"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # runs change only through the engine; the admin shows them

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="input")
    def pretty_input(self, obj: Run) -> str:
        return _pretty(obj.input)

    @admin.display(description="output")
    def pretty_output(self, obj: Run) -> str:
        return _pretty(obj.output)

    @admin.display(description="vars")
    def pretty_vars(self, obj: Run) -> str:
        return _pretty(obj.vars)

    @admin.display(description="timeline")
    def timeline(self, obj: Run) -> str:
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            "<td><code>{}</code></td></tr>",
            (
                (e.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3], e.kind, e.step_id,
                 e.iteration or "", e.attempt or "", e.worker,
                 json.dumps(e.detail) if e.detail else "")
                for e in obj.events.order_by("id")
            ),
        )  # fmt: skip
        return format_html(
            "<table><thead><tr><th>at (UTC)</th><th>event</th><th>step</th><th>iteration</th>"
            "<th>attempt</th><th>worker</th><th>detail</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )


def _pretty(value: Any) -> str:
    return format_html(
        '<pre style="white-space: pre-wrap">{}</pre>',
        json.dumps(value, indent=2, ensure_ascii=False),
    )
