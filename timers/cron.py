"""A schedule's cron expression read in a time zone: what is wrong with one (and with a
schedule's zone and input), and its occurrences as UTC instants (the daylight-saving policy of
``timers.calendar.resolve_local``; timers/schedules.py describes it). Plain computation, no
table: the Schedule model validates with it, and the sweep (timers/schedules.py) starts the
occurrences it finds.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

from workflows.errors import WaymarkError
from workflows.plugins.definitions import UNSTORABLE_REASON, has_unstorable
from workflows.plugins.engine import database_now
from workflows.plugins.runs import check_input

from .calendar import resolve_local, zone_named

#: A schedule must fire within this many years of being written, or it never fires.
NEVER_FIRES_YEARS: Final = 5
MAX_CRON_CHARS: Final = 100

CRON_FIELDS: Final = ("minute", "hour", "day-of-month", "month", "day-of-week")
# croniter's random ("R") and hashed ("H") values: not the same times each time read.
_RANDOM_OR_HASHED = re.compile(r"[hr](\(\d+-\d+\))?(/\d+)?", re.IGNORECASE)
# How far around an instant the zone's offsets are compared (the DST search margin below),
# and how finely.
_MARGIN_WINDOW = timedelta(days=2)
_MARGIN_STEP = timedelta(hours=3)
_MAX_JSON_DEPTH = 32


# --- validation ---------------------------------------------------------------------------------


def cron_problem(cron: Any, *, now: datetime | None = None) -> str | None:
    """Why ``cron`` cannot be a schedule's expression, or None: not 5 fields, not valid
    cron, random or hashed values, or no time matches it within ``NEVER_FIRES_YEARS``."""
    if not isinstance(cron, str) or not cron.strip():
        return "a cron expression is required, such as '30 9 * * mon-fri'"
    if len(cron) > MAX_CRON_CHARS:
        return f"a cron expression is at most {MAX_CRON_CHARS} characters"
    if has_unstorable(cron):
        return UNSTORABLE_REASON
    fields = cron.split()
    if fields[0].startswith("@"):
        return (
            f"nicknames such as {fields[0]!r:.20} are not taken: write the 5 fields "
            "(minute hour day-of-month month day-of-week), such as '0 0 * * *' for @daily"
        )
    if len(fields) != len(CRON_FIELDS):
        return (
            f"a cron expression has 5 fields ({' '.join(CRON_FIELDS)}), not {len(fields)}, "
            "such as '30 9 * * mon-fri'"
        )
    for name, text in zip(CRON_FIELDS, fields, strict=True):
        if _RANDOM_OR_HASHED.fullmatch(text):
            return (
                f"the {name} field {text!r:.20} is a random or hashed value; a schedule "
                "fires at the same times every time it is read: give the values"
            )
    start = (now or datetime.now(UTC)).astimezone(UTC).replace(tzinfo=None)
    try:
        _matcher(cron, start, years=NEVER_FIRES_YEARS).get_next()
    except CroniterBadDateError:
        return (
            f"never fires: no date matches it in the next {NEVER_FIRES_YEARS} years "
            "(a day that does not exist in that month, such as 30 February?)"
        )
    except Exception as exc:  # croniter's errors are ValueErrors, but hostile text is hostile
        return f"not a valid cron expression: {exc}"
    return None


def input_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a schedule's run input, or None: the same limits as a run's
    input (an object, at most 32 levels deep, within ``WAYMARK_MAX_INPUT_BYTES``), and no
    NaN or Infinity (which JSON cannot carry)."""
    if not isinstance(value, dict):
        return "must be a JSON object"
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return "holds NaN or Infinity, which JSON cannot carry"
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    try:
        check_input(value)  # what run_start checks, so a scheduled start is never refused
    except WaymarkError as exc:
        return exc.detail
    except RecursionError:
        return f"nests deeper than {_MAX_JSON_DEPTH} levels"
    return None


def schedule_problems(*, cron: Any, timezone: Any, run_input: Any) -> dict[str, str]:
    """The problems of a schedule's cron, zone and input, by field name (empty: none)."""
    problems: dict[str, str] = {}
    if (problem := cron_problem(cron)) is not None:
        problems["cron"] = problem
    try:
        zone_named(timezone)
    except ValueError as exc:
        problems["timezone"] = str(exc)
    if (problem := input_problem(run_input)) is not None:
        problems["input"] = problem
    return problems


# --- occurrences --------------------------------------------------------------------------------


def _matcher(cron: str, start: datetime, *, years: int | None = None) -> croniter[datetime]:
    """croniter over naive wall-clock times (no zone: the zone is applied by resolve_local).
    Day-of-month and day-of-week restricted both: either matching is enough (as cron)."""
    return croniter(
        " ".join(cron.split()), start, ret_type=datetime, day_or=True,
        max_years_between_matches=years,
    )  # fmt: skip


def as_zone(zone: ZoneInfo | str) -> ZoneInfo:
    return zone if isinstance(zone, ZoneInfo) else zone_named(zone)


def _wall(instant: datetime, zone: ZoneInfo) -> datetime:
    """The local wall-clock time of ``instant`` in ``zone``, naive."""
    return instant.astimezone(zone).replace(tzinfo=None, fold=0)


def _margin(zone: ZoneInfo, instant: datetime) -> timedelta:
    """How much the zone's UTC offset changes within two days of ``instant``: 0 for most of
    the year, the length of the gap or fold near a daylight-saving change."""
    offsets = []
    at = instant - _MARGIN_WINDOW
    while at <= instant + _MARGIN_WINDOW:
        offset = at.astimezone(zone).utcoffset()
        assert offset is not None  # a ZoneInfo always gives one
        offsets.append(offset)
        at += _MARGIN_STEP
    return max(offsets) - min(offsets)


def _require_aware(value: Any, what: str) -> None:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, not {value!r}")


def next_occurrence(cron: str, zone: ZoneInfo | str, after: datetime) -> datetime:
    """The first occurrence of ``cron`` in ``zone`` strictly after ``after``, in UTC.

    Wall-clock times matching ``cron`` are resolved with the DST policy of
    ``resolve_local``. Resolving is not monotonic across a gap (02:30 moves past 03:00), so
    near a daylight-saving change the search starts that much earlier and goes that much
    further; elsewhere it is one croniter step. CroniterBadDateError when nothing matches
    within croniter's horizon (50 years): a schedule never fires.
    """
    _require_aware(after, "after")
    tz = as_zone(zone)
    matcher = _matcher(cron, _wall(after, tz) - _margin(tz, after))
    best: datetime | None = None
    while True:
        wall = matcher.get_next()
        instant = resolve_local(wall, tz)
        if instant > after and (best is None or instant < best):
            best = instant
        # Any later wall-clock time resolves to later than ``best`` (offsets near it differ
        # by at most the margin): ``best`` is the first.
        if best is not None and wall >= _wall(best, tz) + _margin(tz, best):
            return best


def latest_occurrence(cron: str, zone: ZoneInfo | str, at: datetime) -> datetime | None:
    """The last occurrence of ``cron`` in ``zone`` at or before ``at``, in UTC (None when
    none is within croniter's horizon). The mirror of :func:`next_occurrence`."""
    _require_aware(at, "at")
    tz = as_zone(zone)
    start = _wall(at, tz) + _margin(tz, at) + timedelta(microseconds=1)  # at itself counts
    matcher = _matcher(cron, start)
    best: datetime | None = None
    while True:
        try:
            wall = matcher.get_prev()
        except CroniterBadDateError:
            return best
        instant = resolve_local(wall, tz)
        if instant <= at and (best is None or instant > best):
            best = instant
        if best is not None and wall <= _wall(best, tz) - _margin(tz, best):
            return best


def first_occurrence(cron: str, zone: ZoneInfo | str, now: datetime | None = None) -> datetime:
    """A new (or re-enabled, or changed) schedule's first occurrence: the next after now, on
    the database's clock (the sweep compares ``next_at`` with it: a web process whose clock
    is behind would otherwise write an occurrence already past, ahead skip some)."""
    return next_occurrence(cron, zone, now or database_now())
