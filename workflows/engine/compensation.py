"""Sagas in the walk (docs/reference/sagas.md, "Sagas and compensation").

A run whose step fails for good, after steps that declare a ``compensate`` completed, undoes
them instead of failing: the plan (recorded as the run.compensating event) has one entry per
completed *execution*, latest first, so a step completed in three loop turns is undone three
times and two steps sharing one compensation step each get theirs. Each entry is entered as a
new iteration of its compensation step (its own effect key), recorded by a
compensation.entered event that names the execution it undoes and its position in the plan;
the next is entered in the transaction that settles the previous one, so the plan survives
any crash and no entry runs twice.

Beginning the plan cancels the run's live forward steps (a branch still running, waiting or
ready), so no forward work completes after the plan was made. Compensation steps are not held
by the run's step budget or max age: the plan is bounded (one entry per completed execution,
which the budget already bounded), and cutting it short leaves a half-undone run, the worst
outcome. Only a compensation that ends with a success outcome (StepType.success_outcomes)
counts; anything else fails the run (``compensation_failed``), and an operator's retry goes on
from the entry where the plan stopped (``resume_position``).

A code run (decided.py) declares no ``compensate``: its function registers each compensation
after the step it undoes (``ctx.compensate_with``), recorded as a step of its own. Its plan is
read from those records, latest first, each entry carrying the whole compensation step; the
entry entered is the step the decider's output asks for (decided.COMPENSATING), so the same
plan, events, effect keys and retries apply.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from ..definitions.registry import registry
from ..definitions.sagas import compensation_targets
from ..states import RunStatus, StepStatus
from .decided import (
    COMPENSATING,
    COMPENSATION_RECORD,
    DecidedSteps,
    compensation_asked,
    deciding_step,
)
from .definition_cache import definition_for
from .executors import StepResult
from .run_state import RunState
from .sql import (
    CANCEL_FORWARD_STEPS,
    COMPENSATED_EXECUTION,
    COMPENSATION_PLAN,
    COMPENSATIONS_ENTERED,
    COMPLETED_STEPS,
    RECORDED_COMPENSATIONS,
    STEP_OUTPUT,
)
from .sql.rows import NOW, NewStep, fetch_dict, fetch_dicts

LIVE = (StepStatus.READY, StepStatus.RUNNING, StepStatus.WAITING)

# Which of a code run's compensation records (``COMPENSATION_RECORD`` rows) its replay still
# reads, by their iterations; None: all of them. A re-run sets aside the records of the steps
# it sets aside (their executions are not the run's any more: a step entered again that took
# the old answer registers its own). Said by the app of the deciding step type (workflows/
# code), which this module cannot import: (org_id, run_id, the run's outputs) -> iterations.
RecordsRead = Callable[[int, int, Mapping[str, Any]], frozenset[int] | None]
RECORDS_READ: dict[str, RecordsRead] = {}


def register_records_read(decider_type: str, records_read: RecordsRead) -> None:
    RECORDS_READ[decider_type] = records_read


CANCELLED_FOR = {"reason": "the run compensates"}


def still_done(
    done: Sequence[tuple[str, int]], steps: Mapping[str, Mapping[str, Any]]
) -> list[tuple[str, int]]:
    """Of the completed executions ``done`` (step, iteration, in the order they completed),
    those no compensation undid since: a compensation step completing undoes the executions
    of the steps it compensates that completed before it. Only a run re-run after it
    compensated (services/rerun.py) has one; its new compensation undoes what completed
    since, not that again (a second refund)."""
    undoes: dict[str, set[str]] = {}
    for step_id, step in steps.items():
        if "compensate" in step:
            undoes.setdefault(step["compensate"], set()).add(step_id)
    kept: list[tuple[str, int]] = []
    for step_id, iteration in done:
        if step_id in undoes:
            kept = [(s, i) for s, i in kept if s not in undoes[step_id]]
        kept.append((step_id, iteration))
    return kept


def undone_by_plans(cursor: Any, run_id: int) -> tuple[set[tuple[str, int]], set[str]]:
    """The executions the run's plans undid (their entries whose step completed), and the
    steps those plans entered (services/rerun.py never offers their effects again)."""
    cursor.execute(COMPENSATIONS_ENTERED, {"run": run_id})
    undone: set[tuple[str, int]] = set()
    compensations: set[str] = set()
    for row in fetch_dicts(cursor):
        compensations.add(row["step_id"])
        if row["completed"]:
            undone.add((row["compensates"], row["compensates_iteration"]))
    return undone, compensations


def _plain(detail: Any) -> Any:
    """An event's detail as read back (sent as text by some paths)."""
    return json.loads(detail) if isinstance(detail, str) else detail


def compensation_state(cursor: Any, run_id: int) -> tuple[dict[str, Any], int] | None:
    """The run's compensation plan and the position (0-based) of the entry entered last;
    None when the run never began compensating."""
    cursor.execute(COMPENSATION_PLAN, {"run": run_id})
    row = fetch_dict(cursor)
    if row is None:
        return None
    return _plain(row["detail"]), max(int(row["position"] or 1) - 1, 0)


@functools.lru_cache(maxsize=4096)
def _compensation_steps(version_id: int) -> frozenset[str]:
    # Versions are immutable: asked for every step a worker runs, computed once per version.
    return frozenset(compensation_targets(definition_for(version_id)["steps"]))


def is_compensation_step(version_id: int, step_id: str, outputs: Mapping[str, Any]) -> bool:
    """Whether ``step_id`` of the version is a compensation step (named by a ``compensate``),
    or, in a code run (its ``outputs``), the compensation its plan is in."""
    if step_id in _compensation_steps(version_id):
        return True
    decider = deciding_step(definition_for(version_id))
    if decider is None:
        return False
    asked = compensation_asked(outputs.get(decider["id"]))
    return asked is not None and asked["id"] == step_id


def compensated_execution(
    cursor: Any, *, run_id: int, step_id: str, iteration: int
) -> dict[str, Any] | None:
    """What a compensation step's row undoes, for its template context (``compensating``):
    the step, the iteration and the output of that execution; None outside a plan."""
    cursor.execute(COMPENSATED_EXECUTION, {"run": run_id, "step": step_id, "iteration": iteration})
    row = fetch_dict(cursor)
    if row is None:
        return None
    return {"step": row["step"], "iteration": row["iteration"], "output": _plain(row["output"])}


def entry_label(entry: dict[str, Any]) -> str:
    """A plan entry as the run's error names it: ``refund (charge #2)``."""
    undoes = entry["compensates"]
    if entry.get("iteration") is not None:
        undoes = f"{undoes} #{entry['iteration']}"
    return f"{entry['step']} ({undoes})"


class SagaWalk(Protocol):
    """What compensation uses of the walk (walk.py's Walk): named here, so that this module
    need not import the walk, which imports it."""

    cursor: Any
    run: RunState
    definition: Mapping[str, Any]
    steps: Mapping[str, Mapping[str, Any]]
    new_steps: list[NewStep]

    @property
    def taken(self) -> Any: ...

    @taken.setter
    def taken(self, value: Any) -> None: ...

    def event(
        self,
        kind: str,
        step_id: str = "",
        *,
        iteration: int | None = None,
        attempt: int | None = None,
        detail: Any = None,
    ) -> None: ...

    def enter(self, step_ids: Iterable[str]) -> None: ...

    def record_output(self, step_id: str, result: StepResult) -> None: ...

    def finish_run(self, status: str, *, output: Any = None, error: str = "") -> None: ...

    def insert_new_steps(self) -> None: ...


class Compensation:
    """One walk's view of its run's compensation (``walk.sagas``)."""

    def __init__(self, walk: SagaWalk) -> None:
        self.walk = walk
        # A code run's compensations are recorded as it goes, not declared (see the module).
        self.decided = walk.steps if isinstance(walk.steps, DecidedSteps) else None
        declared = () if self.decided is not None else walk.definition["steps"]
        self.declared = frozenset(compensation_targets(declared))
        self.plan: dict[str, Any] | None = None
        self.position = 0  # the entry entered last
        self.checked = False  # whether the run's events were read

    @property
    def compensators(self) -> frozenset[str]:
        """The steps that compensate: a definition's declared ones, or the one a code run's
        plan is in."""
        return self.decided.compensators() if self.decided is not None else self.declared

    def may_begin(self) -> bool:
        """Whether a failure of this run may begin a plan (it may have something to undo)."""
        return self.decided is not None or bool(self.declared)

    def active(self) -> bool:
        """Whether this run's compensation has begun: read once a walk, and only for a
        definition that declares compensations, or a code run in a compensation step."""
        if self.plan is not None:
            return True
        if not self.compensators:
            return False
        if self.checked:
            return False
        self.checked = True
        state = compensation_state(self.walk.cursor, self.walk.run.id)
        if state is None:
            return False
        self.plan, self.position = state
        return True

    def holds(self, step_id: str) -> bool:
        """While the run compensates, nothing of its forward path goes on: a sibling branch's
        next step (or a join it completes) is not entered. Only the plan's steps are."""
        compensators = self.compensators
        if not compensators:  # (active() without reading them again: entered at every step)
            return self.plan is not None
        return step_id not in compensators and self.active()

    def exempt(self, step_id: str) -> bool:
        """Whether entering ``step_id`` is outside the run's budgets (see the module)."""
        return step_id in self.compensators

    # --- the plan -------------------------------------------------------------------------

    def begin(self, step_id: str, error: str) -> bool:
        """Plan one compensation per completed execution of a compensable step, latest
        completed first; cancel the live forward steps; enter the first. False (nothing
        done) when no completed step declares a compensation."""
        walk = self.walk
        plan = self._recorded_plan() if self.decided is not None else self._declared_plan()
        if not plan:
            return False
        self.plan, self.checked = {"failed_step": step_id, "error": error, "plan": plan}, True
        walk.event("run.compensating", step_id, detail=self.plan)
        self._cancel_forward()
        self.enter(0)
        return True

    def _declared_plan(self) -> list[dict[str, Any]]:
        """A definition's plan: one entry per completed execution of a step that declares
        a compensation, latest completed first."""
        walk = self.walk
        walk.cursor.execute(COMPLETED_STEPS, {"run": walk.run.id})
        done = [(row["step_id"], row["iteration"]) for row in fetch_dicts(walk.cursor)]
        done += [(row.step_id, row.iteration) for row in walk.new_steps
                 if row.status == StepStatus.DONE]  # fmt: skip
        return [
            {"step": walk.steps[sid]["compensate"], "compensates": sid, "iteration": iteration}
            for sid, iteration in reversed(still_done(done, walk.steps))
            if walk.steps.get(sid, {}).get("compensate")
        ]

    def _recorded_plan(self) -> list[dict[str, Any]]:
        """A code run's plan: one entry per compensation its function registered, latest
        registered first (each follows the execution it undoes), with the whole step. Not
        the records a re-run set aside, nor an execution an earlier plan undid already (a
        run re-run after it compensated, as ``still_done`` for a definition's)."""
        walk = self.walk
        assert self.decided is not None
        # A record this walk made (a turn decided inline) is read with the others.
        walk.insert_new_steps()
        run = walk.run
        params = {"org": run.org_id, "run": run.id, "record": COMPENSATION_RECORD}
        walk.cursor.execute(RECORDED_COMPENSATIONS, params)  # (a hop's walk stops here)
        rows = fetch_dicts(walk.cursor)
        reader = RECORDS_READ.get(str(self.decided.decider["type"]))
        read = None if reader is None else reader(run.org_id, run.id, run.outputs)
        recorded = [_plain(row["output"]) for row in rows
                    if read is None or row["iteration"] in read]  # fmt: skip
        undone, _ = undone_by_plans(walk.cursor, run.id)
        return [
            {"step": r["call"]["id"], "compensates": r["compensates"],
             "iteration": r["iteration"], "call": r["call"]}
            for r in reversed(recorded)
            if (r["compensates"], r["iteration"]) not in undone
        ]  # fmt: skip

    def _cancel_forward(self) -> None:
        """End the run's live forward steps, written or still to write, like a cancel does
        (each a step.cancelled event); a step taken for the settling worker is given up."""
        walk = self.walk
        params = {"run": walk.run.id, "compensators": sorted(self.compensators)}
        walk.cursor.execute(CANCEL_FORWARD_STEPS, params)
        for row in fetch_dicts(walk.cursor):
            walk.event("step.cancelled", row["step_id"], iteration=row["iteration"],
                       attempt=row["attempt"], detail=CANCELLED_FOR)  # fmt: skip
        rows: list[NewStep] = []
        for new in walk.new_steps:
            if new.status in LIVE and new.step_id not in self.compensators:
                new = new._replace(status=StepStatus.CANCELLED, owner=None, lease_until=None,
                                   wait_kind="", wake_at=None, finished_at=NOW)  # fmt: skip
                walk.event("step.cancelled", new.step_id, iteration=new.iteration,
                           attempt=new.attempt or None, detail=CANCELLED_FOR)  # fmt: skip
            rows.append(new)
        walk.new_steps = rows
        if walk.taken is not None and walk.taken.step_id not in self.compensators:
            walk.taken = None

    def enter(self, position: int) -> None:
        """Enter the plan's entry at ``position`` as an ordinary step (its own lane, retry
        policy and, as a new iteration, effect key); the next is entered when it succeeds."""
        walk = self.walk
        assert self.plan is not None
        plan = self.plan["plan"]
        entry = plan[position]
        self.position = position
        step_id = entry["step"]
        detail = {"compensates": entry["compensates"],
                  "compensates_iteration": entry.get("iteration"),
                  "position": position + 1, "of": len(plan)}  # fmt: skip
        # The iteration it is entered as: only the plan enters a compensation step, one
        # entry at a time, so nothing else is entered as it in between.
        iteration = walk.run.entered.get(step_id, 0) + 1
        walk.event("compensation.entered", step_id, iteration=iteration, detail=detail)
        if self.decided is not None:  # the step every lookup of a code run's step finds
            asked = {"call": entry["call"], COMPENSATING: True}
            walk.record_output(self.decided.decider["id"], StepResult(output=asked))
        walk.enter([step_id])

    def execution(self, step_id: str) -> dict[str, Any] | None:
        """The execution the entry being entered undoes (an inline compensation's
        ``compensating``), its output read from this walk's rows or the database."""
        if not self.active():
            return None
        assert self.plan is not None
        entry = self.plan["plan"][self.position]
        if entry["step"] != step_id:
            return None
        walk, key = self.walk, (entry["compensates"], entry.get("iteration"))
        output = next((row.output for row in walk.new_steps
                       if (row.step_id, row.iteration) == key), None)  # fmt: skip
        if output is not None:
            output = output.obj
        else:
            walk.cursor.execute(STEP_OUTPUT, {"run": walk.run.id, "step_id": key[0],
                                              "iteration": key[1]})  # fmt: skip
            row = fetch_dict(walk.cursor)
            output = _plain(row["output"]) if row else None
        return {"step": key[0], "iteration": key[1], "output": output}

    # --- how each compensation ends -------------------------------------------------------

    def succeeded(self, step_id: str, outcome: str | None) -> None:
        """A compensation step ended: only a success outcome counts, and enters the next."""
        step_type = registry.get(self.walk.steps[step_id]["type"])
        if step_type is not None and not step_type.succeeded_with(outcome):
            self.failed(f"step {step_id!r} ended with outcome {outcome!r}, not a success")
            return
        if not self.active():
            raise RuntimeError(f"run {self.walk.run.id}: a compensation step with no plan")
        assert self.plan is not None
        position = self.position + 1
        if position < len(self.plan["plan"]):
            self.enter(position)
        else:
            self.walk.finish_run(RunStatus.COMPENSATED, error=self.plan["error"])

    def failed(self, error: str) -> None:
        """The compensation entered last failed (``error`` says how). Parked for a person:
        the run fails with what is known, and an operator's retry runs this compensation
        again and goes on with the rest of the plan."""
        if not self.active():
            raise RuntimeError(f"run {self.walk.run.id}: a compensation step with no plan")
        assert self.plan is not None
        left = [entry_label(entry) for entry in self.plan["plan"][self.position + 1 :]]
        self.walk.finish_run(RunStatus.FAILED, error=(
            f"compensation_failed: {error}; compensations left: "
            f"{', '.join(left) or 'none'}; compensating for: {self.plan['error']}"))  # fmt: skip
