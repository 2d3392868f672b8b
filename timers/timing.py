"""When a wait step's timer fires: the intent, read in its zone, plus its spread.

``plan`` turns a `wait` or `wait_until` step (rendered over the run's data) into a
``Planned`` timer: what was asked (kept, so it can be computed again after the run's zone,
the rule or the tz database changes), the zone, the spread and the run's offset within it,
and the UTC instant. "Now" is the database's clock, read by the caller.

Spread: timers from human schedules (a `rule`) would otherwise all fire at 09:00:00 sharp;
each run gets a deterministic offset in [0, spread): hash(run id) mod spread, so computing
again lands on the same offset. A step's `spread` wins over the definition's
`timer_spread`; both may be zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from workflows.plugins import StepFailure, render
from workflows.plugins.definitions import is_template, parse_duration

from .calendar import WeeklyRule, instant_at, next_occurrence, spread_offset, zone_named

UTC = ZoneInfo("UTC")
NO_SPREAD = ("0", "0s")  # a spread of zero, as written in a definition (a duration is positive)


@dataclass(frozen=True)
class Planned:
    kind: str
    intent: dict[str, Any]  # as asked, rendered; "zone_template" kept when the zone was one
    zone: str
    spread_seconds: float
    offset_seconds: float
    due_at: datetime  # UTC, the offset included


def plan(
    step: Mapping[str, Any],
    context: Mapping[str, Any],
    *,
    run_id: int,
    now: datetime,
    default_spread: str | None = None,
) -> Planned:
    """The timer of a `wait` or `wait_until` step entered at ``now``."""
    if step["type"] == "wait":
        duration = _duration(step["duration"], "duration")
        if "timezone" in step and _whole_days(step["duration"]):
            return _days_in_zone(step, context, duration.days, now=now)
        return Planned("wait", {"duration": duration.total_seconds()}, "", 0.0, 0.0,
                       now + duration)  # fmt: skip
    zone_text, intent = _zone(step, context)
    zone = _zone_info(zone_text)
    spread = _spread(step.get("spread", default_spread if "rule" in step else None))
    offset = spread_offset(run_id, spread)
    if "rule" in step:
        intent["rule"] = dict(step["rule"])
    else:
        intent["at"] = str(render(step["at"], dict(context))).strip()
    return Planned("wait_until", intent, zone_text, spread, offset,
                   instant(intent, zone, after=now) + timedelta(seconds=offset))  # fmt: skip


def instant(intent: Mapping[str, Any], zone: ZoneInfo | None, *, after: datetime) -> datetime:
    """The instant an intent names, without the spread (for planning and recomputing)."""
    if "duration" in intent:
        return after + timedelta(seconds=float(intent["duration"]))
    if "rule" in intent:
        return next_occurrence(WeeklyRule.from_definition(intent["rule"]), zone or UTC, after)
    try:
        return instant_at(str(intent["at"]), zone)
    except ValueError as exc:
        raise StepFailure(f"wait_until: {exc}", retryable=False) from exc


def _whole_days(text: object) -> bool:
    return isinstance(text, str) and text.strip().endswith("d")


def _days_in_zone(
    step: Mapping[str, Any], context: Mapping[str, Any], days: int, *, now: datetime
) -> Planned:
    """A `wait` of whole days in a zone: the same wall-clock time, ``days`` calendar days
    later in that zone (23 or 25 hours for a day that has a daylight-saving change, not 24).
    Kept as the local moment it names ("at", no offset), so a tz database update or a zone
    template's new value computes it again as that wall-clock time (recompute.py)."""
    zone_text, intent = _zone(step, context)
    zone = _zone_info(zone_text)
    local = now.astimezone(zone).replace(tzinfo=None) + timedelta(days=days)
    intent["at"] = local.isoformat()
    return Planned("wait", intent, zone_text, 0.0, 0.0, instant(intent, zone, after=now))


def _zone(step: Mapping[str, Any], context: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The zone's name, rendered when it is a template (kept in the intent then)."""
    raw = step.get("timezone", "UTC")
    if isinstance(raw, str) and is_template(raw):
        return str(render(raw, dict(context))).strip(), {"zone_template": raw}
    return str(raw), {}


def _zone_info(name: str) -> ZoneInfo:
    try:
        return zone_named(name)
    except ValueError as exc:
        # The run's data named a zone that does not exist: retrying will not change that.
        raise StepFailure(f"wait_until: {exc}", retryable=False) from exc


def _duration(value: object, field: str) -> timedelta:
    duration = parse_duration(value)
    if duration is None:
        raise StepFailure(f"{field}: not a duration: {value!r}", retryable=False)
    return duration


def _spread(value: object) -> float:
    if value in (None, 0, *NO_SPREAD):
        return 0.0
    return _duration(value, "spread").total_seconds()
