"""The checks of one step's generic fields, for :mod:`workflows.definitions.validator`.

Every step, whatever its type, has a ``type`` and may have a ``name``, ``retry``, ``next`` and
``on_failure``. :class:`StepChecks` checks those fields, then hands the step to its type's own
``validate`` (with an :class:`IssueReport`) and ``references``, turning any crash in the
type's code into an issue. It returns the step's type and the :class:`Edge` list of the steps
it refers to, from which the validator builds the graph.

It records issues through the validator's ``at_step`` callback, so the issue format and the
issue list stay the validator's. This module must not import the validator: the validator
imports it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from workflows.definitions.fields import is_int, show, type_label
from workflows.definitions.registry import Registry, StepReport, StepType
from workflows.definitions.sandbox import LIMIT_MARK, template_limits

logger = logging.getLogger(__name__)

__all__ = ["Edge", "IssueReport", "StepChecks", "StepIssueSink"]

MAX_NAME_LENGTH = 200
MAX_RETRY_ATTEMPTS = 100

# Records an issue about one step: (code, step id or None, index in steps, field or None,
# phrase completing the sentence "<field> ...").
StepIssueSink = Callable[[str, str | None, int, str | None, str], None]


class IssueReport(StepReport):
    """The StepReport the validator hands to step types, with every step id of the
    definition in ``step_ids`` for fields naming other steps, and the names of the types
    that declare ``joins`` in ``joining`` (where a forking type's ``next`` may lead)."""

    of_definition = True

    def __init__(
        self,
        step_id: str,
        *,
        step_ids: Collection[str] = (),
        step_types: Mapping[str, str] | None = None,
        joining: Collection[str] = (),
    ) -> None:
        super().__init__(step_id)
        self.step_ids = frozenset(step_ids)
        self.step_types = dict(step_types or {})  # step id -> its type name, when valid
        self.joining = list(joining)

    def issue(self, code: str, field_path: str, message: str) -> None:
        # A template or condition over a limit (its message names the limit) gets its own
        # code, whichever check reported it.
        if code in ("malformed_template", "malformed_condition") and LIMIT_MARK in message:
            code = "template_too_large"
        super().issue(code, field_path, message)


@dataclass
class Edge:
    """A reference from one step to step ``target``, made by the step's field ``field``."""

    target: str
    field: str


class StepChecks:
    """Checks the steps of one definition.

    ``ids`` maps every valid step id to the index of its first occurrence; it is read when a
    step is checked, so it may be filled after construction, as long as that happens before
    the first :meth:`check`.
    """

    def __init__(
        self,
        registry: Registry,
        ids: Mapping[str, int],
        at_step: StepIssueSink,
        type_names: Mapping[str, str] | None = None,
    ):
        self.registry = registry
        self.ids = ids
        self.at_step = at_step
        self.type_names = type_names if type_names is not None else {}

    def check(
        self, index: int, sid: str | None, step: dict[Any, Any]
    ) -> tuple[StepType | None, list[Edge]]:
        """Checks ``steps[index]`` (whose valid id is ``sid``, if any); returns its type when
        known and the edges to the existing steps it refers to."""
        step_type = self.check_type(index, sid, step)
        self.check_name(index, sid, step)
        self.check_retry(index, sid, step, step_type)
        edges = self.check_next(index, sid, step, step_type)
        edges.extend(self.check_on_failure(index, sid, step, step_type))
        if step_type is not None and self.check_condition_count(index, sid, step):
            edges.extend(self.run_type_checks(index, sid, step, step_type))
        return step_type, edges

    def check_condition_count(self, index: int, sid: str | None, step: dict[Any, Any]) -> bool:
        """A step's conditions (the cases of ``when``) are capped before any is parsed: each
        one is parsed when the definition is checked and may be evaluated on every pass.
        False (the step type's own checks are skipped) when there are too many."""
        cases = step.get("when")
        limit = template_limits().max_branch_conditions
        if isinstance(cases, list) and len(cases) > limit:
            self.at_step(
                "too_many_conditions", sid, index, "when",
                f"has {len(cases)} conditions {LIMIT_MARK}MAX_BRANCH_CONDITIONS: {limit})",
            )  # fmt: skip
            return False
        return True

    def check_type(self, index: int, sid: str | None, step: dict[Any, Any]) -> StepType | None:
        if "type" not in step:
            self.at_step("missing_field", sid, index, "type", "is required")
            return None
        name = step["type"]
        if not isinstance(name, str):
            self.at_step(
                "invalid_field", sid, index, "type", f"must be a string, not {type_label(name)}"
            )
            return None
        step_type = self.registry.get(name)
        if step_type is None:
            known = ", ".join(self.registry.names())
            self.at_step(
                "unknown_step_type",
                sid,
                index,
                "type",
                f"{show(name)} is not a known step type (known: {known})",
            )
        return step_type

    def check_name(self, index: int, sid: str | None, step: dict[Any, Any]) -> None:
        if "name" not in step:
            return
        name = step["name"]
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_LENGTH:
            self.at_step(
                "invalid_field",
                sid,
                index,
                "name",
                f"must be a non-empty string of at most {MAX_NAME_LENGTH} characters",
            )

    def check_retry(
        self, index: int, sid: str | None, step: dict[Any, Any], step_type: StepType | None
    ) -> None:
        if "retry" not in step:
            return
        if step_type is not None and step_type.lane == "inline":
            self.at_step(
                "unknown_field",
                sid,
                index,
                "retry",
                f'is not allowed on a "{step_type.name}" step: it runs inside the walk '
                "and is never retried",
            )
            return
        retry = step["retry"]
        if not isinstance(retry, dict):
            self.at_step(
                "invalid_field",
                sid,
                index,
                "retry",
                'must be an object such as {"max_attempts": 3}',
            )
            return
        for key in retry:
            if key != "max_attempts":
                self.at_step(
                    "unknown_field",
                    sid,
                    index,
                    f"retry.{key}",
                    "is not a retry field (fields: max_attempts)",
                )
        if "max_attempts" not in retry:
            self.at_step("missing_field", sid, index, "retry.max_attempts", "is required")
            return
        attempts = retry["max_attempts"]
        if not is_int(attempts) or not 1 <= attempts <= MAX_RETRY_ATTEMPTS:
            self.at_step(
                "invalid_field",
                sid,
                index,
                "retry.max_attempts",
                f"must be a whole number from 1 to {MAX_RETRY_ATTEMPTS}, not {show(attempts)}",
            )

    def reference(self, index: int, sid: str | None, field: str, target: object) -> Edge | None:
        """Checks one field naming another step; returns the edge when the step exists."""
        if not isinstance(target, str):
            self.at_step(
                "invalid_field", sid, index, field, f"must be a step id, not {type_label(target)}"
            )
            return None
        if target not in self.ids:
            self.at_step(
                "unknown_step_reference",
                sid,
                index,
                field,
                f"refers to unknown step {show(target)}",
            )
            return None
        return Edge(target, field)

    def check_next(
        self, index: int, sid: str | None, step: dict[Any, Any], step_type: StepType | None
    ) -> list[Edge]:
        if "next" not in step:
            return []
        nxt = step["next"]
        if step_type is not None and step_type.terminal:
            self.at_step(
                "invalid_field",
                sid,
                index,
                "next",
                f'is not allowed: an "{step_type.name}" step ends the run',
            )
            return []
        if isinstance(nxt, str):
            edge = self.reference(index, sid, "next", nxt)
            return [edge] if edge else []
        if not isinstance(nxt, dict):
            self.at_step(
                "invalid_field",
                sid,
                index,
                "next",
                f"must be a step id or an object mapping outcomes to step ids, "
                f"not {type_label(nxt)}",
            )
            return []
        outcomes: frozenset[str] | None = None
        type_name = step_type.name if step_type is not None else ""
        if step_type is not None and step_type.outcomes is None:
            self.at_step(
                "invalid_field",
                sid,
                index,
                "next",
                f'must be a single step id: a "{step_type.name}" step has no outcomes',
            )
            # The targets are still checked and followed, so one mistake gives one issue.
        elif step_type is not None and step_type.outcomes is not None:
            outcomes = self.call_type(index, sid, step_type, "outcomes", step_type.outcomes, step)
        edges: list[Edge] = []
        for key, target in nxt.items():
            field = f"next.{key}"
            if outcomes is not None and key not in outcomes:
                self.at_step(
                    "unknown_outcome",
                    sid,
                    index,
                    field,
                    f'is not an outcome of a "{type_name}" step '
                    f"(outcomes: {', '.join(sorted(outcomes)) or 'none'})",
                )
            edge = self.reference(index, sid, field, target)
            if edge:
                edges.append(edge)
        return edges

    def check_on_failure(
        self, index: int, sid: str | None, step: dict[Any, Any], step_type: StepType | None
    ) -> list[Edge]:
        """``on_failure``: the step to enter when this one fails for good (else the run fails)."""
        if "on_failure" not in step:
            return []
        if step_type is not None and step_type.terminal:
            self.at_step(
                "invalid_field", sid, index, "on_failure",
                f'is not allowed: an "{step_type.name}" step ends the run',
            )  # fmt: skip
            return []
        edge = self.reference(index, sid, "on_failure", step["on_failure"])
        return [edge] if edge else []

    def call_type(
        self,
        index: int,
        sid: str | None,
        step_type: StepType,
        what: str,
        func: Callable[..., Any],
        *args: Any,
    ) -> Any:
        """Calls a step type's own code; a crash there becomes an issue, not an exception."""
        try:
            return func(*args)
        except Exception:
            logger.exception("step type %r: %s raised", step_type.name, what)
            self.at_step(
                "invalid_field",
                sid,
                index,
                None,
                f'could not be checked: the "{step_type.name}" step type failed ({what})',
            )
            return None

    def run_type_checks(
        self, index: int, sid: str | None, step: dict[Any, Any], step_type: StepType
    ) -> list[Edge]:
        """The step type's own ``validate`` and ``references``; returns the edges of the
        references that name existing steps."""
        report = IssueReport(
            sid or f"steps.{index}", step_ids=self.ids.keys(), step_types=self.type_names,
            joining=self.registry.joining(),
        )  # fmt: skip
        self.call_type(index, sid, step_type, "validate", step_type.validate, step, report)
        for code, field, message in report.issues:
            self.at_step(code, sid, index, field or None, message)
        refs = self.call_type(index, sid, step_type, "references", step_type.references, step)
        edges: list[Edge] = []
        if isinstance(refs, Mapping):
            for field, target in refs.items():
                edge = self.reference(index, sid, str(field), target)
                if edge:
                    edges.append(edge)
        return edges
