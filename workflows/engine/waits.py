"""Waking waiting steps: the one transition timers, signals and approvals go through.

A waiting step holds no slot and no lease. It wakes in exactly one of two ways, each a
guarded UPDATE (``status = 'waiting' AND wait_kind = 'external'``) made under its run's lock,
in the caller's transaction:

- ``wake_step``: something from outside happened (a signal consumed, a decision taken, a
  timer fired). The caller makes its own write (marking the signal consumed, say) in the same
  transaction, so both commit or neither does. ``wake_steps_together`` is the same for many
  steps of distinct runs at once (a batch of timers): two round trips in all, not two per
  step.
- ``fire_due_deadlines``: the step's deadline (``wake_at``) passed first.

Whichever commits first wins; the other finds no waiting row and changes nothing. A wake
either ends the step with an outcome (``done``: the walk goes on along ``next``) or makes it
ready to run again (its executor sees the wake's payload in ``StepContext.woken_with``); the
lane wake for that goes into the same transaction's outbox.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, cast

from django.db import connection, transaction

from ..states import RunStatus
from . import sql
from .definition_cache import definition_for
from .executors import StepResult
from .places import Place
from .sql.rows import (
    EVENT_COLUMNS,
    STEP_COLUMNS,
    Statement,
    dumps_cells,
    event_row,
    fetch_dicts,
    insert_events,
    insert_wakes,
    json_params,
    json_rows,
    query_pipelined,
    query_prepared,
    run_batch,
    wakes_statement,
)
from .sql.rows import json_or_null as _json
from .transient import is_transient, log_failure
from .walk import ERROR_KEPT, RunState, Walk, WalkWrites, lock_run

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wake:
    """How a waiting step wakes: with an ``outcome`` it is done (``output`` becomes its
    output); without one it becomes ready and runs again with ``payload``."""

    outcome: str | None = None
    output: Any = None
    payload: Any = None
    reason: str = "woken"  # recorded in the run's history: "signal", "approval", "deadline"
    by: str = ""  # who or what woke it, for the history (the event's worker column)
    # The person, API key or command whose action woke it (their label, "admin:ada"), written
    # as the wake event's detail.by, which the API's run history shows; the engine's own
    # wakes (deadlines, timers, signals) name nobody.
    actor: str = ""

    def detail(self, **detail: Any) -> dict[str, Any]:
        return {**detail, "by": self.actor} if self.actor else detail


def wake_step(
    *,
    step_pk: int,
    wake: Wake,
    due_only: bool = False,
    run_id: int | None = None,
    also: Sequence[Statement] = (),
) -> bool:
    """Wake one waiting step, inside the caller's transaction. False: it was not waiting
    (already woken, its deadline fired, cancelled): the caller's own write must then be
    rolled back or treated as unused, which is why this runs in the caller's transaction.
    ``run_id``: the step's run, when the caller read it already (a step never changes run),
    which saves a round trip; the guarded UPDATE still decides. ``also``: the caller's own
    closing writes (no rows read back), sent in the round trip of the walk's writes when
    the step woke (True), not sent at all when it did not (False)."""
    assert connection.in_atomic_block, "wake_step runs in the transaction of what caused it"
    with connection.cursor() as cursor:
        if run_id is None:
            found = query_prepared(cursor, sql.STEP_RUN, {"id": step_pk})
            if not found:
                return False
            run_id = int(found[0]["run_id"])
        if wake.outcome is None:
            woke = _wake_ready(cursor, lock_run(cursor, run_id), step_pk, wake, due_only)
            if woke and also:
                run_batch(cursor, also)
            return woke
        # The run's lock, then the guarded UPDATE, sent together: the lock is still taken
        # first (one lock order), in one round trip instead of two.
        done = {"id": step_pk, "output": _json(wake.output), "due": due_only, "run": run_id}
        lock = (sql.LOCK_RUN, {"id": run_id})
        locked, woken = query_pipelined(cursor, [lock, (sql.WAKE_DONE, done)])
        if not locked:
            raise LookupError(f"run {run_id} does not exist")
        if not woken:
            return False
        run = RunState(**cast(sql.RunRow, locked[0]))
        walk_on_woken(cursor, run, cast(sql.WokenStepRow, woken[0]), wake).flush(also)
    return True


def wake_steps_together(
    wakes: Sequence[tuple[int, int, Wake]], also: Sequence[Statement] = ()
) -> list[bool] | None:
    """Several waiting steps woken with an outcome, each of its own run, inside the caller's
    transaction: ``wakes`` is (step pk, run id, wake) in run id order. What ``wake_step`` does
    for each in turn, in two round trips: every run locked (in run id order: the one lock
    order) and every step marked done by one statement (sql.LOCK_RUNS_WAKE_DONE), then, each
    run walked on as ``wake_step`` walks it, every walk's writes as one statement of each
    kind (``also`` after them when the last step woke). Per timer of a batch, psycopg's work
    on a statement of its own had cost more than the walk.
    Whether each woke; None, having done nothing, when they cannot go together (a wake
    without an outcome, two steps of one run, runs out of order): the caller wakes each
    alone."""
    assert connection.in_atomic_block, "wake_steps_together runs in its caller's transaction"
    runs = [run_id for _, run_id, _ in wakes]
    if any(w.outcome is None for _, _, w in wakes) or runs != sorted(set(runs)):
        return None
    if not wakes:
        return []
    documents = [json_params({"id": step_pk, "run": run_id, "output": _json(wake.output)})
                 for step_pk, run_id, wake in wakes]  # fmt: skip
    with connection.cursor() as cursor:
        rows = query_prepared(cursor, sql.LOCK_RUNS_WAKE_DONE, {"wakes": dumps_cells(documents)})
        locked = {row["id"]: row for row in rows}
        woke: list[bool] = []
        walks: list[Walk] = []
        for _, run_id, wake in wakes:
            row = locked.get(run_id)
            if row is None:
                raise LookupError(f"run {run_id} does not exist")
            woke.append(row["step_pk"] is not None)
            if row["step_pk"] is not None:
                run = RunState(**{name: row[name] for name in _RUN_FIELDS})
                step = sql.WokenStepRow(
                    id=row["step_pk"], org_id=row["org_id"], run_id=run_id,
                    step_id=row["step_id"], iteration=row["iteration"], attempt=row["attempt"],
                    wait_detail=row["wait_detail"], fork_join_id=row["fork_join_id"],
                    branch=row["branch"],
                )  # fmt: skip
                walks.append(walk_on_woken(cursor, run, step, wake))
        _write_together(
            cursor, [walk.writes() for walk in walks], also if woke and woke[-1] else ()
        )
    return woke


_RUN_FIELDS = [each.name for each in fields(RunState)]  # LOCK_RUNS_WAKE_DONE's run columns


def _write_together(cursor: Any, walks: list[WalkWrites], also: Sequence[Statement]) -> None:
    """Several runs' walks written as one statement of each kind, in one round trip, in the
    order a walk's own flush writes them: the runs' updates, the new steps, the ending of
    the live steps of the runs that ended, the events, the lanes' wake-ups; then ``also``."""
    runs = [json_params(walk.run) for walk in walks if walk.run is not None]
    ending: dict[str, list[int]] = {}  # by the worker the cancellations are logged for
    for walk in walks:
        if walk.ends_live:
            ending.setdefault(walk.worker, []).append(walk.run_id)
    steps = [row for walk in walks for row in walk.steps]
    events = [row for walk in walks for row in walk.events]
    updated, _ = run_batch(cursor, [
        (sql.UPDATE_RUNS, {"runs": dumps_cells(runs)}) if runs else None,
        (sql.INSERT_STEPS_FROM_JSON, {"rows": json_rows(STEP_COLUMNS, steps)}) if steps else None,
        *((sql.CANCEL_LIVE_STEPS_OF_RUNS_LOGGED, {"runs": ids, "worker": worker})
          for worker, ids in ending.items()),
        (sql.INSERT_EVENTS_FROM_JSON, {"rows": json_rows(EVENT_COLUMNS, events)})
        if events else None,
        wakes_statement([wake for walk in walks for wake in walk.wakes]),
        *also,
    ])  # fmt: skip
    if runs and updated != len(runs):
        raise RuntimeError("a run changed under its lock")


def walk_on_woken(cursor: Any, run: RunState, row: sql.WokenStepRow, wake: Wake) -> Walk:
    """The run of a step just woken with an outcome walked on (its writes not sent yet)."""
    walk = Walk(cursor, run, definition_for(run.version_id), worker=wake.by)
    walk.event(f"step.{wake.reason}", row["step_id"], iteration=row["iteration"],
               attempt=row["attempt"], detail=wake.detail(outcome=wake.outcome))  # fmt: skip
    if not walk.finished:
        result = StepResult(output=wake.output, outcome=wake.outcome)
        walk.step_succeeded(row["step_id"], result, Place(row["fork_join_id"], row["branch"]))
    return walk


def fail_waiting_step(*, step_pk: int, run_id: int, error: str, by: str) -> bool:
    """Fail a waiting step for good, inside the caller's transaction, when what should wake
    it cannot (its wake raised an error that is not transient: a bug, a broken row). Its
    run follows the step's failure path (or fails), where an operator sees the error and
    can retry, rather than waiting for a wake that will never come. False: the step was
    not waiting any more."""
    assert connection.in_atomic_block, "fail_waiting_step runs in its caller's transaction"
    with connection.cursor() as cursor:
        run = lock_run(cursor, run_id)
        failed = {"id": step_pk, "run": run_id, "error": error[:ERROR_KEPT]}
        rows = cast(list[sql.WokenStepRow], query_prepared(cursor, sql.FAIL_WAITING, failed))
        if not rows:
            return False
        row = rows[0]
        walk = Walk(cursor, run, definition_for(run.version_id), worker=by)
        walk.event("step.failed", row["step_id"], iteration=row["iteration"],
                   attempt=row["attempt"], detail={"error": error[:ERROR_KEPT]})  # fmt: skip
        if not walk.finished:
            walk.step_failed(row["step_id"], error, Place(row["fork_join_id"], row["branch"]))
        walk.flush()
    return True


def _wake_ready(cursor: Any, run: RunState, step_pk: int, wake: Wake, due_only: bool) -> bool:
    paused = run.status == RunStatus.PAUSED
    ready = {"id": step_pk, "run": run.id, "paused": paused, "due": due_only,
             "payload": _json(wake.payload)}  # fmt: skip
    rows = cast(list[sql.ReadiedStepRow], query_prepared(cursor, sql.WAKE_READY, ready))
    if not rows:
        return False
    row = rows[0]
    events = [event_row(row["org_id"], row["run_id"], f"step.{wake.reason}", row["step_id"],
                        iteration=row["iteration"], attempt=row["attempt"], worker=wake.by,
                        detail=wake.detail(ready=not paused))]  # fmt: skip
    insert_events(cursor, events)
    if not paused:
        insert_wakes(cursor, [(row["org_id"], row["run_id"], row["lane"])])
    return True


def fire_due_deadlines(*, limit: int = 500, by: str = "sweep") -> int:
    """Fire the deadlines that have passed (a bounded batch); return how many fired.

    Each fires in its own transaction, so one bad step fails alone, never the batch. A step
    woken meanwhile by its awaited event is skipped by the guard (``due_only``)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.DUE_DEADLINES, {"n": limit})
        due = cast(list[sql.DueDeadlineRow], fetch_dicts(cursor))
    fired = 0
    for row in due:
        try:
            # The outcome the step declared when it parked (read with the batch).
            wake = Wake(outcome=row["on_deadline"], reason="deadline_passed", by=by)
            with transaction.atomic(durable=True):
                fired += wake_step(step_pk=row["id"], wake=wake, due_only=True)
        except Exception as exc:
            log_failure(logger, exc, "firing the deadline of step %s failed", row["id"])
            if not is_transient(exc):
                fired += _fail_unwakeable(row["id"], row["run_id"], exc, by)
    return fired


def _fail_unwakeable(step_pk: int, run_id: int, exc: Exception, by: str) -> bool:
    """A deadline that cannot fire fails its step (a transient error is tried again at the
    next sweep instead). Should failing it raise too, the step stays waiting and doctor
    lists it: there is nothing sound left to write."""
    error = f"wake_failed: the deadline could not be fired: {type(exc).__name__}: {exc}"
    try:
        with transaction.atomic(durable=True):
            return fail_waiting_step(step_pk=step_pk, run_id=run_id, error=error, by=by)
    except Exception:
        logger.exception("failing step %s, whose deadline could not fire, failed", step_pk)
        return False
