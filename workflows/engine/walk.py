"""The walk: every transition of a run goes through here, inside the caller's transaction.

A caller (run start, a worker's settle, later a timer or a signal) locks the run row, tells
the walk what happened, and flushes. The walk enters the next steps of the definition: quick
steps (lane "fast": set, branch, end) run inline right here and never wait in a queue; other
steps become `ready` rows with an outbox row that wakes their lane. Budgets (max steps, max
age) are enforced on every entry. Each transition is recorded as a run event in the same
transaction, so history, state and wake-ups commit together or not at all.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from ..definitions.expressions import build_context
from ..definitions.registry import registry
from ..states import RunStatus, StepStatus
from .executors import StepFailure, StepResult, executor_for
from .lanes import lane_policy
from .sql import LIVE_STEPS, LOCK_RUN, UPDATE_RUN

NOW = object()  # placeholder for the database's now() in inserted rows


@dataclass
class RunState:
    id: int
    org_id: int
    version_id: int
    status: str
    input: Any
    vars: dict[str, Any]
    outputs: dict[str, Any]
    entered: dict[str, int]
    steps_executed: int
    max_steps: int
    expired: bool
    created_at: datetime


def lock_run(cursor: Any, run_id: int) -> RunState:
    cursor.execute(LOCK_RUN, {"id": run_id})
    row = cursor.fetchone()
    if row is None:
        raise LookupError(f"run {run_id} does not exist")
    return RunState(*row)


def next_step_ids(step: Mapping[str, Any], outcome: str | None) -> list[str]:
    target = step.get("next")
    if target is None:
        return []
    if isinstance(target, str):
        return [target]
    # An outcome the mapping does not name ends this path (docs/definitions.md, `next`).
    chosen = target.get(outcome) if outcome is not None else None
    return [chosen] if chosen else []


def insert_rows(cursor: Any, table: str, columns: Sequence[str], rows: list[tuple]) -> None:
    """One multi-row INSERT; NOW in a row becomes the database's now()."""
    if not rows:
        return
    params: list[Any] = []
    groups = []
    for row in rows:
        cells = []
        for value in row:
            if value is NOW:
                cells.append("now()")
            else:
                cells.append("%s")
                params.append(value)
        groups.append(f"({', '.join(cells)})")
    cursor.execute(
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join(groups)}",  # noqa: S608
        params,
    )


def json_or_null(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


STEP_COLUMNS = (
    "org_id", "run_id", "step_id", "iteration", "type", "lane", "status", "attempt",
    "released", "max_attempts", "lease_until", "output", "error", "finished_at",
)  # fmt: skip
EVENT_COLUMNS = (
    "org_id", "run_id", "kind", "step_id", "iteration", "attempt", "worker", "detail", "at",
)  # fmt: skip


def event_row(
    org_id: int,
    run_id: int,
    kind: str,
    step_id: str = "",
    *,
    iteration: int | None = None,
    attempt: int | None = None,
    worker: str = "",
    detail: Any = None,
) -> tuple:
    """One run event, for insert_events: every transition of a run is one of these."""
    return (org_id, run_id, kind, step_id, iteration, attempt, worker, json_or_null(detail), NOW)


def insert_events(cursor: Any, rows: list[tuple]) -> None:
    insert_rows(cursor, "workflows_runevent", EVENT_COLUMNS, rows)


def insert_wakes(cursor: Any, wakes: list[tuple[int, int, str]]) -> None:
    """Outbox rows waking a lane, from (org id, run id, lane) triples."""
    insert_rows(
        cursor,
        "workflows_outbox",
        ("org_id", "topic", "payload", "created_at"),
        [(org, "lane.wake", Jsonb({"lane": lane, "run": run}), NOW) for org, run, lane in wakes],
    )


class Walk:
    def __init__(
        self, cursor: Any, run: RunState, definition: Mapping[str, Any], *, worker: str = ""
    ) -> None:
        self.cursor = cursor
        self.run = run
        self.definition = definition
        self.steps = {step["id"]: step for step in definition["steps"]}
        self.worker = worker
        self.new_steps: list[tuple] = []
        self.events: list[tuple] = []
        self.wake_lanes: set[str] = set()
        self.live_added = 0
        self.path_ended = False
        self.finish: tuple[str, Any, str] | None = None
        self.dirty = False
        self.queue: deque[str] = deque()
        self.draining = False

    # --- recording --------------------------------------------------------------------------

    def event(
        self,
        kind: str,
        step_id: str = "",
        *,
        iteration: int | None = None,
        attempt: int | None = None,
        detail: Any = None,
    ) -> None:
        self.events.append(
            event_row(
                self.run.org_id, self.run.id, kind, step_id,
                iteration=iteration, attempt=attempt, worker=self.worker, detail=detail,
            )
        )  # fmt: skip

    def _add_step(
        self,
        step_id: str,
        iteration: int,
        step_type: str,
        lane: str,
        status: str,
        *,
        attempt: int = 0,
        max_attempts: int = 1,
        output: Any = None,
        error: str = "",
    ) -> None:
        live = status in (StepStatus.READY, StepStatus.RUNNING, StepStatus.WAITING)
        self.new_steps.append(
            (self.run.org_id, self.run.id, step_id, iteration, step_type, lane, status, attempt,
             0, max_attempts, NOW if live else None, json_or_null(output), error,
             None if live else NOW)
        )  # fmt: skip

    def context(self) -> dict[str, Any]:
        return build_context(
            run_input=self.run.input,
            variables=self.run.vars,
            step_outputs=self.run.outputs,
            run_id=self.run.id,
            started_at=self.run.created_at,
        )

    # --- transitions ------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.finish is not None or self.run.status != RunStatus.RUNNING

    def start(self) -> None:
        self.event("run.started", detail={"version_id": self.run.version_id})
        self.enter([self.definition["start"]])

    def step_succeeded(self, step_id: str, result: StepResult) -> None:
        """A step (inline or from a worker) finished: record it and move on."""
        self.dirty = True
        self.run.outputs[step_id] = result.output
        self.run.vars.update(result.vars)
        if result.finish is not None:
            if result.finish == "failed":
                error = f"ended by step {step_id!r} with status failed"
                self.finish_run(RunStatus.FAILED, output=result.output, error=error)
            else:
                self.finish_run(RunStatus.SUCCEEDED, output=result.output)
            return
        targets = next_step_ids(self.steps[step_id], result.outcome)
        if not targets:
            self.path_ended = True
        self.enter(targets)

    def step_failed(self, step_id: str, error: str) -> None:
        """A step failed for good: follow its declared failure path, or fail the run."""
        self.dirty = True
        target = self.steps[step_id].get("on_failure")
        if self.run.expired:
            self._within_budget()  # a run past its max age ends as such, whatever failed
        elif target:
            self.enter([target])
        else:
            self.finish_run(RunStatus.FAILED, error=f"step {step_id!r} failed: {error}")

    def finish_run(self, status: str, *, output: Any = None, error: str = "") -> None:
        if self.finished:
            return
        self.dirty = True
        self.finish = (status, output, error)
        self.event(f"run.{status}", detail={"error": error} if error else None)

    def enter(self, step_ids: Iterable[str]) -> None:
        """Queue steps to enter and, unless already draining, enter them one by one.

        Iterative on purpose: a chain of hundreds of quick steps (or a quick loop running to
        its budget) must not deepen the call stack. A quick step's own successors go on the
        same queue.
        """
        self.queue.extend(step_ids)
        if self.draining:
            return
        self.draining = True
        try:
            while self.queue and not self.finished:
                if not self._within_budget():
                    return
                self._enter_one(self.queue.popleft())
        finally:
            self.draining = False

    def _enter_one(self, step_id: str) -> None:
        self.dirty = True
        step = self.steps[step_id]
        iteration = self.run.entered.get(step_id, 0) + 1
        self.run.entered[step_id] = iteration
        self.run.steps_executed += 1
        step_type = registry.get(step["type"])
        assert step_type is not None, step["type"]
        if step_type.lane != "fast":
            max_attempts = (
                step.get("retry", {}).get("max_attempts")
                or lane_policy(step_type.lane).max_attempts
            )
            self._add_step(
                step_id, iteration, step_type.name, step_type.lane, StepStatus.READY,
                max_attempts=max_attempts,
            )  # fmt: skip
            self.event("step.ready", step_id, iteration=iteration)
            self.wake_lanes.add(step_type.lane)
            self.live_added += 1
            return
        try:
            result = executor_for(step_type.name)(step, self.context())
        except StepFailure as exc:
            self._add_step(
                step_id, iteration, step_type.name, "fast", StepStatus.FAILED,
                attempt=1, error=str(exc),
            )  # fmt: skip
            self.event("step.failed", step_id, iteration=iteration, attempt=1,
                       detail={"error": str(exc)})  # fmt: skip
            self.step_failed(step_id, str(exc))
            return
        self._add_step(
            step_id, iteration, step_type.name, "fast", StepStatus.DONE,
            attempt=1, output=result.output,
        )  # fmt: skip
        self.event("step.succeeded", step_id, iteration=iteration, attempt=1)
        self.step_succeeded(step_id, result)

    def _within_budget(self) -> bool:
        if self.run.expired:
            self.finish_run(RunStatus.FAILED, error="max_age_exceeded: the run is past its max age")
            return False
        if self.run.steps_executed >= self.run.max_steps:
            self.finish_run(
                RunStatus.FAILED,
                error=f"step_budget_exceeded: the run entered {self.run.max_steps} steps",
            )
            return False
        return True

    # --- writing ----------------------------------------------------------------------------

    def flush(self) -> None:
        """Write everything this walk decided, in the caller's transaction."""
        if self.path_ended and self.finish is None and self.live_added == 0:
            self.cursor.execute(LIVE_STEPS, {"run": self.run.id})
            if self.cursor.fetchone()[0] == 0:
                self.finish_run(RunStatus.SUCCEEDED)
        insert_rows(self.cursor, "workflows_step", STEP_COLUMNS, self.new_steps)
        insert_events(self.cursor, self.events)
        insert_wakes(
            self.cursor, [(self.run.org_id, self.run.id, lane) for lane in sorted(self.wake_lanes)]
        )
        if self.dirty:
            self._update_run()

    def _update_run(self) -> None:
        status, output, error = self.finish or (RunStatus.RUNNING, None, "")
        self.cursor.execute(
            UPDATE_RUN,
            {
                "vars": Jsonb(self.run.vars),
                "outputs": Jsonb(self.run.outputs),
                "entered": Jsonb(self.run.entered),
                "steps": self.run.steps_executed,
                "status": status,
                "output": json_or_null(output),
                "error": error,
                "finished": self.finish is not None,
                "id": self.run.id,
            },
        )
        if self.cursor.rowcount != 1:
            raise RuntimeError(f"run {self.run.id} changed under its lock")
