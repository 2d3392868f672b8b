"""Schedules, and timers read-only, in the admin, scoped to the user's organisations like
every other page (workflows/admin/scoping): a cron, a zone and an input are checked as the
API checks them; the organisation and the name are fixed once a schedule exists; what the
sweep records (the next occurrence, the last start, the last refusal) is read-only. A
timer is what a waiting step's row on the run page links to.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpRequest

from workflows.errors import QuotaExceeded
from workflows.plugins.admin import OrgScopedMixin, OrgScopedRelatedFilter, SafeJSONField

from .api import SCHEDULE_NAME
from .models import Schedule, Timer
from .schedules import check_schedule_quota, first_occurrence
from .waits import instant_words, intent_words, timer_state

SWEPT = ["next_at", "last_started_at", "last_run_id", "last_error", "last_error_at",
         "created_at", "updated_at"]  # fmt: skip


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = ["org", "automation", "name", "cron", "timezone", "input", "enabled", "catch_up"]
        field_classes = {"input": SafeJSONField}

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        if not SCHEDULE_NAME.fullmatch(name):
            raise ValidationError(
                "Start with a letter or digit; use only letters, digits, _ . and - "
                "(the API names the schedule by it)."
            )
        return name

    def clean_cron(self) -> str:
        return " ".join(str(self.cleaned_data["cron"]).split())

    def clean_input(self) -> Any:
        value = self.cleaned_data.get("input")
        return {} if value is None else value

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        org = cleaned.get("org") or (self.instance.org if self.instance.org_id else None)
        automation = cleaned.get("automation")
        if org is not None and automation is not None and automation.org_id != org.pk:
            self.add_error("automation", "Choose an automation of the schedule's organisation.")
        if org is not None and self.instance.pk is None:
            self._check_quota(org)
        return cleaned

    def _check_quota(self, org: Any) -> None:
        """A new schedule within the organisation's quota. The admin saves in the transaction
        it validated in (ModelAdmin.changeform_view), so the organisation's row stays locked
        until this one is saved: two racing creations cannot both take the last one."""
        try:
            with transaction.atomic():
                check_schedule_quota(org)
        except QuotaExceeded as exc:
            raise ValidationError(f"{exc.detail} ({exc.code})", code=exc.code) from exc


@admin.register(Schedule)
class ScheduleAdmin(OrgScopedMixin, admin.ModelAdmin):
    form = ScheduleForm
    list_display = ["name", "org", "automation", "cron", "timezone", "enabled", "catch_up",
                    "next_at", "last_started_at", "has_error"]  # fmt: skip
    list_filter = ["enabled", "catch_up", ("org", OrgScopedRelatedFilter)]
    search_fields = ["name", "automation__slug"]
    list_select_related = ["org", "automation"]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        sets: list[Any] = [
            (None, {"fields": ["org", "automation", "name", "enabled"]}),
            ("When", {"fields": ["cron", "timezone", "catch_up"]}),
            ("What", {"fields": ["input"]}),
        ]
        if obj is not None:
            sets.append(("Sweep", {"fields": SWEPT}))
        return sets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # The API names a schedule by its name, and its runs belong to its organisation.
        return SWEPT if obj is None else ["org", "name", *SWEPT]

    @admin.display(description="error", boolean=True)
    def has_error(self, obj: Schedule) -> bool:
        return bool(obj.last_error)

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        changed = set(form.changed_data)
        enabled_again = "enabled" in changed and obj.enabled
        if change and (changed & {"cron", "timezone"} or enabled_again):
            # Counts from now: the occurrences missed while disabled are not caught up.
            obj.next_at = first_occurrence(obj.cron, obj.timezone)
        super().save_model(request, obj, form, change)


@admin.register(Timer)
class TimerAdmin(OrgScopedMixin, admin.ModelAdmin):
    """Timers, read-only: what a wait or wait_until step is parked on (the run page links
    each waiting step here). They change only through the engine."""

    list_display = ["id", "org", "run", "step_id", "iteration", "kind", "intent_words",
                    "due_at_utc", "state"]  # fmt: skip
    list_filter = [("org", OrgScopedRelatedFilter), "kind"]
    list_select_related = ["org", "run"]
    search_fields = ["=run__id", "step_id"]
    ordering = ["-id"]
    fields = ("org", "run", "step_id", "iteration", "kind", "intent_words", "zone",
              "spread_seconds", "offset_seconds", "due_at_utc", "state", "fired_at",
              "cancelled_at", "error", "created_at")  # fmt: skip
    readonly_fields = fields
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="intent")
    def intent_words(self, obj: Timer) -> str:
        return intent_words(obj.intent, obj.zone)

    @admin.display(description="fires at", ordering="due_at")
    def due_at_utc(self, obj: Timer) -> str:
        return instant_words(obj.due_at, obj.zone)

    @admin.display(description="state")
    def state(self, obj: Timer) -> str:
        return timer_state(obj)
