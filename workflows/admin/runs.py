"""Runs in the admin: a control room, every field read-only, the timeline on one screen."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from ..models import Run, Step
from .display import pretty_json


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
        return pretty_json(obj.input)

    @admin.display(description="output")
    def pretty_output(self, obj: Run) -> str:
        return pretty_json(obj.output)

    @admin.display(description="vars")
    def pretty_vars(self, obj: Run) -> str:
        return pretty_json(obj.vars)

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
