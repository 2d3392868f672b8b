"""Waiting for a run to end: ``run_wait`` returns as soon as the transaction that ends the
run commits, without polling the run.

The caller LISTENs on the run's own channel, then lists itself (a RunWaiter row) in the
statement that reads the run; the trigger ``run_ended_notify`` (migration 0033) notifies
that channel from the transaction that ends the run, whatever ends it, with the waiter's row
id, and only while a waiter is listed: the engine's transactions take no notification lock
for runs nobody waits for. The run is looked at again every RECHECK_SECONDS all the same: an
ending whose trigger ran just before the waiter was listed, and that committed just after
the waiter read the run, notifies nobody.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from ..engine import sql
from ..engine.sql.functions import RUN_ENDED_CHANNEL_PREFIX
from ..engine.sql.rows import fetch_dict
from ..errors import UnknownRun
from ..models import Organisation

RECHECK_SECONDS = 0.25


class WaitInTransaction(RuntimeError):
    """``run_wait`` called inside a transaction, where no notification is delivered and the
    run's end, committed by another transaction, may not be seen."""


@dataclass(frozen=True)
class RunOutcome:
    """A run as ``run_wait`` found it: ended (``finished_at`` set) with its status, its
    output (what its end step or its code returned) and its error, or still running or
    paused when the wait timed out."""

    run_id: int
    status: str
    output: Any
    error: str
    finished_at: datetime | None

    @property
    def ended(self) -> bool:
        return self.finished_at is not None


def channel_of(run_id: int) -> str:
    return f"{RUN_ENDED_CHANNEL_PREFIX}{int(run_id)}"


def run_wait(*, org: Organisation, run_id: int, timeout: float) -> RunOutcome:
    """The run once it has ended (succeeded, failed, cancelled or compensated), or as it is
    after ``timeout`` seconds if it has not ended by then (running or paused).

    Another organisation's run, or no run, raises UnknownRun. Called in autocommit, not
    inside ``transaction.atomic`` (WaitInTransaction), on this thread's database
    connection, which it leaves listening to nothing. When the run ends while it waits:
    four round trips (listen; read the run and list the waiter; stop listening; read the
    run), none while it waits."""
    if connection.in_atomic_block:
        raise WaitInTransaction("run_wait is called outside a transaction (autocommit)")
    run_id = int(run_id)
    params = {"run": run_id, "org": org.pk}
    with connection.cursor() as cursor:
        if timeout <= 0:
            return _outcome(cursor, sql.RUN_OUTCOME, params)
        channel = channel_of(run_id)
        cursor.execute(f"LISTEN {channel}")
        try:
            found = _outcome_row(cursor, sql.WAIT_FOR_RUN, params)
            waiter = found["waiter"]
            if waiter is None:  # it had ended
                return _as_outcome(found)
            if not _notified(cursor, params, waiter, time.monotonic() + timeout):
                cursor.execute(sql.STOP_WAITING, {"waiter": waiter})
        finally:
            cursor.execute(f"UNLISTEN {channel}")
        return _outcome(cursor, sql.RUN_OUTCOME, params)


def _notified(cursor: Any, params: dict[str, Any], waiter: int, deadline: float) -> bool:
    """Until ``deadline``, wait for the notification to ``waiter`` (a notification that came
    while a statement ran is kept by psycopg and handed first), looking at the run every
    RECHECK_SECONDS; whether the run ended."""
    pg = connection.connection
    channel, mine = channel_of(params["run"]), str(waiter)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        for notify in pg.notifies(timeout=min(left, RECHECK_SECONDS), stop_after=1):
            if notify.channel == channel and notify.payload == mine:
                return True
        if _outcome(cursor, sql.RUN_OUTCOME, params).ended:
            return True


def _outcome(cursor: Any, statement: str, params: dict[str, Any]) -> RunOutcome:
    return _as_outcome(_outcome_row(cursor, statement, params))


def _outcome_row(cursor: Any, statement: str, params: dict[str, Any]) -> dict[str, Any]:
    cursor.execute(statement, params)
    row = fetch_dict(cursor)
    if row is None:
        raise UnknownRun(run_id=params["run"])
    return row


def _as_outcome(row: dict[str, Any]) -> RunOutcome:
    output = None if row["output"] is None else json.loads(row["output"])
    return RunOutcome(run_id=row["id"], status=row["status"], output=output,
                      error=row["error"], finished_at=row["finished_at"])  # fmt: skip
