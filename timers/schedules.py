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
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo

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
from workflows.plugins.engine import crash_point, is_transient, lost_connection
from workflows.plugins.runs import quotas, run_start

from .cron import (
    as_zone,
    cron_problem,
    first_occurrence,
    latest_occurrence,
    next_occurrence,
    schedule_problems,
)
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
#: The most of an error a timer or a schedule keeps.
MAX_ERROR_CHARS: Final = 2000
#: How long a claim holds a schedule: a sweeper that died mid-way is replaced after this.
CLAIM_SECONDS: Final = 60.0
#: A start refused for a while (the running-runs quota) is tried again after this; one
#: refused by the starts-per-minute quota, once the minute is over.
RETRY_SECONDS: Final = float(RunningRunsQuota.retry_after_seconds)


# --- quota --------------------------------------------------------------------------------------


def check_schedule_quota(org: Organisation) -> None:
    """In the transaction that creates a schedule: the organisation's row locked (two racing
    creations cannot both take the last one), its schedules counted; QuotaExceeded (409) at
    its quota."""
    quotas.lock_organisation(org)
    limit = quotas.quota(org, "schedules")
    if limit and Schedule.objects.filter(org=org).count() >= limit:
        raise QuotaExceeded(limit=limit, what="schedules")


# --- occurrences --------------------------------------------------------------------------------


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
    tz = as_zone(zone)
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
