"""Per-organisation quotas: how much one organisation may hold, so one tenant cannot take the
service from the others. Defaults in settings (WAYMARK_QUOTA_*), an organisation's own
``quota_*`` fields override them, and 0 means no limit. They are checked here, in the
services, where the thing is made, so every path (the API, signal-with-start, schedules, the
admin, the commands) meets them; the API's starts throttle (api/throttles.py) only turns a
flood of requests away before they cost a start.

Counted things (automations, versions, schedules) are counted under the organisation's row
lock (``lock_organisation``). Things that come and go by the thousand (running runs, starts
per minute, pending signals) are admitted on a usage row (``QuotaUsage``) locked in the
admitted thing's own transaction: see ``admit_start`` and ``admit_pending_signal``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connection

from ..engine import sql
from ..engine.clock import database_now
from ..engine.sql.rows import fetch_dict
from ..errors import (
    PendingSignalsQuota,
    QuotaExceeded,
    RunningRunsQuota,
    StartsPerMinuteQuota,
)
from ..models import Automation, AutomationVersion, Organisation

STARTS = "starts"
PENDING_SIGNALS = "pending_signals"

# A count that found the quota reached is trusted this long: refusals meanwhile count nothing,
# so a tenant at its quota cannot make every refused request cost a count of its runs (up to
# the quota's worth of index entries). A start may thus be refused for up to this long after
# runs finished; never admitted past the quota.
RECOUNT_SECONDS = 5.0


def database_seconds() -> float:
    """The database's clock, in seconds since the epoch: every process counts the same
    minute, whatever its own clock says (one ten minutes ahead would otherwise move the
    organisation's window ten minutes on, and the others' starts would count into it)."""
    return database_now().timestamp()


# The tests pin the starts-per-minute window's clock (as they pin the API throttle's). None:
# the database's, read by the admitting statement itself (sql.QUOTA_MINUTE), so a start
# under the default quota costs no round trip to read it; only a refusal reads it here.
clock: Callable[[], float] | None = None


def _pinned_minute() -> int | None:
    """The window's minute the tests pinned, or None: the statement reads the database's."""
    return None if clock is None else int(clock() // 60)


def _seconds() -> float:
    return database_seconds() if clock is None else clock()


def quota(org: Organisation, name: str) -> int:
    own: int | None = getattr(org, f"quota_{name}")
    if own is not None:
        return own
    return int(settings.WAYMARK[f"QUOTA_{name.upper()}"])


def lock_organisation(org: Organisation) -> None:
    """Counts of an organisation's objects are checked and changed under this lock, so two
    concurrent creations cannot both take the last unit. NO KEY: run starts, which only
    reference the row, are not held up."""
    Organisation.objects.select_for_update(no_key=True).filter(pk=org.pk).get()


def check_automations(org: Organisation) -> None:
    """In the creating transaction, after lock_organisation."""
    limit = quota(org, "automations")
    if limit and Automation.objects.filter(org=org).count() >= limit:
        raise QuotaExceeded(limit=limit, what="automations")


def check_versions(org: Organisation) -> None:
    """In the creating transaction, after lock_organisation."""
    limit = quota(org, "versions")
    if limit and AutomationVersion.objects.filter(org=org).count() >= limit:
        raise QuotaExceeded(limit=limit, what="versions")


# --- admissions -------------------------------------------------------------------------------


def admit_start(org: Organisation) -> None:
    """In the start's transaction, before the run is written: one more running run and one
    more start this minute, or RunningRunsQuota / StartsPerMinuteQuota (429). The usage row
    stays locked until the start commits, so racing starts take the last slot one at a time.
    A start whose key already started a run is counted too (it is not known yet): the bound
    errs high, the next count corrects it."""
    limit, rate = quota(org, "running_runs"), quota(org, "starts_per_minute")
    if limit or rate:
        _admit(org, STARTS, limit, rate, sql.RUNNING_RUNS_UP_TO, RunningRunsQuota)


def start_admission(org: Organisation) -> dict[str, Any]:
    """sql.START_RUN's parameters that admit the start in its own statement, as QUOTA_ADMIT
    does (``admit`` false: no start quota applies)."""
    limit, rate = quota(org, "running_runs"), quota(org, "starts_per_minute")
    return {"admit": bool(limit or rate), "limit": limit, "rate": rate,
            "window": _pinned_minute() if rate else 0}  # fmt: skip


def admit_pending_signal(org: Organisation) -> None:
    """In the signal's transaction, once no waiting step took it: one more signal kept
    pending, or PendingSignalsQuota (429), which rolls the signal back."""
    limit = quota(org, "pending_signals")
    if limit:
        _admit(org, PENDING_SIGNALS, limit, 0, sql.PENDING_SIGNALS_UP_TO, PendingSignalsQuota,
               itself=1)  # fmt: skip


def remember_count(org: Organisation, refused: Exception) -> None:
    """After a refusal's transaction was rolled back: keep the count it made, so the next
    refusals within RECOUNT_SECONDS count nothing. Outside the refused transaction."""
    extra: dict[str, Any] = getattr(refused, "extra", {})
    if extra.get("counted") is None:
        return
    params = {"org": org.pk, "kind": extra["kind"], "count": extra["counted"]}
    with connection.cursor() as cursor:
        cursor.execute(sql.QUOTA_REMEMBER_COUNT, params)


def forget_running_counts() -> None:
    """Count again at the next admission (tests, and after an operator changes a quota or
    runs were made outside the start path)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.QUOTA_FORGET)


def _admit(
    org: Organisation,
    kind: str,
    limit: int,
    rate: int,
    count_sql: str,
    refusal: type[QuotaExceeded],
    itself: int = 0,
) -> None:
    """One statement when the bound is below the quota (nearly always); else the row is
    locked, the things counted (no further than the quota) if the last count is not recent,
    and the admission made or refused. ``itself``: 1 when the admitted thing is written
    already (a signal), so the count sees it."""
    assert connection.in_atomic_block, "an admission goes with what it admits"
    params: dict[str, Any] = {"org": org.pk, "kind": kind, "limit": limit, "rate": rate,
                              "window": _pinned_minute() if rate else 0}  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(sql.QUOTA_ADMIT, params)
        if cursor.fetchone() is not None:
            return
        # Not admitted at once: decide on one minute from here on (the transaction's).
        now = _seconds() if rate else 0.0
        params["window"] = int(now // 60)
        cursor.execute(sql.QUOTA_USAGE_CREATE, params)
        cursor.execute(sql.QUOTA_USAGE_LOCK, {**params, "fresh": RECOUNT_SECONDS})
        row = fetch_dict(cursor)
        assert row is not None
        if rate and params["window"] <= row["window"] and row["window_count"] >= rate:
            retry_after = max(1, math.ceil(60 - now % 60))
            raise StartsPerMinuteQuota(limit=rate, retry_after=retry_after)
        if limit and (row["bound"] is None or row["bound"] >= limit):
            if row["bound"] is not None and row["fresh"]:
                raise refusal(limit=limit, what=kind)
            cursor.execute(count_sql, {"org": org.pk, "limit": limit + itself})
            (counted,) = cursor.fetchone()
            count = int(counted) - itself  # the others
            if count >= limit:
                raise refusal(limit=limit, what=kind, kind=kind, counted=count)
            cursor.execute(sql.QUOTA_USAGE_COUNTED, {**params, "count": count})
        cursor.execute(sql.QUOTA_ADMIT, params)
        assert cursor.fetchone() is not None, "admitted under the row's lock"
