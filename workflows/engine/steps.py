"""Claim, heartbeat, settle and release: the lifecycle of one claimed step.

Each function is one short transaction. The claim returns the attempt number as the fencing
token; only the newest attempt's settle may write, so a worker that lost its lease (paused,
partitioned, slower than the lease) cannot overwrite the result of the attempt that replaced
it. Settling and walking to the next steps commit together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from django.db import connection, transaction

from ..definitions.expressions import build_context
from . import sql
from .executors import StepFailure, StepResult
from .faults import crash_point
from .lanes import LanePolicy
from .versions import definition_for
from .walk import Walk, event_row, insert_events, insert_wakes, json_or_null, lock_run

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimedStep:
    id: int
    org_id: int
    run_id: int
    step_id: str
    iteration: int
    type: str
    attempt: int  # the fencing token
    released: int
    max_attempts: int
    version_id: int
    # The run's template data as of the claim.
    run_input: Any = field(repr=False)
    run_vars: dict[str, Any] = field(repr=False)
    run_outputs: dict[str, Any] = field(repr=False)
    run_created_at: datetime = field(repr=False)
    run_expired: bool = False  # the run is past its max age (the database's clock)

    @property
    def attempts_used(self) -> int:
        """Claims that ran (or died running): hand-backs on shutdown do not count."""
        return self.attempt - self.released

    @property
    def poisoned(self) -> bool:
        return self.attempts_used > self.max_attempts


def claim(*, policy: LanePolicy, worker: str, limit: int, after_org: int = 0) -> list[ClaimedStep]:
    if limit <= 0:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            sql.CLAIM,
            {
                "lane": policy.name, "n": limit, "worker": worker,
                "lease": policy.lease_seconds, "after_org": after_org,
            },
        )  # fmt: skip
        return [ClaimedStep(*row) for row in cursor.fetchall()]


def next_after_org(claimed: list[ClaimedStep], after_org: int) -> int:
    """The organisation the next claim starts after: the last one this batch served.

    A claim serves organisations after ``after_org`` first, then wraps around to those up to
    it; the last served is the largest wrapped one, or else the largest one."""
    served = {step.org_id for step in claimed}
    wrapped = [org_id for org_id in served if org_id <= after_org]
    return max(wrapped) if wrapped else max(served)


def heartbeat(
    conn: psycopg.Connection, *, held: list[tuple[int, int]], lease_seconds: float
) -> set[tuple[int, int]]:
    """Extend the leases in ``held`` ((step id, attempt) pairs); return the pairs still held."""
    if not held:
        return set()
    ids, attempts = zip(*held, strict=True)
    rows = conn.execute(
        sql.HEARTBEAT, {"ids": list(ids), "attempts": list(attempts), "lease": lease_seconds}
    ).fetchall()
    return {(row[0], row[1]) for row in rows}


def run_context(step: ClaimedStep) -> tuple[dict[str, Any], dict[str, Any]]:
    """The step's definition and the run's template context, as returned by the claim."""
    definition = definition_for(step.version_id)
    context = build_context(
        run_input=step.run_input,
        variables=step.run_vars,
        step_outputs=step.run_outputs,
        run_id=step.run_id,
        started_at=step.run_created_at,
    )
    step_def = next(s for s in definition["steps"] if s["id"] == step.step_id)
    return step_def, context


def settle_success(step: ClaimedStep, result: StepResult, *, worker: str) -> bool:
    """Record the result and walk on, in one transaction. False: this attempt was fenced out."""
    definition = definition_for(step.version_id)
    with transaction.atomic(), connection.cursor() as cursor:
        run = lock_run(cursor, step.run_id)  # lock order everywhere: the run, then its steps
        cursor.execute(
            sql.SETTLE_DONE,
            {"id": step.id, "attempt": step.attempt, "output": json_or_null(result.output)},
        )
        if cursor.fetchone() is None:
            logger.info("step %s attempt %s was fenced out; result dropped", step.id, step.attempt)
            return False
        crash_point("settle.after_step_update")
        walk = Walk(cursor, run, definition, worker=worker)
        walk.event("step.succeeded", step.step_id, iteration=step.iteration, attempt=step.attempt)
        if not walk.finished:
            walk.step_succeeded(step.step_id, result)
        walk.flush()
    return True


def settle_failure(
    step: ClaimedStep, failure: StepFailure, *, worker: str, policy: LanePolicy
) -> bool:
    """Schedule a retry while attempts remain; otherwise fail the step and walk on."""
    error = str(failure)[:2000]
    if failure.retryable and step.attempts_used < step.max_attempts:
        return _schedule_retry(step, error, worker=worker, policy=policy)
    definition = definition_for(step.version_id)
    with transaction.atomic(), connection.cursor() as cursor:
        run = lock_run(cursor, step.run_id)
        cursor.execute(sql.SETTLE_FAILED, {"id": step.id, "attempt": step.attempt, "error": error})
        if cursor.fetchone() is None:
            return False
        walk = Walk(cursor, run, definition, worker=worker)
        walk.event(
            "step.failed", step.step_id, iteration=step.iteration, attempt=step.attempt,
            detail={"error": error},
        )  # fmt: skip
        if not walk.finished:
            walk.step_failed(step.step_id, error)
        walk.flush()
    return True


def _schedule_retry(step: ClaimedStep, error: str, *, worker: str, policy: LanePolicy) -> bool:
    delay = policy.backoff(step.attempts_used)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            sql.SETTLE_RETRY,
            {"id": step.id, "attempt": step.attempt, "error": error, "delay": delay},
        )
        if cursor.fetchone() is None:
            return False
        detail = {"error": error, "delay_seconds": round(delay, 3)}
        insert_events(cursor, [_step_event(step, "step.retry_scheduled", worker, detail)])
    return True


def release(*, held: list[tuple[int, int]], worker: str, lane: str) -> int:
    """Hand steps back at once (lease_until = now()) and wake the lane, so another worker
    takes them now instead of at its next poll."""
    if not held:
        return 0
    ids, attempts = zip(*held, strict=True)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.RELEASE, {"ids": list(ids), "attempts": list(attempts)})
        rows = cursor.fetchall()
        insert_events(
            cursor,
            [
                event_row(org, run, "step.released", sid, iteration=it, attempt=att, worker=worker)
                for _, org, run, sid, it, att in rows
            ],
        )
        insert_wakes(cursor, [(org, run, lane) for _, org, run, *_ in rows])
    return len(rows)


def fail_step_and_run(step: ClaimedStep, error: str, *, worker: str) -> bool:
    """Fail the step and its run without walking (see sql.FAIL_STEP_AND_RUN)."""
    with transaction.atomic(), connection.cursor() as cursor:
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


def _step_event(step: ClaimedStep, kind: str, worker: str, detail: Any = None) -> tuple:
    return event_row(
        step.org_id, step.run_id, kind, step.step_id,
        iteration=step.iteration, attempt=step.attempt, worker=worker, detail=detail,
    )  # fmt: skip
