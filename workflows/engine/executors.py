"""What each built step type does when it runs, registered by type name.

Quick types (lane "fast") run inline in the walk, inside its transaction: they touch nothing
outside the database. Lane types run in a worker, outside any transaction. An executor is
called with the step's definition, the run's template context and a StepContext (who and
which attempt it is, its effect key, its deadline), and returns a StepResult, which may park
the step, or raises StepFailure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..definitions.expressions import ExpressionError, evaluate_condition, render_value


@dataclass(frozen=True)
class Park:
    """Returned by an executor (in ``StepResult.park``) to make its step wait.

    The step then holds no worker slot and no lease until it is woken through
    ``workflows.engine.waits.wake_step`` (a signal, a decision, a timer), or until
    ``deadline_seconds`` pass: then it ends with ``on_deadline`` as its outcome, or becomes
    ready to run again when ``on_deadline`` is None. ``detail`` says what it waits for (a
    signal name and correlation key, an approval id); it is stored and shown to operators.
    """

    deadline_seconds: float
    on_deadline: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    output: Any = None
    outcome: str | None = None  # picks the branch of a mapped `next`
    vars: dict[str, Any] = field(default_factory=dict)  # merged into the run's vars
    finish: str | None = None  # "succeeded" / "failed": this step ends the run
    park: Park | None = None  # the step waits instead of finishing (see Park)


class StepFailure(Exception):
    """The step did not succeed. ``retryable=False`` skips the remaining attempts."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class StepContext:
    """What an executor is told about the step execution it performs.

    ``effect_key`` identifies this step execution, not the attempt: ``run/step/iteration``,
    the same on every retry and after a crash, different for each pass of a loop. Outside
    calls are keyed by it so a retry finds the first attempt's effect; a loop's second pass
    is a real second send. (Wake-up message ids are the opposite: they include the attempt.)
    """

    org_id: int
    run_id: int
    step_id: str
    iteration: int
    attempt: int  # the fencing token; grows with every claim
    lane: str
    # When this attempt must be done (time.monotonic() clock); None inline in the walk.
    deadline: float | None = None
    # Set by the worker's heartbeat when the step was taken over, cancelled or timed out:
    # a long executor should stop at its next safe point, since its result will be dropped.
    lease_lost: threading.Event = field(default_factory=threading.Event, compare=False)
    # Why a woken step runs again (the wake's payload), when it was parked and woken ready.
    woken_with: Mapping[str, Any] | None = None

    @property
    def effect_key(self) -> str:
        return f"{self.run_id}/{self.step_id}/{self.iteration}"

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


Executor = Callable[[Mapping[str, Any], Mapping[str, Any], StepContext], StepResult]
_EXECUTORS: dict[str, Executor] = {}


def register_executor(type_name: str, executor: Executor) -> None:
    _EXECUTORS[type_name] = executor


def executor_for(type_name: str) -> Executor:
    try:
        return _EXECUTORS[type_name]
    except KeyError:
        raise StepFailure(f"no executor for step type {type_name!r}", retryable=False) from None


def _render(value: Any, context: Mapping[str, Any]) -> Any:
    try:
        return render_value(value, context)
    except ExpressionError as exc:
        # A template that fails on this run's data fails the same way on every retry.
        raise StepFailure(f"template error: {exc}", retryable=False) from exc


def run_set(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext) -> StepResult:
    values = _render(step.get("values", {}), context)
    return StepResult(output=values, vars=dict(values))


def run_branch(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext) -> StepResult:
    for case in step.get("when", []):  # in order: the first condition that holds wins
        outcome = case["outcome"]
        try:
            if evaluate_condition(case["if"], context):
                return StepResult(output={"outcome": outcome}, outcome=outcome)
        except ExpressionError as exc:
            raise StepFailure(f"condition {outcome!r}: {exc}", retryable=False) from exc
    return StepResult(output={"outcome": "default"}, outcome="default")


def run_end(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext) -> StepResult:
    output = _render(step["output"], context) if "output" in step else None
    return StepResult(output=output, finish=step.get("status", "succeeded"))


def run_noop(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext) -> StepResult:
    output = _render(step["output"], context) if "output" in step else None
    return StepResult(output=output, outcome="ok")


def register_builtin_executors() -> None:
    register_executor("set", run_set)
    register_executor("branch", run_branch)
    register_executor("end", run_end)
    register_executor("noop", run_noop)
