"""The checks of sagas: ``compensate`` and ``irreversible`` (docs/reference/definitions.md, "Sagas
and compensation").

A step's ``compensate`` names the step that undoes it. Compensation steps are entered only by
the engine, when the run would fail after their step completed, so they stand outside the
ordinary graph: not reachable from ``start``, with no ``next``, ``on_failure`` or compensation
of their own. The checks need the whole graph (what follows a step), so the validator calls
them after the steps were checked, with the ordinary edges it collected.

``irreversible: true`` on a step earns a *warning* (never an error) when a later step can fail
for good and has no compensation: the irreversible step cannot be undone then.

The engine compensates each completed *execution* (a step completed in three loop turns is
undone three times, and a compensation step shared by two steps runs for each of them), and a
compensation reads the execution it undoes as ``compensating``. A compensation that reads
``steps.<id>`` instead, for a step that can complete more than once or that shares it, reads
the latest execution's output each time: a *warning* (``ambiguous_compensation``).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from workflows.definitions.fields import show, type_label
from workflows.definitions.registry import INLINE, StepType

__all__ = ["SAGA_ISSUE_CODES", "SAGA_WARNING_CODES", "SagaIssue", "ambiguous_compensations",
           "compensation_targets", "irreversible_problem", "saga_issues",
           "saga_warnings"]  # fmt: skip

SAGA_ISSUE_CODES = (
    "compensation_unknown_step",
    "compensation_is_reachable",
    "compensation_refers_to_later_step",
    "invalid_compensation",
)
SAGA_WARNING_CODES = ("irreversible_not_last", "ambiguous_compensation")

# Fields a compensation step may not have: the engine decides what follows it.
NOT_ON_COMPENSATION = ("next", "on_failure", "compensate")


@dataclass(frozen=True)
class SagaIssue:
    code: str
    message: str
    step: str
    field: str | None


def compensation_targets(steps: Iterable[Mapping[str, Any]]) -> set[str]:
    """The ids named by some step's ``compensate`` (strings only)."""
    return {s["compensate"] for s in steps if isinstance(s.get("compensate"), str)}


def _reached(origins: Iterable[str], successors: Mapping[str, list[str]]) -> set[str]:
    """Every step reachable from ``origins`` by ordinary edges, the origins included."""
    seen = set(origins)
    queue = deque(seen)
    while queue:
        for target in successors.get(queue.popleft(), []):
            if target not in seen:
                seen.add(target)
                queue.append(target)
    return seen


def irreversible_problem(step: Mapping[str, Any]) -> str | None:
    """What is wrong with the step's ``irreversible`` (a phrase after the field's name), if
    anything: a definition's step and a code workflow's call are checked alike."""
    if "irreversible" in step and not isinstance(step["irreversible"], bool):
        return f"must be true or false, not {type_label(step['irreversible'])}"
    return None


def saga_issues(
    steps: Mapping[str, Mapping[str, Any]],
    successors: Mapping[str, list[str]],
    types: Mapping[str, StepType],
    start: str | None,
) -> list[SagaIssue]:
    """Errors of ``compensate`` and ``irreversible`` fields; ``steps`` by id (valid ids)."""
    issues: list[SagaIssue] = []
    from_start = _reached([start], successors) if start is not None and start in steps else set()
    for sid, step in steps.items():
        wrong = irreversible_problem(step)
        if wrong is not None:
            issues.append(SagaIssue("invalid_field", f'step "{sid}": irreversible {wrong}', sid,
                                    "irreversible"))  # fmt: skip
        if "compensate" not in step:
            continue
        target = step["compensate"]

        def issue(code: str, phrase: str) -> None:
            issues.append(SagaIssue(code, f'step "{sid}": compensate {phrase}', sid, "compensate"))  # noqa: B023

        if not isinstance(target, str) or target not in steps:
            shown = show(target) if isinstance(target, str) else type_label(target)
            issue("compensation_unknown_step", f"refers to unknown step {shown}")
        elif target == sid or target in _reached(successors.get(sid, []), successors):
            issue("compensation_refers_to_later_step",
                  f"refers to {show(target)}, a step the run reaches after {show(sid)}: a "
                  "compensation is a step of its own, outside the run's path")  # fmt: skip
        elif target in from_start:
            issue("compensation_is_reachable",
                  f"refers to {show(target)}, which the run reaches from start as an ordinary "
                  "step: a compensation step is entered only to compensate")  # fmt: skip
    for target in sorted(compensation_targets(steps.values()) & set(steps)):
        step, step_type = steps[target], types.get(target)
        for field in NOT_ON_COMPENSATION:
            if field in step:
                issues.append(SagaIssue("invalid_compensation", f'step "{target}" compensates '
                              f"another step, so it may not have {field}: the engine enters "
                              "the next compensation after it", target, field))  # fmt: skip
        if step_type is not None and (step_type.terminal or step_type.forks):
            issues.append(SagaIssue("invalid_compensation", f'step "{target}" compensates '
                          f'another step, so it cannot be a "{step_type.name}" step',
                          target, "type"))  # fmt: skip
    return issues


def can_fail_for_good(step: Mapping[str, Any], step_type: StepType | None) -> bool:
    """Whether the step can fail the run: worker work (attempts run out), or an ``end`` that
    fails it; a step with its own failure path does not fail the run."""
    if step.get("on_failure"):
        return False
    if step_type is None:
        return False
    return step_type.lane != INLINE or (step_type.terminal and step.get("status") == "failed")


def _strings(value: Any) -> Iterable[str]:
    """Every string inside a step's fields (where its templates are)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _reads_output_of(step: Mapping[str, Any], target: str) -> bool:
    """Whether a template of ``step`` reads ``steps.<target>`` (dotted or subscripted)."""
    name = re.escape(target)
    pattern = re.compile(rf"\bsteps\s*(?:\.\s*{name}\b|\[\s*['\"]{name}['\"]\s*\])")
    return any(pattern.search(text) for text in _strings(step))


def ambiguous_compensations(
    steps: Mapping[str, Mapping[str, Any]], successors: Mapping[str, list[str]]
) -> list[SagaIssue]:
    """A compensation that reads ``steps.<id>`` of a step it undoes more than once (a step
    on a loop, or one of several steps sharing it): each run of it reads the latest output."""
    undone: dict[str, list[str]] = {}
    for sid, step in steps.items():
        if isinstance(step.get("compensate"), str) and step["compensate"] in steps:
            undone.setdefault(step["compensate"], []).append(sid)
    warnings: list[SagaIssue] = []
    for target, sources in sorted(undone.items()):
        for sid in sources:
            looped = sid in _reached(successors.get(sid, []), successors)
            if not (looped or len(sources) > 1) or not _reads_output_of(steps[target], sid):
                continue
            others = ", ".join(show(s) for s in sources if s != sid)
            why = "can complete more than once (a loop)" if looped else f"shares it with {others}"
            warnings.append(SagaIssue("ambiguous_compensation", f'step "{target}" undoes each '
                            f'completed execution of "{sid}", which {why}, but reads '
                            f"steps.{sid}: the latest execution's output, each time. Read "
                            "compensating.output, the output of the execution it undoes",
                            target, None))  # fmt: skip
    return warnings


def saga_warnings(
    steps: Mapping[str, Mapping[str, Any]],
    successors: Mapping[str, list[str]],
    types: Mapping[str, StepType],
) -> list[SagaIssue]:
    """An irreversible step followed by a step that can fail for good without compensation;
    an ambiguous compensation (``ambiguous_compensations``)."""
    warnings: list[SagaIssue] = []
    for sid, step in steps.items():
        if step.get("irreversible") is not True:
            continue
        later = _reached(successors.get(sid, []), successors) - {sid}
        risky = sorted(
            t for t in later
            if "compensate" not in steps[t] and can_fail_for_good(steps[t], types.get(t))
        )  # fmt: skip
        if risky:
            shown = ", ".join(show(t) for t in risky)
            warnings.append(SagaIssue("irreversible_not_last", f'step "{sid}" is irreversible, '
                            f"but later steps can fail for good with no compensation ({shown}): "
                            "order steps so irreversible ones come last, or give those steps a "
                            "compensation", sid, "irreversible"))  # fmt: skip
    return warnings + ambiguous_compensations(steps, successors)
