"""The step types of the core engine: set, branch, end, noop, wait_signal, parallel, join.

Each is one StepType object: its validation, its lane and what runs when a step of it
executes, side by side.

Registered from ``WorkflowsConfig.ready()``. The StepType objects are module constants so
registering them again (tests, reloads) is a no-op.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.db import connection

from workflows.definitions.expressions import (
    ExpressionError,
    check_condition,
    check_templates_in,
    evaluate_condition,
    render_value,
)
from workflows.definitions.fields import (
    check_choice,
    check_duration,
    check_fields,
    check_step_id_list,
    check_string,
    check_template_field,
    check_template_value,
    parse_duration,
)
from workflows.definitions.registry import StepReport, StepType, registry
from workflows.engine.executors import Park, StepContext, StepFailure, StepResult
from workflows.engine.lanes import engine_setting
from workflows.engine.signals import take_pending


def render(value: Any, context: Mapping[str, Any]) -> Any:
    try:
        return render_value(value, context)
    except ExpressionError as exc:
        # A template that fails on this run's data fails the same way on every retry; only
        # a busy renderer (not the template's doing) is worth retrying.
        raise StepFailure(f"template error: {exc}", retryable=exc.retryable) from exc


VALUE_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
OUTCOME_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,62}")
SIGNAL_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,99}")
END_STATUSES = ("succeeded", "failed")
WAIT_SIGNAL_OUTCOMES = frozenset({"received", "timed_out"})
BRANCH_DEFAULT = "default"


# --- set ------------------------------------------------------------------------------------


def validate_set(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("values",))
    if "values" not in step:
        report.issue("missing_field", "values", "is required")
        return
    values = step["values"]
    if not isinstance(values, dict) or not values:
        report.error("values", "must be an object with at least one name -> value")
        return
    for name, value in values.items():
        if not isinstance(name, str) or VALUE_NAME_RE.fullmatch(name) is None:
            report.error(
                f"values.{name}",
                "is not a valid name: use letters, digits and underscores, not starting with "
                "a digit (at most 64 characters)",
            )
            continue
        check_templates_in(value, f"values.{name}", report)


def run_set(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext) -> StepResult:
    values = render(step.get("values", {}), context)
    return StepResult(output=values, vars=dict(values))


SET = StepType(
    name="set", lane="inline", validate=validate_set, execute=run_set, built=True,
    app="workflows", pure=True,
    context_on_read=True,  # it renders its values
)  # fmt: skip


# --- branch ---------------------------------------------------------------------------------


def _branch_cases(step: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    when = step.get("when")
    return [case for case in when if isinstance(case, dict)] if isinstance(when, list) else []


def branch_outcomes(step: Mapping[str, Any]) -> frozenset[str]:
    names = [c["outcome"] for c in _branch_cases(step) if isinstance(c.get("outcome"), str)]
    return frozenset([*names, BRANCH_DEFAULT])


def validate_branch(step: Mapping[str, Any], report: StepReport) -> None:
    # `when` is a list, not an object: conditions are tried in order and JSON objects (and
    # PostgreSQL's jsonb, which stores definitions) do not keep key order.
    check_fields(step, report, ("when",))
    when = step.get("when")
    if "when" not in step:
        report.issue("missing_field", "when", "is required")
        when = []
    elif not isinstance(when, list) or not when:
        report.error("when", 'must be a non-empty list of {"outcome": name, "if": condition}')
        when = []
    outcomes: list[str] = []
    for index, case in enumerate(when):
        field = f"when.{index}"
        if not isinstance(case, dict) or set(case) != {"outcome", "if"}:
            report.error(field, 'must be an object with exactly "outcome" and "if"')
            continue
        outcome, condition = case["outcome"], case["if"]
        if outcome == BRANCH_DEFAULT:
            report.error(
                f"{field}.outcome",
                '"default" is taken when no condition holds; it has no condition',
            )
        elif not isinstance(outcome, str) or OUTCOME_NAME_RE.fullmatch(outcome) is None:
            report.error(
                f"{field}.outcome",
                "is not a valid outcome name: a lowercase letter, then lowercase letters, "
                "digits or underscores",
            )
        elif outcome in outcomes:
            report.error(f"{field}.outcome", f'repeats outcome "{outcome}"')
        else:
            outcomes.append(outcome)
        problem = check_condition(condition)
        if problem:
            report.issue(
                "malformed_condition", f"{field}.if", f"is not a valid condition: {problem}"
            )

    nxt = step.get("next")
    if "next" not in step:
        report.issue(
            "missing_field",
            "next",
            'is required on a branch: map each outcome and "default" to a step',
        )
        return
    if not isinstance(nxt, dict):
        report.error("next", 'must map each outcome and "default" to a step on a branch')
        return
    for outcome in [*outcomes, BRANCH_DEFAULT]:
        if outcome not in nxt:
            report.issue("missing_field", f"next.{outcome}", "is required")


def run_branch(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext) -> StepResult:
    for case in step.get("when", []):  # in order: the first condition that holds wins
        outcome = case["outcome"]
        try:
            if evaluate_condition(case["if"], context):
                return StepResult(output={"outcome": outcome}, outcome=outcome)
        except ExpressionError as exc:
            raise StepFailure(f"condition {outcome!r}: {exc}", retryable=exc.retryable) from exc
    return StepResult(output={"outcome": "default"}, outcome="default")


BRANCH = StepType(
    name="branch",
    lane="inline",
    validate=validate_branch,
    execute=run_branch,
    outcomes=branch_outcomes,
    built=True,
    app="workflows",
    pure=True,
    context_on_read=True,  # it evaluates its conditions
)


# --- end ------------------------------------------------------------------------------------


def validate_end(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("status", "output"))
    check_choice(step, "status", report, END_STATUSES)
    check_template_value(step, "output", report)


def run_end(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext) -> StepResult:
    output = render(step["output"], context) if "output" in step else None
    return StepResult(output=output, finish=step.get("status", "succeeded"))


END = StepType(
    name="end",
    lane="inline",
    validate=validate_end,
    execute=run_end,
    terminal=True,
    built=True,
    app="workflows",
    pure=True,
    context_on_read=True,  # it renders its output, if any
)


# --- noop -----------------------------------------------------------------------------------


def validate_noop(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("output",))
    check_template_value(step, "output", report)


def run_noop(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext) -> StepResult:
    output = render(step["output"], context) if "output" in step else None
    return StepResult(output=output, outcome="ok")


NOOP = StepType(
    name="noop", lane="io", validate=validate_noop, execute=run_noop, built=True, app="workflows",
    pure=True,  # it renders its output, and nothing else
    context_on_read=True,  # with no output, it copies nothing of the run
)  # fmt: skip


# --- wait_signal ----------------------------------------------------------------------------


def validate_wait_signal(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("signal", "correlation", "timeout"))
    check_string(
        step,
        "signal",
        report,
        max_length=100,
        pattern=SIGNAL_NAME_RE,
        hint=": a signal name starts with a letter, then letters, digits, _ . : or -",
    )
    check_template_field(step, "correlation", report)
    check_duration(step, "timeout", report, required=False)


def wait_signal_outcomes(step: Mapping[str, Any]) -> frozenset[str]:
    return WAIT_SIGNAL_OUTCOMES


def run_wait_signal(
    step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext
) -> StepResult:
    """In the walk: take a signal that came first (consumed in this transaction), or wait
    for one without a slot until the timeout, which takes the outcome "timed_out"."""
    name = str(step["signal"])
    correlation = str(render(step.get("correlation", ""), context)).strip()[:500]
    taker = f"{ctx.run_id}/{ctx.step_id}/{ctx.iteration}"
    with connection.cursor() as cursor:
        signal = take_pending(cursor, org_id=ctx.org_id, run_id=ctx.run_id, name=name,
                              correlation=correlation, taker=taker)  # fmt: skip
    if signal is not None:
        output = {"signal": name, "payload": signal["payload"], "identity": signal["identity"]}
        return StepResult(output=output, outcome="received")
    timeout = parse_duration(step.get("timeout"))
    seconds = (
        timeout.total_seconds() if timeout else engine_setting("SIGNAL_DEFAULT_TIMEOUT_SECONDS")
    )
    detail = {"signal": name, "correlation": correlation}
    return StepResult(park=Park(deadline_seconds=seconds, on_deadline="timed_out", detail=detail))


WAIT_SIGNAL = StepType(
    name="wait_signal",
    lane="inline",
    validate=validate_wait_signal,
    execute=run_wait_signal,
    outcomes=wait_signal_outcomes,
    success_outcomes=frozenset({"received"}),
    waits=True,
    built=True,
    app="workflows",
    context_on_read=True,  # it renders its correlation
)


# --- parallel and join ----------------------------------------------------------------------


JOIN_COMPLETE = ("all", "first")


def validate_join(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("wait_for", "complete"))
    # Predecessors, not edges: they must exist but do not make the join reach them.
    waits_for = check_step_id_list(step, "wait_for", report, check_exists=True)
    complete = step.get("complete", "all")
    if isinstance(complete, bool) or not (
        complete in JOIN_COMPLETE or (isinstance(complete, int) and complete >= 1)
    ):
        report.error("complete", '"all", "first" or a number of branches (1 or more)')
    elif isinstance(complete, int) and waits_for and complete > len(waits_for):
        report.error("complete", f"is more than the {len(waits_for)} step(s) in wait_for")


def run_join(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext) -> StepResult:
    """A join entered outside a fork (no branches to wait for) just passes through; inside a
    fork the walk never enters it: branches arrive at its waiting row (engine/forks.py)."""
    return StepResult(output={"arrived": []})


JOIN = StepType(
    name="join", lane="inline", validate=validate_join, execute=run_join, built=True,
    app="workflows", joins=True,
    context_on_read=True,  # it reads nothing of the run
)  # fmt: skip


def validate_parallel(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("branches",))
    # Existence is checked by the generic validator through `references`.
    branches = check_step_id_list(step, "branches", report, min_items=2)
    join = step.get("next")
    if join is None:
        return  # independent branches: each ends on its own
    types = getattr(report, "step_types", {})
    joining = getattr(report, "joining", [JOIN.name])  # the types that declare `joins`
    if not isinstance(join, str):
        report.error("next", "must be the id of the join step where the branches meet")
    elif join in branches:
        report.error("next", "cannot also be one of the branches")
    elif join in types and types[join] not in joining:
        kinds = " or ".join(f'"{name}"' for name in joining)
        report.error("next", f'must name a step of type {kinds}, not "{types[join]}"')


def parallel_references(step: Mapping[str, Any]) -> dict[str, str]:
    branches = step.get("branches")
    if not isinstance(branches, list):
        return {}
    return {f"branches.{i}": sid for i, sid in enumerate(branches) if isinstance(sid, str)}


def run_parallel(
    step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext
) -> StepResult:
    """Never called: the walk forks a `parallel` itself (engine/forks.py), since starting
    branches and opening their join are writes of the walk's own transaction."""
    raise StepFailure("parallel steps are entered by the walk", retryable=False)


PARALLEL = StepType(
    name="parallel",
    lane="inline",
    validate=validate_parallel,
    execute=run_parallel,
    built=True,
    app="workflows",
    forks=True,
    references=parallel_references,
)

STEP_TYPES = (SET, BRANCH, END, NOOP, WAIT_SIGNAL, PARALLEL, JOIN)


def register_step_types() -> None:
    for step_type in STEP_TYPES:
        registry.register(step_type)
