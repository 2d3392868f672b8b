"""The step types of the core engine: set, branch, end, noop, wait_signal, parallel, join.

Registered from ``WorkflowsConfig.ready()``. The StepType objects are module constants so
registering them again (tests, reloads) is a no-op.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from workflows.definitions.expressions import check_condition, check_templates_in
from workflows.definitions.fields import (
    check_choice,
    check_duration,
    check_fields,
    check_step_id_list,
    check_string,
    check_template_field,
    check_template_value,
)
from workflows.definitions.registry import StepReport, StepType, registry

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


SET = StepType(name="set", lane="fast", validate=validate_set, built=True, app="workflows")


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


BRANCH = StepType(
    name="branch",
    lane="fast",
    validate=validate_branch,
    outcomes=branch_outcomes,
    built=True,
    app="workflows",
)


# --- end ------------------------------------------------------------------------------------


def validate_end(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("status", "output"))
    check_choice(step, "status", report, END_STATUSES)
    check_template_value(step, "output", report)


END = StepType(
    name="end", lane="fast", validate=validate_end, terminal=True, built=True, app="workflows"
)


# --- noop -----------------------------------------------------------------------------------


def validate_noop(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("output",))
    check_template_value(step, "output", report)


NOOP = StepType(name="noop", lane="io", validate=validate_noop, built=True, app="workflows")


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


WAIT_SIGNAL = StepType(
    name="wait_signal",
    lane="human",
    validate=validate_wait_signal,
    outcomes=wait_signal_outcomes,
    waits=True,
    built=False,
    app="workflows",
)


# --- parallel and join ----------------------------------------------------------------------


def validate_parallel(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("branches",))
    # Existence is checked by the generic validator through `references`.
    check_step_id_list(step, "branches", report, min_items=2)


def parallel_references(step: Mapping[str, Any]) -> dict[str, str]:
    branches = step.get("branches")
    if not isinstance(branches, list):
        return {}
    return {f"branches.{i}": sid for i, sid in enumerate(branches) if isinstance(sid, str)}


PARALLEL = StepType(
    name="parallel",
    lane="fast",
    validate=validate_parallel,
    built=False,
    app="workflows",
    references=parallel_references,
)


def validate_join(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("wait_for",))
    # Predecessors, not edges: they must exist but do not make the join reach them.
    check_step_id_list(step, "wait_for", report, check_exists=True)


JOIN = StepType(name="join", lane="fast", validate=validate_join, built=False, app="workflows")


STEP_TYPES = (SET, BRANCH, END, NOOP, WAIT_SIGNAL, PARALLEL, JOIN)


def register_step_types() -> None:
    for step_type in STEP_TYPES:
        registry.register(step_type)
