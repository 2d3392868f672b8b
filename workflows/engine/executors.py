"""What each built step type does when it runs, registered by type name.

Quick types (lane "fast") run inline in the walk, inside its transaction: they touch nothing
outside the database. Lane types run in a worker, outside any transaction. Every executor
is a pure function of the step's definition and the run's template context.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ..definitions.expressions import ExpressionError, evaluate_condition, render_value


@dataclass
class StepResult:
    output: Any = None
    outcome: str | None = None  # picks the branch of a mapped `next`
    vars: dict[str, Any] = field(default_factory=dict)  # merged into the run's vars
    finish: str | None = None  # "succeeded" / "failed": this step ends the run


class StepFailure(Exception):
    """The step did not succeed. ``retryable=False`` skips the remaining attempts."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class StepRuntime:
    """What a running executor may ask about its own attempt."""

    attempt: int = 1  # the fencing token
    # Set by the worker's heartbeat when a newer attempt took the step over: a long
    # executor should stop at its next safe point, since its result would be refused.
    lease_lost: threading.Event = field(default_factory=threading.Event)


# Set by the worker around each executor call; unset (None) when a step runs inline.
CURRENT_STEP: ContextVar[StepRuntime | None] = ContextVar("CURRENT_STEP", default=None)


def current_attempt() -> int:
    runtime = CURRENT_STEP.get()
    return runtime.attempt if runtime else 1


def lease_lost() -> bool:
    runtime = CURRENT_STEP.get()
    return runtime is not None and runtime.lease_lost.is_set()


Executor = Callable[[Mapping[str, Any], Mapping[str, Any]], StepResult]
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


def run_set(step: Mapping[str, Any], context: Mapping[str, Any]) -> StepResult:
    values = _render(step.get("values", {}), context)
    return StepResult(output=values, vars=dict(values))


def run_branch(step: Mapping[str, Any], context: Mapping[str, Any]) -> StepResult:
    for case in step.get("when", []):  # in order: the first condition that holds wins
        outcome = case["outcome"]
        try:
            if evaluate_condition(case["if"], context):
                return StepResult(output={"outcome": outcome}, outcome=outcome)
        except ExpressionError as exc:
            raise StepFailure(f"condition {outcome!r}: {exc}", retryable=False) from exc
    return StepResult(output={"outcome": "default"}, outcome="default")


def run_end(step: Mapping[str, Any], context: Mapping[str, Any]) -> StepResult:
    output = _render(step["output"], context) if "output" in step else None
    return StepResult(output=output, finish=step.get("status", "succeeded"))


def run_noop(step: Mapping[str, Any], context: Mapping[str, Any]) -> StepResult:
    output = _render(step["output"], context) if "output" in step else None
    return StepResult(output=output, outcome="ok")


def register_builtin_executors() -> None:
    register_executor("set", run_set)
    register_executor("branch", run_branch)
    register_executor("end", run_end)
    register_executor("noop", run_noop)
