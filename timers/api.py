"""The schedules API (``/api/v1/schedules``; routes in ``timers/urls.py``): scheduled starts of
the key's organisation.

As the rest of the API: every query is filtered by the API key's organisation, so another
organisation's schedule is a 404 like a missing one; read-only keys read and get 403
``read_only_key`` on writes (the default permission class); every error is JSON with a
stable code, and a bad field is 400 ``invalid_input`` with ``errors`` naming it; the list is
cursor-paginated with strict filters.
"""

from __future__ import annotations

import functools
import re
from typing import Any
from zoneinfo import available_timezones

import django_filters
from django.core.validators import RegexValidator
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from workflows.errors import AlreadyExists, NotFound
from workflows.models import Automation, Organisation
from workflows.plugins.api import (
    BooleanFilter,
    CursorPage,
    ErrorOut,
    JsonObjectField,
    ListEndpoint,
    StrictInput,
    request_key,
)
from workflows.plugins.definitions import UNSTORABLE_REASON, has_unstorable
from workflows.plugins.runs import check_startable

from .calendar import zone_named
from .cron import cron_problem, first_occurrence, input_problem
from .models import CatchUp, Schedule
from .schedules import check_schedule_quota

# A schedule's name: it is in the URL (``/schedules/{name}``).
SCHEDULE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
NAME_RULE = "Must start with a letter or digit and hold only letters, digits, _ . and -."
# What must be given again as the schedule's first occurrence from now.
TIMING_FIELDS = ("cron", "timezone")


class UnknownSchedule(NotFound):
    code = "unknown_schedule"
    default_detail = 'No schedule "{name}" in this organisation.'


def _org(request: Request) -> Organisation:
    return request_key(request).org


def schedule_get(org: Organisation, name: str) -> Schedule:
    if has_unstorable(name):  # a NUL from the path names none: asking would fail
        raise UnknownSchedule(name=name)
    found = Schedule.objects.select_related("automation").filter(org=org, name=name).first()
    if found is None:
        raise UnknownSchedule(name=name)
    return found


# --- serializers ------------------------------------------------------------------------------


@extend_schema_field({"type": "string", "enum": CatchUp.values}, component_name="CatchUpEnum")
class CatchUpField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        message: dict[str, Any] = {"invalid_choice": f"Must be one of {', '.join(CatchUp.values)}."}
        super().__init__(choices=CatchUp.choices, error_messages=message, **kwargs)


@functools.cache
def _zone_names() -> list[str]:
    return sorted(available_timezones())


class TimeZoneField(serializers.ChoiceField):
    """An IANA time zone's name: the schema lists them (component TimezoneEnum)."""

    def __init__(self, **kwargs: Any) -> None:
        unknown = ("unknown time zone {input!r}: expected an IANA time zone name such as "
                   "'Europe/Berlin' or 'America/New_York'")  # fmt: skip
        message: dict[str, Any] = {"invalid_choice": unknown}
        super().__init__(choices=_zone_names(), error_messages=message, **kwargs)


class ScheduleOut(serializers.ModelSerializer[Schedule]):
    automation = serializers.CharField(source="automation.slug", read_only=True)
    catch_up = CatchUpField()

    class Meta:
        model = Schedule
        fields = [
            "name", "automation", "cron", "timezone", "input", "enabled", "catch_up", "next_at",
            "last_started_at", "last_run_id", "last_error", "last_error_at", "created_at",
            "updated_at",
        ]  # fmt: skip


class ScheduleSettingsIn(StrictInput):
    """What may change on a schedule (PATCH): every field optional."""

    automation = serializers.SlugField(
        max_length=63, required=False, help_text="The automation each occurrence starts (slug)."
    )
    cron = serializers.CharField(
        max_length=100, required=False,
        help_text="5 fields, read in `timezone`: minute hour day-of-month month day-of-week, "
        "such as `30 9 * * mon-fri`.",
    )  # fmt: skip
    timezone = TimeZoneField(
        required=False, help_text="An IANA time zone, such as `Europe/Berlin`."
    )
    input = JsonObjectField(required=False, help_text="Each run's input: a JSON object.")
    enabled = serializers.BooleanField(required=False)
    catch_up = CatchUpField(
        required=False,
        help_text="After downtime: `latest` starts only the most recent missed occurrence, "
        "`all` every one (at most 100 per sweep tick), `none` none that is more than 5 "
        "minutes late.",
    )

    def validate_automation(self, value: str) -> Automation:
        found = Automation.objects.filter(org=self.context["org"], slug=value).first()
        if found is None:
            raise serializers.ValidationError(f'No automation "{value}" in this organisation.')
        return found

    def validate_cron(self, value: str) -> str:
        problem = cron_problem(value)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return " ".join(value.split())

    def validate_timezone(self, value: str) -> str:
        try:
            zone_named(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def validate_input(self, value: Any) -> Any:
        problem = input_problem(value)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value


class ScheduleIn(ScheduleSettingsIn):
    name = serializers.CharField(
        max_length=100, trim_whitespace=False,
        validators=[RegexValidator(f"^{SCHEDULE_NAME.pattern}$", NAME_RULE)],  # for the schema
        help_text="Its name in the organisation (and URL): letters, digits, `_`, `.`, `-`.",
    )  # fmt: skip

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for required in ("automation", "cron"):
            self.fields[required].required = True

    def validate_name(self, value: str) -> str:
        if has_unstorable(value):
            raise serializers.ValidationError(UNSTORABLE_REASON)
        if not SCHEDULE_NAME.fullmatch(value):
            raise serializers.ValidationError(NAME_RULE)
        return value


class SchedulePatchIn(ScheduleSettingsIn):
    def unknown_message(self, name: str) -> str:
        if name == "name":
            return "Cannot be changed: create a new schedule (and delete this one)."
        return super().unknown_message(name)


class SchedulePage(CursorPage):
    ordering = "name"  # unique in the organisation
    position_pattern = SCHEDULE_NAME


class ScheduleFilter(django_filters.FilterSet):
    enabled = BooleanFilter(help_text="Only enabled (or disabled) schedules.")
    automation = django_filters.CharFilter(
        field_name="automation__slug", max_length=63, help_text="Only this automation's."
    )

    class Meta:
        model = Schedule
        fields = ["enabled", "automation"]


# --- views ------------------------------------------------------------------------------------


class ScheduleListView(ListEndpoint):
    model = Schedule
    serializer_class = ScheduleOut
    pagination_class = SchedulePage
    filterset_class = ScheduleFilter

    def scoped_queryset(self) -> QuerySet[Schedule]:
        return Schedule.objects.filter(org=_org(self.request)).select_related("automation")

    @extend_schema(
        operation_id="schedules_list",
        responses=ScheduleOut(many=True),
        description="The organisation's schedules, by name.",
    )
    def get(self, request: Request) -> Response:
        return self.list_page()

    @extend_schema(
        operation_id="schedules_create",
        request=ScheduleIn,
        responses={201: ScheduleOut, 400: ErrorOut, 403: ErrorOut, 409: ErrorOut},
        description="Create a schedule: from its next occurrence on, each occurrence of "
        "`cron` in `timezone` starts a run of `automation` with `input`, once (start key "
        "`schedule:<id>:<instant>`). A bad cron, an unknown zone, a cron that never fires or "
        "an input that is not an object is 400 `invalid_input` naming the field, and so is an "
        "input a code workflow's schema refuses; a code workflow the organisation may not run "
        "is 403 `workflow_not_allowed`; a name already taken is 409 `already_exists`; past "
        "the organisation's quota of schedules, 409 `quota_exceeded`.",
    )
    def post(self, request: Request) -> Response:
        org = _org(request)
        data = ScheduleIn(data=request.data, context={"org": org})
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        # Refused now, as its every occurrence would be (each is checked again when it fires).
        check_startable(org, fields["automation"], fields.get("input", {}))
        schedule = Schedule(org=org, **fields)
        schedule.next_at = first_occurrence(schedule.cron, schedule.timezone)
        try:
            with transaction.atomic():
                check_schedule_quota(org)
                schedule.save()
        except IntegrityError as exc:
            raise AlreadyExists(what=f'A schedule "{schedule.name}"', name=schedule.name) from exc
        return Response(ScheduleOut(schedule).data, status=status.HTTP_201_CREATED)


class ScheduleDetailView(APIView):
    @extend_schema(operation_id="schedules_read", responses={200: ScheduleOut, 404: ErrorOut})
    def get(self, request: Request, name: str) -> Response:
        return Response(ScheduleOut(schedule_get(_org(request), name)).data)

    @extend_schema(
        operation_id="schedules_update",
        request=SchedulePatchIn,
        responses={200: ScheduleOut, 400: ErrorOut, 403: ErrorOut, 404: ErrorOut},
        description="Change a schedule; `name` is fixed. A new `cron` or `timezone`, or "
        "enabling it again, counts from now: its next occurrence after now is the next to "
        "start (the ones it missed while disabled are not caught up). A new `automation` or "
        "`input` is checked as at creation (400 `invalid_input`, 403 `workflow_not_allowed`).",
    )
    def patch(self, request: Request, name: str) -> Response:
        org = _org(request)
        schedule = schedule_get(org, name)
        data = SchedulePatchIn(data=request.data, context={"org": org})
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        if not fields:
            return Response(ScheduleOut(schedule).data)
        if "automation" in fields or "input" in fields:
            check_startable(org, fields.get("automation", schedule.automation),
                            fields.get("input", schedule.input))  # fmt: skip
        retimed = any(fields.get(f, getattr(schedule, f)) != getattr(schedule, f)
                      for f in TIMING_FIELDS)  # fmt: skip
        enabled_again = fields.get("enabled") is True and not schedule.enabled
        for field, value in fields.items():
            setattr(schedule, field, value)
        changed = list(fields)
        if retimed or enabled_again:
            schedule.next_at = first_occurrence(schedule.cron, schedule.timezone)
            changed.append("next_at")
        schedule.save(update_fields=[*changed, "updated_at"])
        return Response(ScheduleOut(schedule).data)

    @extend_schema(
        operation_id="schedules_delete",
        responses={204: None, 404: ErrorOut},
        description="Delete a schedule. The runs it started are not touched.",
    )
    def delete(self, request: Request, name: str) -> Response:
        schedule_get(_org(request), name).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)
