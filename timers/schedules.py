"""Scheduled starts: runs of an automation started on a cron schedule read in a time zone.

**Occurrences.** A schedule's cron expression (5 fields, parsed by croniter) is matched
against the wall clock of its IANA zone, and each matching wall-clock time becomes a UTC
instant with the calendar's daylight-saving policy (``timers.calendar.resolve_local``): a
time in a spring-forward gap moves forward by the length of the gap ("30 2 * * *" in
Europe/Berlin fires at 03:30 local time on the spring day), and a time that happens twice
takes the first occurrence ("30 2 * * *" fires once on the autumn day, in summer time).
A wall-clock time moved by a gap onto an instant that another matches too is one occurrence.
When day-of-month and day-of-week are both restricted, either matching is enough (as cron).

**Start keys.** An occurrence starts its run with the start key
``schedule:<schedule id>:<instant in UTC, ISO 8601>`` (``schedule:7:2026-03-29T01:30:00Z``).
Start keys are unique per organisation, so an occurrence never starts twice: the sweep
starts first and moves ``next_at`` on afterwards. A sweeper that dies in between leaves its
claim on the schedule to lapse (``CLAIM_SECONDS``), and the next sweep starts the same
occurrences again with the same keys, which return the runs already started.

**Catch-up.** The occurrences that came due while nothing swept (``next_at`` up to now):

* ``latest`` (the default): start only the most recent of them;
* ``all``: start every one, oldest first, at most ``CATCH_UP_MAX`` per sweep tick (the rest
  at the next ticks);
* ``none``: start none that is more than ``MISSED_AFTER`` late; an occurrence on time (the
  sweep normally starts it within a second or two) still starts.

Then ``next_at`` is the first occurrence after now (``all``: after the last one started).

**Refusals.** A start refused for now by the organisation's start quotas (too many runs
running, or its starts of this minute used up: 429) starts nothing and is tried again, with
the same key, after the refusal's Retry-After (``RETRY_SECONDS`` for running runs, the rest
of the minute for starts), not at every tick; one refused for good (the automation has no
published version, the input is refused, …) is skipped. Both are logged and recorded on the
schedule (``last_error``), and neither stops the other schedules.

**Quota.** An organisation has at most ``quota_schedules`` schedules (WAYMARK_QUOTA_SCHEDULES,
0: no limit), checked by every path that creates one (the API, the admin) under the
organisation's row lock (``check_schedule_quota``).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter
from django.db import connection, transaction
from django.db.models import Case, DateTimeField, ExpressionWrapper, F, Q, Value, When
from django.db.models.functions import Now

from workflows.errors import (
    QuotaExceeded,
    RunningRunsQuota,
    StartKeyConflict,
    StartQuota,
    WaymarkError,
)
from workflows.models import Organisation
from workflows.plugins.definitions import UNSTORABLE_REASON, has_unstorable
from workflows.plugins.engine import crash_point, is_transient, lost_connection
from workflows.plugins.runs import check_input, quotas, run_start

from .calendar import resolve_local, zone_named
from .models import CatchUp, Schedule

logger = logging.getLogger(__name__)

__all__ = [
    "CATCH_UP_MAX",
    "MISSED_AFTER",
    "Plan",
    "check_schedule_quota",
    "cron_problem",
    "fire_due_schedules",
    "first_occurrence",
    "latest_occurrence",
    "next_occurrence",
    "occurrences_to_start",
    "schedule_problems",
    "start_key",
]

#: Missed occurrences started per schedule and sweep tick with ``catch_up = "all"``.
CATCH_UP_MAX: Final = 100
#: With ``catch_up = "none"``, an occurrence later than this is missed, and skipped.
MISSED_AFTER: Final = timedelta(minutes=5)
#: Schedules claimed per call, and runs started per call at most (the sweep's tick goes on).
BATCH: Final = 100
STARTS_PER_CALL: Final = 500
#: How long a claim holds a schedule: a sweeper that died mid-way is replaced after this.
CLAIM_SECONDS: Final = 60.0
#: A start refused for a while (the running-runs quota) is tried again after this; one
#: refused by the starts-per-minute quota, once the minute is over.
RETRY_SECONDS: Final = float(RunningRunsQuota.retry_after_seconds)
#: A schedule must fire within this many years of being written, or it never fires.
NEVER_FIRES_YEARS: Final = 5
MAX_CRON_CHARS: Final = 100
MAX_ERROR_CHARS: Final = 2000

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


def check_schedule_quota(org: Organisation) -> None:
    """In the transaction that creates a schedule: the organisation's row locked (two racing
    creations cannot both take the last one), its schedules counted; QuotaExceeded (409) at
    its quota."""
    quotas.lock_organisation(org)
    limit = quotas.quota(org, "schedules")
    if limit and Schedule.objects.filter(org=org).count() >= limit:
        raise QuotaExceeded(limit=limit, what="schedules")


# --- occurrences --------------------------------------------------------------------------------


def _matcher(cron: str, start: datetime, *, years: int | None = None) -> croniter[datetime]:
    """croniter over naive wall-clock times (no zone: the zone is applied by resolve_local).
    Day-of-month and day-of-week restricted both: either matching is enough (as cron)."""
    return croniter(
        " ".join(cron.split()), start, ret_type=datetime, day_or=True,
        max_years_between_matches=years,
    )  # fmt: skip


def _zone(zone: ZoneInfo | str) -> ZoneInfo:
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
    tz = _zone(zone)
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
    tz = _zone(zone)
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
    """A new (or re-enabled, or changed) schedule's first occurrence: the next after now."""
    return next_occurrence(cron, zone, now or datetime.now(UTC))


def start_key(schedule_id: int, instant: datetime) -> str:
    """The start key of one occurrence: ``schedule:<id>:<UTC instant, ISO 8601>``."""
    utc = instant.astimezone(UTC).replace(tzinfo=None)
    return f"schedule:{schedule_id}:{utc.isoformat(timespec='seconds')}Z"


@dataclass(frozen=True)
class Plan:
    """What one sweep does for one due schedule: the occurrences to start, in order, and
    the schedule's next ``next_at`` once they have started."""

    starts: list[datetime]
    next_at: datetime


def occurrences_to_start(
    *, cron: str, zone: ZoneInfo | str, catch_up: str, next_at: datetime, now: datetime,
    limit: int = CATCH_UP_MAX,
) -> Plan:  # fmt: skip
    """The catch-up policy: which of the occurrences due (from ``next_at`` up to ``now``)
    start now, and where ``next_at`` goes. ``limit`` bounds the starts (``all``)."""
    tz = _zone(zone)
    if next_at > now or limit <= 0:
        return Plan([], next_at)
    if catch_up == CatchUp.ALL:
        starts: list[datetime] = []
        # The first occurrence at or after next_at (next_at is one, unless the data was
        # changed behind the schedule's back).
        at = next_occurrence(cron, tz, next_at - timedelta(microseconds=1))
        while at <= now and len(starts) < min(limit, CATCH_UP_MAX):
            starts.append(at)
            at = next_occurrence(cron, tz, at)
        return Plan(starts, at)
    latest = latest_occurrence(cron, tz, now)
    due = latest is not None and latest >= next_at
    if catch_up == CatchUp.NONE and latest is not None and now - latest > MISSED_AFTER:
        due = False  # missed: skipped
    return Plan([latest] if due and latest is not None else [], next_occurrence(cron, tz, now))


# --- the sweep ----------------------------------------------------------------------------------


@dataclass
class _Outcome:
    started: int = 0  # runs created
    last_started_at: datetime | None = None
    last_run_id: int | None = None
    error: str = ""
    next_at: datetime | None = None  # None: as planned
    retry: float = 0.0  # refused for a while: claimed again after this many seconds
    notes: list[str] = field(default_factory=list)


def fire_due_schedules(by: str = "sweep", *, batch: int = BATCH) -> int:
    """Start the due occurrences of due schedules (each start its own transaction, in
    run_start); how many runs were started. Called by the elected sweeper every tick."""
    claimed, now = _claim(batch)
    started = 0
    for schedule in claimed:
        budget = STARTS_PER_CALL - started
        try:
            started += _fire(schedule, now, budget, by)
        except Exception as exc:  # one schedule's failure is its own: the others go on
            # The claim is left to lapse: the same occurrences are tried again with the
            # same keys after CLAIM_SECONDS.
            if is_transient(exc):  # the database's passing trouble, not the schedule's
                logger.warning("schedule %s (%s) met %s; tried again later", schedule.pk, by, exc)
                if lost_connection(exc):
                    connection.close()  # a fresh one for the next schedule
                continue
            logger.exception("schedule %s (%s) failed; tried again later", schedule.pk, by)
            Schedule.objects.filter(pk=schedule.pk).update(
                last_error=_error_text(f"{type(exc).__name__}: {exc}"), last_error_at=Now()
            )
    return started


def _claim(batch: int) -> tuple[list[Schedule], datetime]:
    """Claim a batch of due, enabled schedules (not claimed by a live sweeper) for
    CLAIM_SECONDS, in one short transaction, earliest due first; and the database's now."""
    with transaction.atomic(durable=True):
        rows = list(
            Schedule.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("org", "automation")
            .filter(enabled=True, next_at__lte=Now())
            .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lte=Now()))
            .order_by("next_at")[:batch]
        )
        if rows:
            Schedule.objects.filter(pk__in=[s.pk for s in rows]).update(
                claimed_until=_from_now(CLAIM_SECONDS)
            )
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            row = cursor.fetchone()
    assert row is not None
    now: datetime = row[0]
    return rows, now


def _from_now(seconds: float) -> ExpressionWrapper:
    return ExpressionWrapper(Now() + timedelta(seconds=seconds), output_field=DateTimeField())


def _fire(schedule: Schedule, now: datetime, budget: int, by: str) -> int:
    plan = occurrences_to_start(
        cron=schedule.cron, zone=schedule.timezone, catch_up=schedule.catch_up,
        next_at=schedule.next_at, now=now, limit=budget,
    )  # fmt: skip
    outcome = _Outcome()
    for at in plan.starts:
        if not _start(schedule, at, outcome):
            outcome.next_at = at  # refused for a while: this occurrence (and on) later
            break
    crash_point("schedules.before_advance")  # started, next_at not moved yet
    _advance(schedule, plan, outcome)
    if outcome.notes:
        logger.warning("schedule %s: %s (%s)", schedule.pk, "; ".join(outcome.notes), by)
    return outcome.started


def _start(schedule: Schedule, at: datetime, outcome: _Outcome) -> bool:
    """Start one occurrence (its own transaction); False when it is to be tried again."""
    key = start_key(schedule.pk, at)
    try:
        result = run_start(org=schedule.org, automation_slug=schedule.automation.slug,
                           run_input=schedule.input, start_key=key)  # fmt: skip
    except StartKeyConflict as exc:
        # This occurrence already started a run, before the schedule's input or automation
        # was changed: it is started.
        outcome.last_started_at, outcome.last_run_id = at, exc.extra["run_id"]
        return True
    except StartQuota as exc:  # a quota that frees up with time: nothing started
        _refused(outcome, at, exc)
        outcome.retry = max(1.0, float(exc.retry_after_seconds))
        return False
    except WaymarkError as exc:  # refused for good: skipped
        _refused(outcome, at, exc)
        return True
    outcome.started += int(result.created)
    outcome.last_started_at, outcome.last_run_id = at, result.run_id
    return True


def _refused(outcome: _Outcome, at: datetime, exc: WaymarkError) -> None:
    outcome.error = _error_text(f"{at.isoformat()}: {exc.code}: {exc.detail}")
    outcome.notes.append(f"the start at {at.isoformat()} was refused: {exc.code}")


def _error_text(text: str) -> str:
    return text[:MAX_ERROR_CHARS]


def _advance(schedule: Schedule, plan: Plan, outcome: _Outcome) -> None:
    """Move ``next_at`` on, record what started or was refused, and release the claim. A
    ``next_at`` changed meanwhile (the schedule was edited) stands."""
    planned = outcome.next_at or plan.next_at
    changes: dict[str, Any] = {
        "next_at": Case(When(next_at=schedule.next_at, then=Value(planned)), default=F("next_at")),
        "claimed_until": _from_now(outcome.retry) if outcome.retry else None,
        "updated_at": Now(),
    }
    if outcome.last_started_at is not None:
        changes["last_started_at"] = outcome.last_started_at
        changes["last_run_id"] = outcome.last_run_id
    if outcome.error:
        changes["last_error"] = outcome.error
        changes["last_error_at"] = Now()
    elif outcome.last_started_at is not None:
        changes["last_error"] = ""
    Schedule.objects.filter(pk=schedule.pk).update(**changes)
