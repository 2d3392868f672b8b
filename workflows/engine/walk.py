"""The walk: every transition of a run goes through here, inside the caller's transaction.

A caller (run start, a worker's settle, later a timer or a signal) locks the run row, tells
the walk what happened, and flushes. The walk enters the next steps of the definition: quick
steps (lane "inline": set, branch, end) run inline right here and never wait in a queue, at most
WALK_INLINE_STEPS of them (or WALK_INLINE_MS) per transaction, after which a continuation row
carries on from a worker; other steps become `ready` rows with an outbox row that wakes their
lane. While the run is paused nothing new becomes claimable: what it would enter waits in a
parked continuation until resume. When the run ends, every live step of it ends too. Budgets
(max steps, max age) are enforced on every entry. Each transition is recorded as a run event
in the same transaction, so history, state and wake-ups commit together or not at all.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from django.db import connection
from psycopg.types.json import Jsonb

from ..definitions.registry import StepType, registry
from ..definitions.rendering import template_context
from ..states import RunStatus, StepStatus, WaitKind
from .compensation import Compensation
from .decided import DecidedSteps, step_at, steps_of
from .executors import (
    INLINE_LEASE,
    NotInline,
    StepContext,
    StepDeferred,
    StepFailure,
    StepResult,
    executor_for,
)
from .forks import Forks
from .lanes import UNSHARED, FairShare, engine_setting, lane_policy
from .places import TOP, Entry, Place
from .run_state import RunState
from .speculative import NeedsTransaction
from .sql import (
    CANCEL_LIVE_STEPS_LOGGED,
    LIVE_STEPS,
    LOCK_RUN,
    STEP_ID_OF,
    UPDATE_RUN,
    RunRow,
    TakenStepRow,
)
from .sql.rows import (
    HOP_EVENT_CELLS,
    NEW_STEP_CELLS,
    NOW,
    START_EVENT_CELLS,
    STEP_COLUMNS,
    EventRow,
    NewStep,
    NowPlus,
    Statement,
    event_row,
    events_statement,
    fetch_dict,
    insert_rows,
    insert_statement,
    json_or_null,
    query_prepared,
    run_batch,
    wakes_statement,
)

# A continuation: the walk's pending entries, continued by a worker of this lane (io, which
# every engine runs) when the walk reached its inline budget or the run is paused. Its step
# id cannot clash with a definition's (step ids are lowercase letters, digits, underscores).
CONTINUATION_STEP = "~continue"
CONTINUATION_TYPE = "continue"
CONTINUATION_LANE = "io"


@dataclass(frozen=True)
class TakeNext:
    """A settling worker's offer to run the run's next step itself: the first step of its
    lane the walk enters is written already claimed (running, attempt 1, leased to it), in
    the settle's transaction, so a hop between steps costs that transaction, not a wake-up
    through the relay and another claim.

    With ``claim_lane``, a settle whose walk entered no step of the lane (its run ended, say)
    claims one ready step of the lane instead, by the lane's fair claim (``sql.CLAIM``, from
    ``after_org`` on), still in the settle's transaction: the slot goes on to the next run
    without a claim of its own (a commit and a round trip fewer per run)."""

    worker: str
    lane: str
    lease_seconds: float
    claim_lane: bool = False
    after_org: int = 0
    share: FairShare = UNSHARED  # the worker's holdings as the settle began (lanes.FairShare)

    def claim_params(self) -> dict[str, Any]:
        """sql.CLAIM's parameters for the one step of the lane a settle claims (claim_lane)."""
        return {**self._claimer(), **self.share.params(1), "n": 1}

    def claim_after_hops_params(self, hopped: list[int]) -> dict[str, Any]:
        """sql.CLAIM_AFTER_HOPS's parameters: a step of the lane for each step in ``hopped``
        (the ids of the steps of hops that end their runs) that its hop settled."""
        # Every hop of the group gives its slot back, not only the one the share was read for.
        share = self.share.freeing(len(hopped) - 1)
        return {**self._claimer(), **share.params(len(hopped)), "hopped": hopped}

    def _claimer(self) -> dict[str, Any]:
        """Who claims, for how long, and where its fair claim goes on from: both claims'."""
        return {"lane": self.lane, "worker": self.worker, "lease": self.lease_seconds,
                "after_org": self.after_org}  # fmt: skip


class QuickStepRetry(Exception):
    """A quick step failed retryably (no template renderer was free in time, say) in a
    continuation's walk with attempts left: the worker retries the continuation after its
    lane's backoff, the walk's writes rolled back with the transaction."""

    def __init__(self, failure: StepFailure) -> None:
        super().__init__(str(failure))
        self.failure = failure


@dataclass(frozen=True)
class ContinuationAttempt:
    """The continuation attempt a walk runs in (settle_continuation): whether a quick step's
    retryable failure may still be retried, or fails the step for good."""

    attempts_used: int
    max_attempts: int

    @property
    def last(self) -> bool:
        return self.attempts_used >= self.max_attempts


@dataclass(frozen=True)
class Taken:
    step_id: str
    iteration: int
    place: Place
    type: str
    max_attempts: int


def lock_run(cursor: Any, run_id: int) -> RunState:
    """Lock the run (the first lock of every transition: the run, then its steps)."""
    return run_state(cast(list[RunRow], query_prepared(cursor, LOCK_RUN, {"id": run_id})), run_id)


def run_state(rows: Sequence[RunRow], run_id: int) -> RunState:
    """The locked run's state, from the row of LOCK_RUN (or a statement that embeds it)."""
    if not rows:
        raise LookupError(f"run {run_id} does not exist")
    return RunState(**rows[0])


def decider_context(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    """A decider's context (StepType ``decides``: the engine's own, built in): the run's input
    and outputs as they are, not a copy. It only reads them, and copies what it hands a
    workflow's code (workflows/code), so a turn does not pay a copy of the whole run, as an
    executor's context (build_context) does."""
    return {
        "input": run_input,
        "steps": {step_id: {"output": output} for step_id, output in outputs.items()},
    }


# (Sets made once: a tuple of the enums' members is made again, member by member, at every
# step the walk enters or adds.)
_LIVE = frozenset([StepStatus.READY, StepStatus.RUNNING, StepStatus.WAITING])
_GOING_ON = frozenset([RunStatus.RUNNING, RunStatus.PAUSED])  # a walk goes on in a run so

FAILED_OUTCOME = "failed"  # an outcome a mapped `next` may follow when the step fails for good
# A step's error is kept to this many characters, wherever it fails: in a worker's settle
# (steps.settle_failure), inline in a walk, or woken to fail (waits.fail_waiting_step).
ERROR_KEPT = 2000


def step_failed_error(step_id: str, error: str) -> str:
    """A run's error when its step ``step_id`` failed for good with ``error``, and the error a
    code run's turn fails with when a step it called did and the code did not catch it
    (workflows/code, StepFailed): run control reads which step failed a code run by it."""
    return f"step {step_id!r} failed: {error}"


def next_step_ids(step: Mapping[str, Any], outcome: str | None) -> list[str]:
    target = step.get("next")
    if target is None:
        return []
    if isinstance(target, str):
        return [target]
    # An outcome the mapping does not name ends this path (docs/reference/definitions.md, `next`).
    chosen = target.get(outcome) if outcome is not None else None
    return [chosen] if chosen else []


class WalkWrites(NamedTuple):
    """A walk's writes as rows (Walk.writes): its run and worker, the run's update
    (UPDATE_RUN's parameters; None when the walk changed nothing of it), its new steps,
    whether its live steps end with it (CANCEL_LIVE_STEPS_LOGGED), its events, and the lanes
    to wake."""

    run_id: int
    worker: str
    run: dict[str, Any] | None
    steps: list[NewStep]
    ends_live: bool
    events: list[EventRow]
    wakes: list[tuple[int, int, str]]


class Walk:
    def __init__(
        self,
        cursor: Any,
        run: RunState,
        definition: Mapping[str, Any],
        *,
        worker: str = "",
        take_next: TakeNext | None = None,
        speculative: bool = False,
        decide_inline: bool = False,
    ) -> None:
        self.cursor = cursor
        self.take_next = take_next
        self.taken: Taken | None = None
        self.run = run
        self.definition = definition
        # The definition's steps, or a code run's as it decides them (decided.py).
        self.steps = steps_of(definition, run.outputs, speculative=speculative)
        # Its parts point back at it weakly: a walk in a reference cycle outlives its settle
        # until the garbage collector's next young pass finds it (a hundred objects a run),
        # and every pass stops the worker's threads (gen1 passes were 3-5 % of a drained io
        # worker's time). Freed by its last reference, it never reaches the collector.
        back = weakref.proxy(self)
        self.sagas = Compensation(back)  # the run's compensation, read when needed
        self.worker = worker
        self.new_steps: list[NewStep] = []
        self.events: list[EventRow] = []
        self.wake_lanes: set[str] = set()
        self.live_added = 0
        self.path_ended = False
        self.finish: tuple[str, Any, str] | None = None
        self.dirty = False
        self.queue: deque[Entry] = deque()
        self.changed_vars: dict[str, Any] = {}
        self.changed_outputs: dict[str, Any] = {}
        self.changed_entered: dict[str, int] = {}
        self.forks = Forks(back)
        self.draining = False
        self.speculative = speculative
        self.continuation: ContinuationAttempt | None = None  # set by settle_continuation
        # A worker's settle (steps._settling), never a web request's walk nor a sweep's: a
        # code run's decider may run its turn right here (_decided_inline).
        self.decide_inline = decide_inline and bool(engine_setting("CODE_DECIDE_INLINE"))
        self.carried: Any = None  # what the run's last turn knew (StepResult.carried)
        self.turn_asked = False  # the next step entered is the one a worker's turn asked
        self.ran_with_turn = 0  # steps run with the turn that asked them (_ran_with_turn)
        # Steps a worker's turn asked that failed for good as they were entered: the record
        # of a code run's ctx.run function that failed on its last attempt, on that worker
        # (counted as a failed step of its lane, as a definition's step failing there is).
        self.failed_with_turn = 0
        # Inline work is bounded per transaction: past either limit, the rest is continued
        # by a worker from a continuation row, so no definition can make a start request or
        # a settle hold the run's lock for long.
        self.inline_budget = int(engine_setting("WALK_INLINE_STEPS"))
        self.inline_left = self.inline_budget
        self.inline_until = time.monotonic() + engine_setting("WALK_INLINE_MS") / 1000
        # A speculative walk (a hop's, hops.py, or a start's, starts.py) runs before any
        # transaction; its writes are checked against the database when they are made. (Asked
        # of the cursor's own connection: Django's connection proxy looks the connection up
        # per thread, a tenth of a batch of timer wakes.)
        assert speculative or getattr(cursor, "db", connection).in_atomic_block, (
            "the walk runs in the caller's transaction"
        )

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

    def add_step(
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
        wait_kind: str = "",
        wake_in: float | None = None,
        wait_detail: Any = None,
        place: Place = TOP,
        owner: str | None = None,
        lease_seconds: float | None = None,
    ) -> None:
        live = status in _LIVE
        lease = NowPlus(lease_seconds) if lease_seconds is not None else None
        self.new_steps.append(
            NewStep.__new__(  # by name, as cheaply as that goes (see rows.NewStep)
                NewStep, org_id=self.run.org_id, run_id=self.run.id, step_id=step_id,
                iteration=iteration, type=step_type, lane=lane, status=status, owner=owner,
                attempt=attempt, release_count=0, series_offset=0, max_attempts=max_attempts,
                lease_until=NOW if status == StepStatus.READY else lease, wait_kind=wait_kind,
                wake_at=None if wake_in is None else NowPlus(wake_in),
                wait_detail=json_or_null(wait_detail), output=json_or_null(output),
                error=error, finished_at=None if live else NOW,
                fork_join_id=place.fork_join, branch=place.branch,
            )
        )  # fmt: skip

    def insert_new_steps(self) -> None:
        """Write the step rows decided so far (before a statement that must see them)."""
        insert_rows(self.cursor, "workflows_step", STEP_COLUMNS, self.new_steps)
        self.new_steps = []

    def context(self, step_type: StepType, compensating: Any = None) -> Mapping[str, Any]:
        """The run's template context for a step of ``step_type`` the walk runs: copied as
        the step reads it when the type declares ``context_on_read`` (an end with no output
        copies nothing of the run), else the whole copy, made now."""
        return template_context(
            step_type.context_on_read, run_input=self.run.input, variables=self.run.vars,
            step_outputs=self.run.outputs, run_id=self.run.id,
            started_at=self.run.created_at, compensating=compensating,
        )  # fmt: skip

    def _decider_context(self) -> dict[str, Any]:
        """A decider's context: the run's input and outputs as the walk holds them, not a
        copy. A decider is the engine's own (StepType ``decides``, built in): it reads them,
        and copies what it hands a workflow's code (workflows/code), so a turn run inline on
        every step does not copy the whole run, as an executor's context does."""
        return decider_context(self.run.input, self.run.outputs)

    # --- transitions ------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.finish is not None or self.run.status not in _GOING_ON

    @property
    def paused(self) -> bool:
        return self.run.status == RunStatus.PAUSED

    def start(self) -> None:
        self.event("run.started", detail={"version_id": self.run.version_id})
        self.enter([self.definition["start"]])

    def record_output(self, step_id: str, result: StepResult) -> None:
        """The run's data changes per step: only what changed is written (``_update_run``),
        so branches settling one after the other never rewrite each other's values."""
        self.note_output(step_id, result.output)
        self.run.vars.update(result.vars)
        self.changed_vars.update(result.vars)

    def note_output(self, step_id: str, output: Any) -> None:
        """``record_output`` of an output the engine notes itself (a decider's, once the
        step it asked for ended or forked): no step result, no variables."""
        self.dirty = True
        self.run.outputs[step_id] = output
        self.changed_outputs[step_id] = output

    def join_opened(self, place: Place, join_row: int) -> None:
        """A fork at ``place`` opened its join row (or a retry continues it in a new one): a
        code run notes it in the output of the decider that asked the parallel, where its
        branches' places find their deciders (decided.py, ``JOIN_ROW``)."""
        if isinstance(self.steps, DecidedSteps):
            noted = self.steps.join_noted(place, join_row)
            if noted is not None:
                self.note_output(*noted)

    def worker_step_succeeded(
        self, step_id: str, iteration: int, attempt: int, result: StepResult, place: Place
    ) -> None:
        """A worker's attempt succeeded (the slow settle's walk and a hop's): record it and,
        while the run goes on, walk on."""
        self.event("step.succeeded", step_id, iteration=iteration, attempt=attempt)
        # A code run's turn on a worker: the step it asked may run with it (_ran_with_turn).
        self.turn_asked = self._decides(step_id, place)
        if not self.finished:
            self.step_succeeded(step_id, result, place)

    def _decides(self, step_id: str, place: Place) -> bool:
        return isinstance(self.steps, DecidedSteps) and self.steps.decides(step_id, place)

    def step_succeeded(self, step_id: str, result: StepResult, place: Place = TOP) -> None:
        """A step (inline or from a worker) finished: record it and move on."""
        self.record_output(step_id, result)
        if result.carried is not None:  # a decider's turn: for its next one in this walk
            self.carried = result.carried
        if isinstance(self.steps, DecidedSteps):
            noted = self.steps.outcome_noted(step_id, result.outcome, place)
            if noted is not None:  # for the deciding turn to read and record
                self.note_output(*noted)
        if result.finish is not None:
            if result.finish == "failed":
                error = f"ended by step {step_id!r} with status failed"
                self.fail_run(step_id, error, output=result.output)
            else:
                self.finish_run(RunStatus.SUCCEEDED, output=result.output)
            return
        if step_id in self.sagas.compensators:
            self.sagas.succeeded(step_id, result.outcome)
            return
        self.go_on(next_step_ids(step_at(self.steps, step_id, place), result.outcome), place)

    def go_on(self, targets: list[str], place: Place) -> None:
        """Enter ``targets`` from ``place``; a branch reaching its fork's join arrives there
        instead, and a branch whose path ends has finished (it arrives too)."""
        if place.fork_join is not None:
            join_step = self.forks.join_step_of(place.fork_join)
            if not targets or join_step in targets:
                self.forks.arrive(place)
                targets = [t for t in targets if t != join_step]
        elif not targets:
            self.path_ended = True
        self.enter(targets, place)

    def step_failed(self, step_id: str, error: str, place: Place = TOP) -> None:
        """A step failed for good: follow its declared failure path, or fail the run (which
        ends every sibling branch too)."""
        self.carried = None  # a turn after a failure reads the history (its rows tell)
        self.dirty = True
        step = step_at(self.steps, step_id, place)
        target = step.get("on_failure")
        mapped = step.get("next")
        if self.run.expired and not self.sagas.exempt(step_id):
            self._within_budget()  # a run past its max age ends as such, whatever failed
        elif target:
            self.enter([target], place)
        elif isinstance(mapped, dict) and mapped.get(FAILED_OUTCOME):
            # The step's outcomes include "failed" and its `next` maps it: a declared path.
            self.go_on([mapped[FAILED_OUTCOME]], place)
        elif isinstance(self.steps, DecidedSteps) and step_id == self.steps.decider["id"]:
            self.fail_run(step_id, error)  # the function's failure says which step, if any
        else:
            self.fail_run(step_id, step_failed_error(step_id, error))

    # --- sagas (docs/reference/sagas.md, "Sagas and compensation") --------------------------------

    def fail_run(self, step_id: str, error: str, *, output: Any = None) -> None:
        """The run would fail because of ``step_id``: it compensates its completed steps
        first when any declared a compensation; a compensation failing fails the run."""
        if step_id in self.sagas.compensators:
            self.sagas.failed(error)
        elif self.sagas.active():
            # Another branch failing while the run compensates: its failure is recorded
            # (step.failed) and changes nothing more. A second plan would undo the same
            # steps again, at new effect keys: a second refund.
            return
        elif not self.sagas.may_begin() or not self.sagas.begin(step_id, error):
            self.finish_run(RunStatus.FAILED, output=output, error=error)

    def finish_run(self, status: str, *, output: Any = None, error: str = "") -> None:
        if self.finished:
            return
        if status == RunStatus.SUCCEEDED and self.sagas.active():
            return  # a sibling branch ended while the run compensates: the plan decides
        self.dirty = True
        self.finish = (status, output, error)
        self.event(f"run.{status}", detail={"error": error} if error else None)

    def enter(self, step_ids: Iterable[str], place: Place = TOP) -> None:
        """Queue steps to enter and, unless already draining, enter them one by one.

        Iterative on purpose: a chain of hundreds of quick steps (or a quick loop running to
        its budget) must not deepen the call stack. A quick step's own successors go on the
        same queue.
        """
        self.enter_entries(Entry(step_id, place) for step_id in step_ids)

    def enter_entries(self, entries: Iterable[Entry]) -> None:
        self.queue.extend(entries)
        if self.draining:
            return
        self.draining = True
        try:
            while self.queue and not self.finished:
                step_id = self.queue[0].step_id
                if self.sagas.holds(step_id):
                    self.queue.popleft()
                    continue
                if not self.sagas.exempt(step_id) and not self._within_budget():
                    return
                if self.paused or self._inline_budget_spent():
                    self._continue_later()
                    return
                self._enter_one(self.queue.popleft())
        finally:
            self.draining = False

    def _inline_budget_spent(self) -> bool:
        """Out of inline steps, or of time once at least one ran (every walk makes
        progress: a continuation that only made another would never end)."""
        if self.inline_left <= 0:
            return True
        ran_one = self.inline_left < self.inline_budget
        return ran_one and time.monotonic() > self.inline_until

    def _continue_later(self) -> None:
        """Hand the pending entries to a continuation row: a worker walks on from them in
        its own transaction (settle_continuation), or resume does, for a paused run."""
        pending = [entry.to_json() for entry in self.queue]
        self.queue.clear()
        self.dirty = True
        iteration = self.next_iteration(CONTINUATION_STEP)
        status = StepStatus.WAITING if self.paused else StepStatus.READY
        self.add_step(
            CONTINUATION_STEP, iteration, CONTINUATION_TYPE, CONTINUATION_LANE, status,
            max_attempts=lane_policy(CONTINUATION_LANE).max_attempts,
            wait_kind=WaitKind.PAUSED if self.paused else "",
            wait_detail={"enter": pending},
        )  # fmt: skip
        self.event("walk.continued_later", CONTINUATION_STEP, iteration=iteration,
                   detail={"enter": pending, "paused": self.paused})  # fmt: skip
        if not self.paused:
            self.wake_lanes.add(CONTINUATION_LANE)
        self.live_added += 1

    def next_iteration(self, step_id: str) -> int:
        iteration = self.run.entered.get(step_id, 0) + 1
        self.run.entered[step_id] = iteration
        self.changed_entered[step_id] = iteration
        return iteration

    def _enter_one(self, entry: Entry) -> None:
        self.dirty = True
        step_id, place = entry.step_id, entry.place
        step = step_at(self.steps, step_id, place)
        iteration = self.next_iteration(step_id)
        self.run.steps_executed += 1
        step_type = registry.get(step["type"])
        assert step_type is not None, step["type"]
        # Only the very step a worker's turn asked, not one a fork or a later turn enters.
        asked, self.turn_asked = self.turn_asked, False
        if self.speculative and not step_type.runs_ahead():
            # Asked of the type's declaration, before anything of the step runs: a wait
            # writes its timer, a signal wait takes a signal, a fork reads its join (all in
            # the run's transaction), and a plugin's type is assumed to need it too.
            raise NeedsTransaction(f"a {step_type.name} step")
        if step_type.forks:
            self.inline_left -= 1
            self.forks.fork(step, iteration, place)
            return
        if step_type.decides and self._decided_inline(entry, step, iteration):
            return
        if asked and step_type.pure and self._ran_with_turn(entry, step, iteration, step_type):
            return
        if step_type.lane != "inline":
            max_attempts = _max_attempts(step, step_type)
            self.live_added += 1
            if self._take(step_id, iteration, step_type.name, step_type.lane, max_attempts, place):
                return
            self.add_step(
                step_id, iteration, step_type.name, step_type.lane, StepStatus.READY,
                max_attempts=max_attempts, place=place,
            )  # fmt: skip
            self.event("step.ready", step_id, iteration=iteration)
            self.wake_lanes.add(step_type.lane)
            return
        self.inline_left -= 1
        ctx = StepContext(
            org_id=self.run.org_id, run_id=self.run.id, step_id=step_id, iteration=iteration,
            attempt=1, lane="inline", lease_lost=INLINE_LEASE,
        )  # fmt: skip
        undoes = self.sagas.execution(step_id) if step_id in self.sagas.compensators else None
        context = self.context(step_type, compensating=undoes)
        try:
            result = executor_for(step_type.name)(step, context, ctx)
        except StepFailure as exc:
            if exc.retryable and self._retry_later(entry, iteration, exc):
                return
            error = str(exc)[:ERROR_KEPT]
            self.add_step(
                step_id, iteration, step_type.name, "inline", StepStatus.FAILED,
                attempt=1, error=error, place=place,
            )  # fmt: skip
            self.event("step.failed", step_id, iteration=iteration, attempt=1,
                       detail={"error": error})  # fmt: skip
            if asked:
                self.failed_with_turn += 1
            self.step_failed(step_id, error, place)
            return
        if result.park is not None:
            # A quick step that waits (a timer, say): parked right away, no worker involved.
            park = result.park
            self.add_step(
                step_id, iteration, step_type.name, "inline", StepStatus.WAITING, attempt=1,
                output=result.output, wait_kind=WaitKind.EXTERNAL,
                wake_in=park.deadline_seconds,
                wait_detail={**park.detail, "on_deadline": park.on_deadline}, place=place,
            )  # fmt: skip
            detail = {**park.detail, "deadline_seconds": park.deadline_seconds}
            self.event("step.waiting", step_id, iteration=iteration, attempt=1, detail=detail)
            self.live_added += 1
            return
        self.add_step(
            step_id, iteration, step_type.name, "inline", StepStatus.DONE,
            attempt=1, output=result.output, place=place,
        )  # fmt: skip
        self.event("step.succeeded", step_id, iteration=iteration, attempt=1)
        self.step_succeeded(step_id, result, place)

    def _decided_inline(self, entry: Entry, step: Mapping[str, Any], iteration: int) -> bool:
        """Run a code run's decider turn here, in a worker's settle, as an inline step: the
        step it asks for is entered in this same transaction, instead of the turn waiting
        for a worker of its lane (a claim, a replay, a settle of its own). False: not here
        (not a worker's settle, or the turn said NotInline: a ``ctx.run`` function or a turn
        past its budget): the walk enters it for a worker, as it always did.

        The turn holds the run's lock while it replays, bounded by its budget
        (workflows/code/budget.py) and counted as an inline step of the walk's budget."""
        if not self.decide_inline or not isinstance(self.steps, DecidedSteps):
            return False
        if self.speculative and (self.carried is None or "within" in step):
            # Ahead of the transaction, a turn runs only from what the previous one knew:
            # reading the history is the ordinary walk's, under the run's lock.
            raise NeedsTransaction("a decider's turn without the run's history")
        if self.new_steps and not self.speculative:
            # The turn may read the run's steps (without a carried history, and always after
            # a re-run's or a retry's cut, which a carried history cannot apply): this
            # walk's must be among them, or it asks again for the step just entered.
            self.insert_new_steps()
        step_id, place, type_name = entry.step_id, entry.place, str(step["type"])
        ctx = StepContext(
            org_id=self.run.org_id, run_id=self.run.id, step_id=step_id, iteration=iteration,
            attempt=1, lane="inline", version_id=self.run.version_id, carried=self.carried,
            ahead=self.speculative, fork_join=place.fork_join, branch=place.branch,
            lease_lost=INLINE_LEASE,
        )  # fmt: skip
        carried, self.carried = self.carried, None
        try:
            result = executor_for(type_name)(step, self._decider_context(), ctx)
        except (NotInline, StepDeferred):  # a worker's turn defers durably
            # The worker's turn replays from what this one was handed, without reading the
            # history, when this worker takes it (a ctx.run function: Walk._take).
            self.carried = carried
            return False
        except StepFailure as exc:
            if exc.retryable:  # a worker's turn has the lane's attempts
                self.carried = carried
                return False
            if self.speculative:  # the run fails (and may compensate): under the lock
                raise NeedsTransaction("a decider's turn that fails the run") from None
            self.inline_left -= 1
            error = str(exc)[:ERROR_KEPT]
            self.add_step(step_id, iteration, type_name, "inline", StepStatus.FAILED,
                          attempt=1, error=error, place=place)  # fmt: skip
            self.event("step.failed", step_id, iteration=iteration, attempt=1,
                       detail={"error": error})  # fmt: skip
            self.step_failed(step_id, error, place)
            return True
        self.inline_left -= 1
        self.add_step(step_id, iteration, type_name, "inline", StepStatus.DONE, attempt=1,
                      output=result.output, place=place)  # fmt: skip
        self.event("step.succeeded", step_id, iteration=iteration, attempt=1)
        self.step_succeeded(step_id, result, place)
        return True

    def _ran_with_turn(
        self, entry: Entry, step: Mapping[str, Any], iteration: int, step_type: StepType
    ) -> bool:
        """Run here the pure worker step a code run's turn just asked of the settling
        worker's own lane, and record it done, instead of writing it claimed for the worker
        to run as an attempt of its own (a settle more). False: not here; it is entered as
        every worker step is, and a failure of it is its lane's to retry.

        A definition's first step is written by its start; a code run's is only known once
        its first turn has run on a worker, so without this a code run pays a settle that
        the same work as a definition does not. Only a pure type's (StepType.pure: no
        outside call, no write, no clock): nothing of it can have happened unless its row
        is written, and a settle that is fenced out or never commits leaves the turn to be
        run again, which asks the step again. An effect, a wait, a person's step always run
        from a written row (an effect's ledger entry needs its step's row: effects/sql.py)."""
        offer = self.take_next
        if (
            offer is None
            or offer.lane != step_type.lane
            or self.taken is not None
            or self.paused
            or entry.step_id in self.sagas.compensators
            or not engine_setting("CODE_RUN_ASKED_PURE_STEP")
        ):
            return False
        step_id, place = entry.step_id, entry.place
        ctx = StepContext(
            org_id=self.run.org_id, run_id=self.run.id, step_id=step_id, iteration=iteration,
            attempt=1, lane=step_type.lane, version_id=self.run.version_id,
            ahead=self.speculative, fork_join=place.fork_join, branch=place.branch,
            lease_lost=INLINE_LEASE,
        )  # fmt: skip
        try:
            result = executor_for(step_type.name)(step, self.context(step_type), ctx)
        except Exception:  # its own attempt meets it again, under its lane's policy
            return False
        if result.park is not None or result.finish is not None:
            return False
        self.inline_left -= 1
        self.ran_with_turn += 1
        self.add_step(
            step_id, iteration, step_type.name, step_type.lane, StepStatus.DONE, attempt=1,
            max_attempts=_max_attempts(step, step_type), output=result.output, place=place,
        )  # fmt: skip
        self.event("step.ready", step_id, iteration=iteration)
        self.event("step.claimed", step_id, iteration=iteration, attempt=1)
        self.event("step.succeeded", step_id, iteration=iteration, attempt=1)
        self.step_succeeded(step_id, result, place)
        return True

    def _retry_later(self, entry: Entry, iteration: int, failure: StepFailure) -> bool:
        """A quick step failed, but not for good (no template renderer was free in time:
        not the step's fault): hand it to a worker that tries it again, under the
        continuation lane's attempts and backoff, instead of failing the run now. False on
        the last attempt: the step then fails for good like any other."""
        if self.speculative:
            raise NeedsTransaction("a quick step to try again")
        if self.continuation is not None:
            if self.continuation.last:
                return False
            raise QuickStepRetry(failure)
        # Not entered after all: the continuation's walk enters it again, as this iteration.
        self.run.entered[entry.step_id] = iteration - 1
        self.changed_entered[entry.step_id] = iteration - 1
        self.run.steps_executed -= 1
        self.inline_left += 1
        self.event("step.retry_later", entry.step_id, iteration=iteration,
                   detail={"error": str(failure)})  # fmt: skip
        self.queue.appendleft(entry)
        self._continue_later()
        return True

    def _take(
        self,
        step_id: str,
        iteration: int,
        type_name: str,
        lane: str,
        max_attempts: int,
        place: Place,
    ) -> bool:
        """Write the step already claimed by the settling worker, when it offered to take the
        next step of its lane (TakeNext) and has not taken one in this walk yet."""
        offer = self.take_next
        if offer is None or offer.lane != lane or self.taken is not None or self.paused:
            return False
        self.add_step(
            step_id, iteration, type_name, lane, StepStatus.RUNNING, attempt=1,
            max_attempts=max_attempts, place=place, owner=offer.worker,
            lease_seconds=offer.lease_seconds,
        )  # fmt: skip
        self.event("step.ready", step_id, iteration=iteration)
        self.event("step.claimed", step_id, iteration=iteration, attempt=1)
        self.taken = Taken(step_id, iteration, place, type_name, max_attempts)
        return True

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

    def flush(self, also: Sequence[Statement] = (), *, commit: bool = False) -> int | None:
        """Write everything this walk decided, in the caller's transaction, in one round trip:
        the run's update first (its row count proves the lock held), then the new steps, the
        ending of live steps when the run finished, the events, and the lanes' wake-ups.
        ``also``: the caller's own closing writes, sent in the same round trip after them.
        ``commit``: the transaction's COMMIT too (rows.run_batch), for a caller whose durable
        atomic block writes nothing after this."""
        rows = self._rows()
        ending = None
        if rows.ends_live:
            ending = (CANCEL_LIVE_STEPS_LOGGED, {"run": self.run.id, "worker": self.worker})
        steps = insert_statement("workflows_step", STEP_COLUMNS, rows.steps)
        taken = None
        if self.taken is not None and self.finish is None:
            taken, steps = self._taken_query(steps)
        # Live steps end before this walk's events are written: a claim that holds one of
        # them commits first, and its event then precedes the run's end in the history too.
        updated, taken_rows = run_batch(self.cursor, [
            (UPDATE_RUN, rows.run) if rows.run is not None else None,
            steps,
            ending,
            events_statement(rows.events),
            wakes_statement(rows.wakes),
            *also,
        ], then=taken, commit=commit)  # fmt: skip
        if self.dirty and updated != 1:
            raise RuntimeError(f"run {self.run.id} changed under its lock")
        return self._taken_id(cast(list[TakenStepRow], taken_rows))

    def writes(self) -> WalkWrites:
        """What flush would send, as rows, for a caller that sends several walks' writes as
        one statement of each kind (waits.wake_steps_together). Only for a walk that took
        no step for a worker (flush reads that step's id back)."""
        assert self.taken is None, "a walk that took a step reads its id back: flush it"
        return self._rows()

    def _rows(self) -> WalkWrites:
        """This walk's writes, once (the new steps are handed over); the run's live steps
        counted first when a path ended with nothing else entered, and the run finished when
        none is left (then none is left to end either)."""
        none_live = False
        if self.path_ended and self.finish is None and self.live_added == 0:
            self.cursor.execute(LIVE_STEPS, {"run": self.run.id})
            none_live = fetch_dict(self.cursor) == {"live": 0}
            if none_live:
                self.finish_run(RunStatus.SUCCEEDED)
        steps, self.new_steps = self.new_steps, []
        return WalkWrites(
            run_id=self.run.id, worker=self.worker,
            run=self._run_update() if self.dirty else None, steps=steps,
            ends_live=self.finish is not None and not none_live, events=self.events,
            wakes=[(self.run.org_id, self.run.id, lane) for lane in sorted(self.wake_lanes)],
        )  # fmt: skip

    def hop(self, seen: str) -> dict[str, Any] | None:
        """This walk's writes as a hop's (sql.SETTLE_HOP's parameters, but for the settled
        step's), for a walk computed from the version ``seen`` of the run's row; None when
        they need what only flush does: the count of live steps (a path ended), a lane to
        wake, entries left for a continuation, a step taken mid-walk."""
        if self.queue or self.wake_lanes or not self.dirty:
            return None
        if self.path_ended and self.finish is None and self.live_added == 0:
            return None
        taken = self.taken if self.finish is None else None
        if taken is not None and not self._taken_is_new():
            return None
        run_update = self._run_update()
        return {
            **run_update, "seen": seen,
            "new_steps": NEW_STEP_CELLS.json(self.new_steps),
            "events": HOP_EVENT_CELLS.json(self.events),
            "worker": self.worker,
            "taken_step": taken.step_id if taken else None,
            "taken_iteration": taken.iteration if taken else None,
        }  # fmt: skip

    def start_writes(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """A new run's walk for sql.START_RUN: its scalar parameters (the run's status and
        step count as the walk left them) and the values of its JSON document (the run's
        vars, outputs and entered, its new steps, events and lanes to wake); None when it
        needs what only flush does: the count of live steps (a path ended), the ending of
        the run, a continuation."""
        if self.queue or self.finish is not None:
            return None
        if self.path_ended and self.live_added == 0:
            return None
        run = self._run_update()
        scalars = {"status": run["status"], "steps": run["steps"]}
        document = {
            "vars": run["vars"].obj, "outputs": run["outputs"].obj,
            "entered": run["entered"].obj,
            "new_steps": NEW_STEP_CELLS.objects(self.new_steps),
            "events": START_EVENT_CELLS.objects(self.events), "lanes": sorted(self.wake_lanes),
        }  # fmt: skip
        return scalars, document

    def _taken_is_new(self) -> bool:
        """Whether the step taken for the worker is among the rows still to insert."""
        assert self.taken is not None
        key = (self.taken.step_id, self.taken.iteration)
        return any((row.step_id, row.iteration) == key for row in self.new_steps)

    def _taken_query(self, steps: Statement | None) -> tuple[Statement, Statement | None]:
        """What reads the id of the step this walk took for its worker, and the steps'
        INSERT still to send: when the taken step is among this flush's new rows, their
        INSERT itself returns the ids (sent last; no other statement of a walk that goes on
        reads the new steps), else the step is looked up (it was written mid-walk)."""
        assert self.taken is not None
        if steps is not None and self._taken_is_new():
            sql, params = steps
            return (f"{sql} RETURNING id, step_id, iteration", params), None
        params = {"run": self.run.id, "step_id": self.taken.step_id,
                  "iteration": self.taken.iteration}  # fmt: skip
        return (STEP_ID_OF, params), steps

    def _taken_id(self, rows: list[TakenStepRow]) -> int | None:
        if self.taken is None:
            return None
        key = (self.taken.step_id, self.taken.iteration)
        return next((int(r["id"]) for r in rows if (r["step_id"], r["iteration"]) == key), None)

    def _run_update(self) -> dict[str, Any]:
        """UPDATE_RUN's parameters: the run's values as this walk leaves them (flush writes
        them; a hop and a batch of wakes send them as JSON, a start as its row)."""
        status, output, error = self.finish or (self.run.status, None, "")
        return {
            "vars": Jsonb(self.changed_vars),
            "outputs": Jsonb(self.changed_outputs),
            "entered": Jsonb(self.changed_entered),
            "steps": self.run.steps_executed,
            "status": status,
            "output": json_or_null(output),
            "error": error,
            "finished": self.finish is not None,
            "id": self.run.id,
            "expected": self.run.status,
        }


def _max_attempts(step: Mapping[str, Any], step_type: StepType) -> int:
    """A worker step's attempts: its own retry field, else its type's, else its lane's."""
    type_policy = step_type.retry.max_attempts if step_type.retry else None
    return int(
        step.get("retry", {}).get("max_attempts")
        or type_policy
        or lane_policy(step_type.lane).max_attempts
    )
