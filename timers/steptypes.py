"""Timer step types: wait (a fixed duration) and wait_until (a moment or a weekly rule).

Both park the run (``waits=True``); the timer sweep wakes it. Registered from
``TimersConfig.ready()``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from workflows.plugins import (
    StepReport,
    StepType,
    check_duration,
    check_fields,
    check_object,
    check_template_field,
    register_step_type,
)
from workflows.plugins.definitions import is_template

from .store import enter_wait
from .timing import NO_SPREAD

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
TIME_OF_DAY_RE = re.compile(r"([01][0-9]|2[0-3]):[0-5][0-9]")
MAX_ZONE_NAME = 64


def is_time_zone(name: object) -> bool:
    """True when ``name`` is an IANA time zone known to this system (e.g. "Europe/Berlin")."""
    if not isinstance(name, str) or not name or len(name) > MAX_ZONE_NAME:
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


def _is_iso_datetime(text: str) -> bool:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def validate_wait(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("duration", "timezone"))
    check_duration(step, "duration", report)
    _check_zone(step, report)


WAIT = StepType(
    name="wait", lane="inline", validate=validate_wait, execute=enter_wait, built=True,
    waits=True, app="timers",
    context_on_read=True,  # its zone and duration render from dict(context)
)  # fmt: skip


def _validate_rule(rule: Mapping[str, Any], report: StepReport) -> None:
    check_fields(rule, report, ("weekdays", "time"), prefix="rule.")
    if "weekdays" in rule:
        weekdays = rule["weekdays"]
        valid = (
            isinstance(weekdays, list)
            and weekdays
            and all(isinstance(day, str) and day in WEEKDAYS for day in weekdays)
            and len(set(weekdays)) == len(weekdays)
        )
        if not valid:
            report.error(
                "rule.weekdays",
                f"must be a non-empty list of distinct days from {', '.join(WEEKDAYS)}",
            )
    if "time" not in rule:
        report.issue("missing_field", "rule.time", 'is required ("HH:MM", 24-hour)')
    elif not isinstance(rule["time"], str) or TIME_OF_DAY_RE.fullmatch(rule["time"]) is None:
        report.error("rule.time", 'must be a time of day "HH:MM" (24-hour), such as "09:30"')


def validate_wait_until(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("at", "rule", "timezone", "spread"))
    has_at, has_rule = "at" in step, "rule" in step
    if has_at and has_rule:
        report.error("rule", 'cannot be combined with "at": give one or the other')
    elif not has_at and not has_rule:
        report.issue(
            "missing_field",
            "at",
            'is required unless "rule" is given (an ISO 8601 datetime template)',
        )
    if has_at:
        at = check_template_field(step, "at", report)
        if at is not None and not is_template(at) and not _is_iso_datetime(at):
            report.error("at", f"must be an ISO 8601 datetime or a template, not {at[:60]!r}")
    if has_rule:
        rule = check_object(step, "rule", report)
        if rule is not None:
            _validate_rule(rule, report)
    _check_zone(step, report)
    if step.get("spread") not in NO_SPREAD:  # "0s": no spread, as the top-level timer_spread
        check_duration(step, "spread", report, required=False)


def _check_zone(step: Mapping[str, Any], report: StepReport) -> None:
    zone = step.get("timezone")
    if isinstance(zone, str) and is_template(zone):
        check_template_field(step, "timezone", report)  # read from the run's data
    elif "timezone" in step and not is_time_zone(zone):
        report.error(
            "timezone",
            'must be an IANA time zone name such as "Europe/Berlin", or a template',
        )


WAIT_UNTIL = StepType(
    name="wait_until", lane="inline", validate=validate_wait_until, execute=enter_wait,
    built=True, waits=True, app="timers",
    context_on_read=True,  # its instant and zone render from dict(context)
)  # fmt: skip

STEP_TYPES = (WAIT, WAIT_UNTIL)


def register_step_types() -> None:
    for step_type in STEP_TYPES:
        register_step_type(step_type)
