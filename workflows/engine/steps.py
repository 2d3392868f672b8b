"""Claim, heartbeat, settle and release: the lifecycle of one claimed step.

Each function is one short transaction. The claim returns the attempt number as the fencing
token; only the newest attempt's settle may write, so a worker that lost its lease (paused,
partitioned, slower than the lease) cannot overwrite the result of the attempt that replaced
it. Settling and walking to the next steps commit together.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import psycopg
from django.db import connection, transaction
from django.db.backends.signals import connection_created
from psycopg.rows import dict_row

from ..definitions.registry import RetryPolicy, registry
from ..definitions.rendering import template_context
from . import hops, sql
from .claimed import ClaimedStep
from .compensation import compensated_execution, is_compensation_step
from .decided import step_of
from .definition_cache import definition_for
from .executors import Park, StepContext, StepDeferred, StepFailure, StepResult
from .faults import crash_point
from .hops import Hop
from .lanes import UNSHARED, FairShare, LanePolicy
from .places import Entry
from .plans import refresh_plans_when_due
from .sql.rows import (
    EventRow,
    event_row,
    fetch_dicts,
    insert_events,
    insert_wakes,
    json_or_null,
    query_prepared,
)
from .transient import log_failure
from .transport import own_connection
from .waits import Wake, wake_step
from .walk import (
    ERROR_KEPT,
    ContinuationAttempt,
    TakeNext,
    Walk,
    decider_context,
    lock_run,
    run_state,
)

logger = logging.getLogger(__name__)


class PreparedClaims:
    """A worker's claims, on a connection of their own, as server-side prepared statements.

    The claim is planned once per connection instead of on every call (sql.GENERIC_PLANS):
    planning was about half of a claim's cost (0.4 ms of 0.9 ms on a 2-core machine), and
    the claim loop is what feeds a worker. The statements are the same as with Django's
    cursor; only their binding differs. Rows come back as dicts, by column name.
    Autocommit: each claim commits alone.
    """

    def __init__(self) -> None:
        self.conn: psycopg.Connection[dict[str, Any]] | None = None

    def rows(self, statement: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        cursor = self._execute(statement, params)
        return cursor.fetchall() if cursor.description else []

    def rowcount(self, statement: str, params: dict[str, Any]) -> int:
        return self._execute(statement, params).rowcount

    def _execute(self, statement: str, params: dict[str, Any]) -> psycopg.Cursor[dict[str, Any]]:
        """Run a prepared statement; a failed connection is closed and opened anew next time."""
        if self.conn is None or self.conn.closed:
            self.conn = own_connection(row_factory=dict_row)
            plan_claims_generically(connection=self.conn)
        try:
            refresh_plans_when_due(self.conn)  # its plans follow the tables (plans.py)
            return self.conn.execute(statement, params, prepare=True)
        except psycopg.Error:
            self.close()
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None


def plan_claims_generically(*, connection: Any, **_: Any) -> None:
    """Set up a connection (Django's or psycopg's) to claim on: sql.GENERIC_PLANS."""
    with connection.cursor() as cursor:
        cursor.execute(sql.GENERIC_PLANS)


def plan_claims_generically_from_now_on() -> None:
    """In a worker's process (Worker.run): every Django connection opened from now on is set
    up for the settle's claim as it opens. Its settling threads open theirs lazily, and again
    after a dropped one."""
    connection_created.connect(plan_claims_generically, dispatch_uid="waymark.generic-plans")


def _claimed_rows(
    on: PreparedClaims | None, statement: str, params: dict[str, Any]
) -> list[sql.ClaimedRow]:
    """The rows of a claim (``statement``: sql.CLAIM or sql.CLAIM_SUSPECT)."""
    if on is not None:
        return cast(list[sql.ClaimedRow], on.rows(statement, params))
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cast(list[sql.ClaimedRow], fetch_dicts(cursor))


def claim(
    *,
    policy: LanePolicy,
    worker: str,
    limit: int,
    after_org: int = 0,
    share: FairShare = UNSHARED,
    on: PreparedClaims | None = None,
) -> list[ClaimedStep]:
    """Up to ``limit`` ready steps of the lane, fairly across organisations (sql.CLAIM) and
    within each one's share of the worker's slots (``share``), on Django's connection or, for
    a worker, on its prepared-claims connection (``on``)."""
    if limit <= 0:
        return []
    params = {
        "lane": policy.name, "n": limit, "worker": worker, "lease": policy.lease_seconds,
        "after_org": after_org, **share.params(limit),
    }  # fmt: skip
    return [ClaimedStep.from_row(row) for row in _claimed_rows(on, sql.CLAIM, params)]


def claim_suspect(
    *, policy: LanePolicy, worker: str, on: PreparedClaims | None = None
) -> ClaimedStep | None:
    """One step whose last attempt never settled, for a worker holding nothing else
    (sql.CLAIM_SUSPECT)."""
    params = {"lane": policy.name, "worker": worker, "lease": policy.lease_seconds}
    rows = _claimed_rows(on, sql.CLAIM_SUSPECT, params)
    return ClaimedStep.from_row(rows[0]) if rows else None


def promote_due_retries(
    *, lane: str, worker: str, limit: int = 500, on: PreparedClaims | None = None
) -> int:
    """Retries of ``lane`` whose backoff has passed become ready; returns how many."""
    params: dict[str, Any] = {"lane": lane, "n": limit, "worker": worker}
    if on is not None:
        return on.rowcount(sql.PROMOTE_DUE_RETRIES, params)
    with connection.cursor() as cursor:
        cursor.execute(sql.PROMOTE_DUE_RETRIES, params)
        return int(cursor.rowcount)


def next_after_org(claimed: list[ClaimedStep], after_org: int) -> int:
    """The organisation the next claim starts after: the last one this batch served.

    A claim serves organisations after ``after_org`` first, then wraps around to those up to
    it; the last served is the largest wrapped one, or else the largest one."""
    served = {step.org_id for step in claimed}
    wrapped = [org_id for org_id in served if org_id <= after_org]
    return max(wrapped) if wrapped else max(served)


@dataclass(frozen=True)
class Beat:
    extended: set[tuple[int, int]]  # leases extended now
    lost: set[tuple[int, int]]  # taken over, cancelled or settled: stop these attempts
    # The rest were locked by another transaction: unknown, tried again at the next beat.


def heartbeat(
    conn: psycopg.Connection, *, held: list[tuple[int, int]], lease_seconds: float
) -> Beat:
    """Extend the leases in ``held`` ((step id, attempt) pairs), each on its own."""
    if not held:
        return Beat(set(), set())
    ids, attempts = zip(*held, strict=True)
    cursor = conn.execute(
        sql.HEARTBEAT, {"ids": list(ids), "attempts": list(attempts), "lease": lease_seconds}
    )
    rows = cast(list[sql.HeartbeatRow], fetch_dicts(cursor))
    return Beat(
        extended={(r["id"], r["attempt"]) for r in rows if r["extended"]},
        lost={(r["id"], r["attempt"]) for r in rows if not r["held"]},
    )


def step_context(
    step: ClaimedStep, *, deadline: float | None = None, lost: threading.Event | None = None
) -> StepContext:
    """What the executor of a claimed step is told (see StepContext)."""
    return StepContext(
        org_id=step.org_id, run_id=step.run_id, step_id=step.step_id,
        iteration=step.iteration, attempt=step.attempt, lane=step.lane, deadline=deadline,
        lease_lost=lost or threading.Event(), woken_with=step.woken_with,
        last_attempt=step.attempts_used >= step.max_attempts, version_id=step.version_id,
        attempts_used=step.attempts_used, run_entered=step.run_entered,
        # A code run's turn taken by this worker from the settle whose inline turn handed it
        # over (a ctx.run function): what that turn was handed, so it replays without a read.
        carried=step.carried,
    )  # fmt: skip


def run_context(step: ClaimedStep) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The step's definition and the run's template context, as returned by the claim: for
    a type declared ``context_on_read``, copied from the run when the step first reads it."""
    step_def = step_of(definition_for(step.version_id), step.step_id, step.run_outputs, step.place)
    step_type = registry.get(step.type)
    if step_type is not None and step_type.decides:  # a code run's turn on a worker
        return step_def, decider_context(step.run_input, step.run_outputs)
    compensating = None
    if is_compensation_step(step.version_id, step.step_id, step.run_outputs):
        # What it undoes (a compensation is entered once per completed execution): read
        # with no transaction open, as the executor runs (one statement, sagas only).
        with connection.cursor() as cursor:
            compensating = compensated_execution(
                cursor, run_id=step.run_id, step_id=step.step_id, iteration=step.iteration
            )
    return step_def, template_context(
        step_type is not None and step_type.context_on_read, run_input=step.run_input,
        variables=step.run_vars, step_outputs=step.run_outputs, run_id=step.run_id,
        started_at=step.run_created_at, compensating=compensating,
    )  # fmt: skip


@contextmanager
def _settling(
    step: ClaimedStep,
    statement: str,
    params: dict[str, Any],
    *,
    worker: str,
    take: TakeNext | None = None,
) -> Iterator[Walk | None]:
    """The start of every settle that walks on: lock the run (the one lock order: the run,
    then its steps), make the step's fenced transition (``statement``: one of
    sql.locked_run_then's, both in one round trip), and yield the walk over the locked run's
    version, not the claim's (a migration may have moved the run in between). None: this
    attempt was fenced out. The caller walks and flushes inside the transaction."""
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        found = query_prepared(cursor, statement, {**params, "run": step.run_id})
        rows = cast(list[sql.LockedRunThenRow], found)
        changed = rows[0].pop("changed") if rows else 0
        run = run_state(rows, step.run_id)
        if not changed:
            yield None
            return
        # A worker's settle: a code run's decider may run its turn inline (walk.py).
        yield Walk(cursor, run, definition_for(run.version_id), worker=worker, take_next=take,
                   decide_inline=True)  # fmt: skip


@dataclass(frozen=True)
class Settled:
    """What a settle did, for the worker to act on."""

    ok: bool  # False: this attempt was fenced out (taken over, cancelled): result dropped
    next_step: ClaimedStep | None = None  # the run's next step, claimed for this worker
    from_lane: bool = False  # next_step is another ready step of the lane (TakeNext.claim_lane)
    ran_with_turn: int = 0  # pure steps of the lane its walk ran with a turn (Walk._ran_with_turn)
    failed_with_turn: int = 0  # steps a turn asked that failed for good at once (Walk)


def settle_success(step: ClaimedStep, result: StepResult, *, worker: str) -> bool:
    """Record the result and walk on, in one transaction. False: this attempt was fenced out."""
    return settle_and_take_next(step, result, worker=worker).ok


def settle_and_take_next(
    step: ClaimedStep,
    result: StepResult,
    *,
    worker: str,
    take: TakeNext | None = None,
    hop: bool = True,
) -> Settled:
    """settle_success, and, with ``take``, the first step of the worker's lane that the walk
    enters is claimed for it in the same transaction (see TakeNext). ``hop=False``: the
    caller knows it cannot hop (hops.plan_hop said so)."""
    if result.park is not None:
        return Settled(_settle_park(step, result, worker=worker))
    hopped = hops.hop(step, result, worker=worker, take=take) if hop else None
    if hopped is not None:
        return settled_by_hop(step, hopped)
    # Typed Any: psycopg adapts Jsonb, which the Django stubs do not list as a parameter.
    done: dict[str, Any] = {
        "id": step.id, "attempt": step.attempt, "output": json_or_null(result.output),
    }  # fmt: skip
    with _settling(step, sql.SETTLE_DONE_LOCKED, done, worker=worker, take=take) as walk:
        if walk is None:
            return _fenced_out(step)
        crash_point("settle.after_step_update")
        walk.worker_step_succeeded(step.step_id, step.iteration, step.attempt, result, step.place)
        taken_id = walk.flush()
        next_step = _taken_step(walk, taken_id)
        if next_step is not None or take is None or not take.claim_lane:
            return Settled(True, next_step, ran_with_turn=walk.ran_with_turn,
                           failed_with_turn=walk.failed_with_turn)  # fmt: skip
        claimed = _claim_for(walk.cursor, take)
    return Settled(True, claimed, from_lane=claimed is not None, ran_with_turn=walk.ran_with_turn,
                   failed_with_turn=walk.failed_with_turn)  # fmt: skip


def settled_by_hop(step: ClaimedStep, hopped: Hop) -> Settled:
    """What a hop that reached the database did, as a settle's answer."""
    if not hopped.ok:
        return _fenced_out(step)
    ran, failed = hopped.walk.ran_with_turn, hopped.walk.failed_with_turn
    if hopped.claimed is not None:
        claimed = ClaimedStep.from_row(hopped.claimed)
        return Settled(True, claimed, from_lane=True, ran_with_turn=ran, failed_with_turn=failed)
    return Settled(True, _taken_step(hopped.walk, hopped.taken_id, seen=hopped.seen),
                   ran_with_turn=ran, failed_with_turn=failed)  # fmt: skip


def _fenced_out(step: ClaimedStep) -> Settled:
    logger.info("step %s attempt %s was fenced out; result dropped", step.id, step.attempt)
    return Settled(False)


def _claim_for(cursor: Any, take: TakeNext) -> ClaimedStep | None:
    """One ready step of the lane, claimed by the lane's fair claim in the settle's own
    transaction (TakeNext.claim_lane). Its row locks are taken with SKIP LOCKED, and runs
    are read, not locked, so it never waits on another transaction while the settle holds
    its run's lock."""
    rows = cast(list[sql.ClaimedRow], query_prepared(cursor, sql.CLAIM, take.claim_params()))
    return ClaimedStep.from_row(rows[0]) if rows else None


def _taken_step(walk: Walk, step_pk: int | None, *, seen: str | None = None) -> ClaimedStep | None:
    """The step a walk wrote claimed for its worker, as a claim would have returned it
    (``seen``: the run row's version the walk wrote, when known: its settle may hop)."""
    taken, run = walk.taken, walk.run
    if taken is None or step_pk is None or walk.take_next is None:
        return None
    return ClaimedStep(
        id=step_pk, org_id=run.org_id, run_id=run.id, step_id=taken.step_id,
        iteration=taken.iteration, type=taken.type, lane=walk.take_next.lane, attempt=1,
        attempts_used=1, max_attempts=taken.max_attempts, version_id=run.version_id,
        run_input=run.input, run_vars=run.vars, run_outputs=run.outputs,
        run_created_at=run.created_at, run_expired=run.expired,
        fork_join_id=taken.place.fork_join, branch=taken.place.branch,
        run_entered=run.entered, run_steps_executed=run.steps_executed,
        run_max_steps=run.max_steps, run_seen=seen, carried=walk.carried,
    )  # fmt: skip


def retries(step: ClaimedStep, failure: StepFailure) -> bool:
    """Whether this failed attempt gets another: the failure is retryable (by itself and by
    its step type's policy) and attempts remain."""
    retry = _retry_policy(step)
    retryable = failure.retryable and not (
        retry is not None and failure.error_class in retry.non_retryable
    )
    return retryable and step.attempts_used < step.max_attempts


def _retry_policy(step: ClaimedStep) -> RetryPolicy | None:
    step_type = registry.get(step.type)
    return step_type.retry if step_type is not None else None


def settle_failure(
    step: ClaimedStep, failure: StepFailure, *, worker: str, policy: LanePolicy
) -> bool:
    """Schedule a retry while attempts remain; otherwise fail the step and walk on."""
    error = str(failure)[:ERROR_KEPT]
    if retries(step, failure):
        # A provider's Retry-After wins over the schedule.
        delay = failure.retry_after
        if delay is None:
            delay = policy.backoff(step.attempts_used, retry=_retry_policy(step))
        return _schedule_retry(step, error, worker=worker, delay=delay)
    failed = {"id": step.id, "attempt": step.attempt, "error": error}
    with _settling(step, sql.SETTLE_FAILED_LOCKED, failed, worker=worker) as walk:
        if walk is None:
            return False
        walk.event(
            "step.failed", step.step_id, iteration=step.iteration, attempt=step.attempt,
            detail={"error": error},
        )  # fmt: skip
        if not walk.finished:
            walk.step_failed(step.step_id, error, step.place)
        walk.flush()
    return True


def _settle_park(step: ClaimedStep, result: StepResult, *, worker: str) -> bool:
    """The executor parked its step: it waits without a slot or a lease (see Park)."""
    park = result.park
    assert park is not None
    detail = {**park.detail, "on_deadline": park.on_deadline}
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        lock_run(cursor, step.run_id)  # the run, then its step: like every settle
        parked: dict[str, Any] = {
            "id": step.id, "attempt": step.attempt, "deadline": park.deadline_seconds,
            "detail": json_or_null(detail), "output": json_or_null(result.output),
            "refund": park.refund_attempt,
        }  # fmt: skip
        cursor.execute(sql.SETTLE_PARK, parked)
        if cursor.fetchone() is None:
            return False
        insert_events(cursor, [_step_event(step, "step.waiting", worker, {
            **park.detail, "deadline_seconds": park.deadline_seconds,
            "on_deadline": park.on_deadline,
        })])  # fmt: skip
        _wake_if_woken_meanwhile(cursor, step, park, worker=worker)
    _wake_if_woken_after_park(step, park, worker=worker)
    return True


def _wake_if_woken_meanwhile(cursor: Any, step: ClaimedStep, park: Park, *, worker: str) -> None:
    """Its awaited event came before the park (its wake found no parked step): wake it now,
    as that event would have a moment later (see Park.woken_meanwhile)."""
    if park.woken_meanwhile is None:
        return
    payload = park.woken_meanwhile(cursor)
    if payload is not None:
        wake = Wake(payload=payload, reason="woken_at_park", by=worker)
        wake_step(step_pk=step.id, wake=wake, run_id=step.run_id)


def _wake_if_woken_after_park(step: ClaimedStep, park: Park, *, worker: str) -> None:
    """The park has committed: look once more at what it waits for (see
    Park.woken_after_park), and wake the step now when it came meanwhile. Not done in the
    park's own transaction: that holds the run's lock, and a waker holds its row's lock
    while it takes the locks of the runs it wakes, so the two would deadlock. The park
    stands if this fails: the step's re-check still comes."""
    if park.woken_after_park is None:
        return
    try:
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            payload = park.woken_after_park(cursor)
            if payload is not None:
                wake = Wake(payload=payload, reason="woken_at_park", by=worker)
                wake_step(step_pk=step.id, wake=wake, run_id=step.run_id)
    except Exception as exc:
        log_failure(logger, exc, "step %s: could not look again after parking", step.id)


def settle_continuation(step: ClaimedStep, *, worker: str) -> bool:
    """Walk on from a continuation row's pending entries, in one transaction with its settle."""
    pending = list((step.wait_detail or {}).get("enter", []))
    done = {"id": step.id, "attempt": step.attempt, "output": None}
    with _settling(step, sql.SETTLE_DONE_LOCKED, done, worker=worker) as walk:
        if walk is None:
            return False
        walk.event("walk.continued", step.step_id, iteration=step.iteration,
                   attempt=step.attempt, detail={"enter": pending})  # fmt: skip
        walk.continuation = ContinuationAttempt(step.attempts_used, step.max_attempts)
        if not walk.finished:
            walk.dirty = True
            walk.enter_entries(Entry.from_json(entry) for entry in pending)
        walk.flush()
    return True


def settle_deferred(step: ClaimedStep, deferred: StepDeferred, *, worker: str) -> bool:
    """Run the step again after ``deferred.seconds``; this attempt does not count."""
    # Its code and detail beside the reason, in its event: what reads a deferral back
    # (the doctor, a migration waking a decider) matches them, never the reason's text.
    structured = {**deferred.detail, "code": deferred.code} if deferred.code else {}
    return _schedule_retry(
        step, deferred.reason[:ERROR_KEPT], worker=worker, delay=deferred.seconds, refund=True,
        structured=structured,
    )  # fmt: skip


def _schedule_retry(
    step: ClaimedStep,
    error: str,
    *,
    worker: str,
    delay: float,
    refund: bool = False,
    structured: dict[str, Any] | None = None,
) -> bool:
    params: dict[str, Any] = {
        "id": step.id, "attempt": step.attempt, "error": error, "delay": delay, "refund": refund,
    }  # fmt: skip
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.SETTLE_RETRY, params)
        if cursor.fetchone() is None:
            return False
        detail = {**(structured or {}), "error": error, "delay_seconds": round(delay, 3)}
        kind = "step.deferred" if refund else "step.retry_scheduled"
        insert_events(cursor, [_step_event(step, kind, worker, detail)])
    return True


def release(*, held: list[tuple[int, int]], worker: str) -> int:
    """Hand steps back at once (lease_until = now()) and wake the lane, so another worker
    takes them now instead of at its next poll."""
    if not held:
        return 0
    ids, attempts = zip(*held, strict=True)
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.RELEASE, {"ids": list(ids), "attempts": list(attempts)})
        rows = cast(list[sql.ReadiedStepRow], fetch_dicts(cursor))
        insert_events(
            cursor,
            [
                event_row(r["org_id"], r["run_id"], "step.released", r["step_id"],
                          iteration=r["iteration"], attempt=r["attempt"], worker=worker)
                for r in rows
            ],
        )  # fmt: skip
        insert_wakes(cursor, [(r["org_id"], r["run_id"], r["lane"]) for r in rows])
    return len(rows)


def fail_step_and_run(step: ClaimedStep, error: str, *, worker: str) -> bool:
    """Fail the step and its run without walking (see sql.FAIL_STEP_AND_RUN)."""
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        lock_run(cursor, step.run_id)  # the one lock order: the run, then its step
        cursor.execute(
            sql.FAIL_STEP_AND_RUN, {"id": step.id, "attempt": step.attempt, "error": error}
        )
        if cursor.fetchone() is None:
            return False
        insert_events(
            cursor,
            [
                _step_event(step, "step.failed", worker, {"error": error}),
                event_row(step.org_id, step.run_id, "run.failed", worker=worker,
                          detail={"error": error}),
            ],
        )  # fmt: skip
    return True


def _step_event(step: ClaimedStep, kind: str, worker: str, detail: Any = None) -> EventRow:
    return event_row(
        step.org_id, step.run_id, kind, step.step_id,
        iteration=step.iteration, attempt=step.attempt, worker=worker, detail=detail,
    )  # fmt: skip
