"""Validation of automation definitions (the JSON language documented in
docs/reference/definitions.md).

``validate_definition`` never raises, whatever shape its input has: it returns a list of
:class:`DefinitionIssue`, each with a stable ``code``, a message naming the step and the field,
and the ``step`` / ``field`` it is about.

``step`` is the step's id when the step has a valid one. Otherwise it is None and ``field``
is a path from the top of the definition (``steps.3.id``, ``steps.3.values.x``); for
top-level problems ``step`` is None and ``field`` names the top-level field (``start``,
``limits.max_age``) or is None for the definition as a whole.

This module checks the definition as a whole: its size, top-level fields and limits, step
ids, and the graph the steps form (unreachable steps, loops with no waiting step). The fields
common to every step (type, next, on_failure, name, retry) and the references between steps
are checked by :mod:`workflows.definitions.step_checks`, which also runs each step type's own
checks; step types check their fields with a :class:`StepReport`, using the helpers of
:mod:`workflows.definitions.fields` (``check_fields``, ``check_string`` ...), which report with
the right issue codes. The graph algorithms live in :mod:`workflows.definitions.graph`.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from workflows.definitions.fields import (
    STEP_ID_RULE,
    is_int,
    is_step_id,
    parse_duration,
    show,
    type_label,
)
from workflows.definitions.fork_shapes import fork_issues
from workflows.definitions.graph import shortest_cycle, strongly_connected_components
from workflows.definitions.personal_data import declaration_problems
from workflows.definitions.registry import Registry, StepType
from workflows.definitions.registry import registry as default_registry
from workflows.definitions.sagas import (
    SAGA_ISSUE_CODES,
    compensation_targets,
    saga_issues,
    saga_warnings,
)
from workflows.definitions.sandbox import definition_budget, template_limits
from workflows.definitions.step_checks import Edge, StepChecks
from workflows.definitions.storable import UNSTORABLE_REASON, unstorable_path

__all__ = [
    "ISSUE_CODES",
    "DefinitionIssue",
    "InvalidDefinition",
    "canonical_json",
    "definition_digest",
    "definition_warnings",
    "ensure_valid",
    "validate_definition",
]

DEFAULT_MAX_DEFINITION_BYTES = 262_144
DEFAULT_MAX_DEFINITION_STEPS = 500
MAX_STEPS_LIMIT = 100_000
MAX_LOOP_STEPS_SHOWN = 12

TOP_LEVEL_FIELDS = (
    "start", "steps", "limits", "description", "timer_spread", "personal_data",
)  # fmt: skip
LIMIT_FIELDS = ("max_steps", "max_age")

ISSUE_CODES = (
    "not_an_object",
    "unknown_field",
    "missing_field",
    "invalid_field",
    "definition_too_large",
    "too_many_steps",
    "duplicate_step_id",
    "invalid_step_id",
    "missing_step_id",
    "unknown_step_type",
    "unknown_step_reference",
    "unknown_outcome",
    "unreachable_step",
    "unbounded_loop",
    "malformed_template",
    "malformed_condition",
    "step_type_not_available",
    "invalid_limits",
    "template_too_large",
    "too_many_conditions",
    "join_shared",
    "branch_leaves_fork",
    "workflow_version_missing",  # a `code` step naming a workflow this process lacks
    "code_step_not_allowed",  # a `code` step in a definition the host did not publish
    *SAGA_ISSUE_CODES,
)


@dataclass(frozen=True)
class DefinitionIssue:
    code: str
    message: str
    step: str | None = None
    field: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"code": self.code, "message": self.message, "step": self.step, "field": self.field}


class InvalidDefinition(Exception):
    """Raised by :func:`ensure_valid`; ``issues`` lists every problem found."""

    SUMMARY_SIZE = 3

    def __init__(self, issues: Iterable[DefinitionIssue]) -> None:
        self.issues: list[DefinitionIssue] = list(issues)
        super().__init__(str(self))

    def __str__(self) -> str:
        if not self.issues:
            return "the definition is invalid"
        shown = "; ".join(issue.message for issue in self.issues[: self.SUMMARY_SIZE])
        more = len(self.issues) - self.SUMMARY_SIZE
        suffix = f" (and {more} more)" if more > 0 else ""
        return f"the definition is invalid: {shown}{suffix}"


# --- canonical form -------------------------------------------------------------------------


def canonical_json(definition: Any) -> str:
    """The canonical JSON text: sorted keys, no whitespace. Its UTF-8 length is the size."""
    return json.dumps(definition, sort_keys=True, separators=(",", ":"))


def definition_digest(definition: Any) -> str:
    """sha256 (hex) of the canonical JSON: equal for definitions differing in key order only."""
    return hashlib.sha256(canonical_json(definition).encode("utf-8")).hexdigest()


# --- the validator --------------------------------------------------------------------------


def _configured_limits(max_bytes: int | None, max_steps: int | None) -> tuple[int, int]:
    if max_bytes is not None and max_steps is not None:
        return max_bytes, max_steps
    try:
        waymark = getattr(settings, "WAYMARK", None) or {}
    except ImproperlyConfigured:
        waymark = {}
    if max_bytes is None:
        max_bytes = int(waymark.get("MAX_DEFINITION_BYTES", DEFAULT_MAX_DEFINITION_BYTES))
    if max_steps is None:
        max_steps = int(waymark.get("MAX_DEFINITION_STEPS", DEFAULT_MAX_DEFINITION_STEPS))
    return max_bytes, max_steps


class _Validation:
    def __init__(self, definition: object, registry: Registry, max_bytes: int, max_steps: int):
        self.definition = definition
        self.registry = registry
        self.max_bytes = max_bytes
        self.max_steps = max_steps
        self.issues: list[DefinitionIssue] = []
        # step id -> index of its first occurrence, in definition order
        self.ids: dict[str, int] = {}
        self.types: dict[str, StepType] = {}
        self.edges: dict[str, list[Edge]] = {}
        self.successors: dict[str, list[str]] = {}  # ordinary edges, once the graph is checked
        # Reads self.ids when a step is checked, after collect_ids has filled it.
        self.type_names: dict[str, str] = {}  # step id -> its `type`, for cross-step checks
        self.step_checks = StepChecks(registry, self.ids, self.at_step, self.type_names)

    # reporting

    def top(self, code: str, field: str | None, message: str) -> None:
        self.issues.append(DefinitionIssue(code, message, None, field))

    def at_step(
        self, code: str, sid: str | None, index: int, field: str | None, phrase: str
    ) -> None:
        """An issue about one step; ``phrase`` completes the sentence "<field> ..."."""
        where = f'step "{sid}"' if sid is not None else f"steps.{index}"
        text = f"{field} {phrase}" if field else phrase
        if sid is not None:
            self.issues.append(DefinitionIssue(code, f"{where}: {text}", sid, field))
        else:
            path = f"steps.{index}.{field}" if field else f"steps.{index}"
            self.issues.append(DefinitionIssue(code, f"{where}: {text}", None, path))

    # the run

    def run(self) -> list[DefinitionIssue]:
        if not self.check_size():
            return self.issues
        definition = self.definition
        unstorable = unstorable_path(definition)
        if unstorable is not None:
            self.top("invalid_field", unstorable, f"{unstorable} {UNSTORABLE_REASON}")
            return self.issues
        if not isinstance(definition, dict):
            self.top(
                "not_an_object",
                None,
                f"the definition must be a JSON object, not {type_label(definition)}",
            )
            return self.issues
        for key in definition:
            if key not in TOP_LEVEL_FIELDS:
                self.top(
                    "unknown_field",
                    str(key),
                    f"{show(str(key))} is not a definition field "
                    f"(fields: {', '.join(TOP_LEVEL_FIELDS)})",
                )
        description = definition.get("description")
        if "description" in definition and not isinstance(description, str):
            self.top("invalid_field", "description", "description must be a string")
        self.check_limits(definition.get("limits"), "limits" in definition)
        spread = definition.get("timer_spread")
        if (
            "timer_spread" in definition
            and spread not in ("0", "0s")
            and parse_duration(spread) is None
        ):
            self.top(
                "invalid_field",
                "timer_spread",
                'timer_spread must be a duration such as "10m", or "0s" for none',
            )

        if "personal_data" in definition:
            for code, field, message in declaration_problems(definition["personal_data"]):
                self.top(code, field, message)

        steps = definition.get("steps")
        if "steps" not in definition:
            self.top("missing_field", "steps", "steps is required: a list of steps")
            steps = None
        elif not isinstance(steps, list):
            self.top("invalid_field", "steps", f"steps must be a list, not {type_label(steps)}")
            steps = None
        elif not steps:
            self.top("invalid_field", "steps", "steps must list at least one step")
            steps = None
        elif len(steps) > self.max_steps:
            self.top(
                "too_many_steps",
                "steps",
                f"the definition has {len(steps)} steps; at most {self.max_steps} are allowed",
            )
            steps = None

        if steps is not None:
            self.collect_ids(steps)
        self.check_start(definition)
        if steps is None:
            return self.issues
        for index, step in enumerate(steps):
            if isinstance(step, dict):
                self.check_step(index, step)
        self.check_graph(definition)
        return self.issues

    def check_size(self) -> bool:
        try:
            text = canonical_json(self.definition)
        except (TypeError, ValueError, RecursionError) as exc:
            if isinstance(self.definition, dict):
                self.top("invalid_field", None, f"the definition is not plain JSON data: {exc}")
            else:
                self.top(
                    "not_an_object",
                    None,
                    f"the definition must be a JSON object, not {type_label(self.definition)}",
                )
            return False
        size = len(text.encode("utf-8"))
        if size > self.max_bytes:
            self.top(
                "definition_too_large",
                None,
                f"the definition is {size} bytes of canonical JSON; "
                f"at most {self.max_bytes} are allowed",
            )
            return False
        return True

    def check_limits(self, limits: object, present: bool) -> None:
        if not present:
            return
        if not isinstance(limits, dict):
            self.top("invalid_limits", "limits", "limits must be an object")
            return
        for key in limits:
            if key not in LIMIT_FIELDS:
                self.top(
                    "unknown_field",
                    f"limits.{key}",
                    f"limits.{key} is not a limit (limits: {', '.join(LIMIT_FIELDS)})",
                )
        if "max_steps" in limits:
            value = limits["max_steps"]
            if not is_int(value) or not 1 <= value <= MAX_STEPS_LIMIT:
                self.top(
                    "invalid_limits",
                    "limits.max_steps",
                    f"limits.max_steps must be a whole number from 1 to {MAX_STEPS_LIMIT}, "
                    f"not {show(value)}",
                )
        if "max_age" in limits and parse_duration(limits["max_age"]) is None:
            self.top(
                "invalid_limits",
                "limits.max_age",
                'limits.max_age must be a duration such as "30s", "15m", "12h" or '
                f'"30d" (at most 3650d), not {show(limits["max_age"])}',
            )

    def collect_ids(self, steps: list[Any]) -> None:
        for index, step in enumerate(steps):
            if not isinstance(step, dict):
                self.top(
                    "not_an_object",
                    f"steps.{index}",
                    f"steps.{index} must be an object, not {type_label(step)}",
                )
                continue
            if "id" not in step:
                self.at_step("missing_step_id", None, index, "id", "is required")
                continue
            sid = step["id"]
            if not is_step_id(sid):
                shown = show(sid) if isinstance(sid, str) else type_label(sid)
                self.at_step(
                    "invalid_step_id",
                    None,
                    index,
                    "id",
                    f"{shown} is not a valid step id ({STEP_ID_RULE})",
                )
                continue
            if sid in self.ids:
                self.at_step(
                    "duplicate_step_id",
                    sid,
                    index,
                    "id",
                    f"is also the id of steps.{self.ids[sid]}; step ids must be unique",
                )
                continue
            self.ids[sid] = index
            if isinstance(step.get("type"), str):
                self.type_names[sid] = step["type"]

    def check_start(self, definition: dict[Any, Any]) -> None:
        if "start" not in definition:
            self.top("missing_field", "start", "start is required: the id of the first step")
            return
        start = definition["start"]
        if not isinstance(start, str):
            self.top("invalid_field", "start", f"start must be a step id, not {type_label(start)}")
        elif self.ids and start not in self.ids:
            self.top(
                "unknown_step_reference", "start", f"start refers to unknown step {show(start)}"
            )

    def check_step(self, index: int, step: dict[Any, Any]) -> None:
        raw_id = step.get("id")
        sid = raw_id if is_step_id(raw_id) else None
        # A duplicate id is reported once; its other fields are checked under that id.
        owner = sid if sid is not None and self.ids.get(sid) == index else None

        step_type, edges = self.step_checks.check(index, sid, step)
        if owner is not None:
            if step_type is not None:
                self.types[owner] = step_type
            self.edges[owner] = edges

    # the graph

    def check_graph(self, definition: dict[Any, Any]) -> None:
        order = list(self.ids)  # definition order
        successors = {sid: [e.target for e in self.edges.get(sid, [])] for sid in order}
        self.successors = successors
        start = definition.get("start")
        steps = self.steps_by_id(definition)
        # Compensation steps are entered by the engine, not by an edge (sagas.py).
        compensations = compensation_targets(steps.values())
        if isinstance(start, str) and start in self.ids:
            reached = {start}
            queue = deque([start])
            while queue:
                for target in successors[queue.popleft()]:
                    if target not in reached:
                        reached.add(target)
                        queue.append(target)
            for sid in order:
                if sid not in reached and sid not in compensations:
                    self.issues.append(
                        DefinitionIssue(
                            "unreachable_step",
                            f'step "{sid}" cannot be reached from start "{start}" '
                            "by following next or any other step reference",
                            sid,
                            None,
                        )
                    )
        self.check_forks(definition, successors)
        start_id = start if isinstance(start, str) else None
        for saga in saga_issues(steps, successors, self.types, start_id):
            self.issues.append(DefinitionIssue(saga.code, saga.message, saga.step, saga.field))
        limits = definition.get("limits")
        if isinstance(limits, dict) and "max_steps" in limits:
            return  # an explicit step limit bounds every loop
        position = {sid: i for i, sid in enumerate(order)}
        loops = []
        for component in strongly_connected_components(order, successors):
            members = set(component)
            first = min(component, key=position.__getitem__)
            if len(component) == 1 and first not in successors[first]:
                continue
            if any(self.types[s].waits for s in component if s in self.types):
                continue
            loops.append((position[first], first, members))
        for _, first, members in sorted(loops, key=lambda loop: loop[0]):
            self.report_loop(first, members, successors, position)

    def steps_by_id(self, definition: dict[Any, Any]) -> dict[str, dict[str, Any]]:
        return {sid: definition["steps"][index] for sid, index in self.ids.items()}

    def check_forks(self, definition: dict[Any, Any], successors: dict[str, list[str]]) -> None:
        """Parallel shapes the engine cannot run as written (fork_shapes.py)."""
        steps = self.steps_by_id(definition)
        terminal = {sid for sid, step_type in self.types.items() if step_type.terminal}
        forking = {sid for sid, step_type in self.types.items() if step_type.forks}
        for issue in fork_issues(steps, successors, terminal, forking):
            self.issues.append(DefinitionIssue(issue.code, issue.message, issue.step, issue.field))

    def report_loop(
        self,
        first: str,
        members: set[str],
        successors: dict[str, list[str]],
        position: dict[str, int],
    ) -> None:
        cycle = shortest_cycle(first, members, successors)
        shown = [f'"{sid}"' for sid in cycle]
        if len(shown) > MAX_LOOP_STEPS_SHOWN:
            hidden = len(shown) - MAX_LOOP_STEPS_SHOWN + 1
            shown = [*shown[: MAX_LOOP_STEPS_SHOWN - 1], f"... ({hidden} more steps)"]
        path = " -> ".join([*shown, f'"{first}"'])
        extra = ""
        if len(members) > len(cycle):
            others = sorted(members - set(cycle), key=position.__getitem__)
            listed = ", ".join(f'"{sid}"' for sid in others[:MAX_LOOP_STEPS_SHOWN])
            if len(others) > MAX_LOOP_STEPS_SHOWN:
                listed += f" and {len(others) - MAX_LOOP_STEPS_SHOWN} more"
            extra = f" (the loop also passes through {listed})"
        second = cycle[1] if len(cycle) > 1 else first
        field = next((e.field for e in self.edges.get(first, []) if e.target == second), "next")
        self.issues.append(
            DefinitionIssue(
                "unbounded_loop",
                f"steps {path} form a loop with no waiting step{extra}: declare "
                "limits.max_steps to bound how many steps a run may take, or put a waiting "
                "step (such as wait, wait_signal or approval) in the loop",
                first,
                field,
            )
        )


def validate_definition(
    definition: object,
    *,
    max_bytes: int | None = None,
    max_steps: int | None = None,
    registry: Registry | None = None,
) -> list[DefinitionIssue]:
    """Every problem of ``definition``; [] when it is valid. Never raises on bad input.

    ``max_bytes`` / ``max_steps`` default to ``settings.WAYMARK["MAX_DEFINITION_BYTES"]`` /
    ``["MAX_DEFINITION_STEPS"]`` (262144 and 500 when unset).
    """
    max_bytes, max_steps = _configured_limits(max_bytes, max_steps)
    reg = registry if registry is not None else default_registry
    # All the templates and conditions of one definition share one parse budget (tokens).
    with definition_budget(template_limits().max_definition_template_tokens):
        return _Validation(definition, reg, max_bytes, max_steps).run()


def definition_warnings(
    definition: object, *, registry: Registry | None = None
) -> list[DefinitionIssue]:
    """What is allowed but probably wrong (never a reason to refuse the definition): an
    irreversible step followed by a step that can fail for good with no compensation
    (code ``irreversible_not_last``); a compensation reading the latest output of a step it
    undoes more than once (``ambiguous_compensation``). [] for a definition that is not
    valid."""
    reg = registry if registry is not None else default_registry
    validation = _Validation(definition, reg, *_configured_limits(None, None))
    with definition_budget(template_limits().max_definition_template_tokens):
        if validation.run():
            return []
    assert isinstance(definition, dict)
    steps = validation.steps_by_id(definition)
    return [
        DefinitionIssue(w.code, w.message, w.step, w.field)
        for w in saga_warnings(steps, validation.successors, validation.types)
    ]


def _unavailable_types(definition: object, registry: Registry) -> list[DefinitionIssue]:
    if not isinstance(definition, dict) or not isinstance(definition.get("steps"), list):
        return []
    issues = []
    for index, step in enumerate(definition["steps"]):
        if not isinstance(step, dict) or not isinstance(step.get("type"), str):
            continue
        step_type = registry.get(step["type"])
        if step_type is None or step_type.built:
            continue
        sid = step.get("id") if is_step_id(step.get("id")) else None
        where = f'step "{sid}"' if sid else f"steps.{index}"
        issues.append(
            DefinitionIssue(
                "step_type_not_available",
                f'{where}: type "{step_type.name}" cannot be published yet: the engine does not '
                f'run "{step_type.name}" steps yet',
                sid,
                "type" if sid else f"steps.{index}.type",
            )
        )
    return issues


def ensure_valid(
    definition: object,
    *,
    for_publish: bool = False,
    max_bytes: int | None = None,
    max_steps: int | None = None,
    registry: Registry | None = None,
) -> None:
    """Raises InvalidDefinition unless ``definition`` is valid.

    With ``for_publish`` it also refuses steps whose type the engine cannot run yet
    (``built=False``), with code ``step_type_not_available``.
    """
    issues = validate_definition(
        definition, max_bytes=max_bytes, max_steps=max_steps, registry=registry
    )
    stopped = any(
        i.code in ("definition_too_large", "not_an_object") and i.field is None for i in issues
    )
    if for_publish and not stopped:
        reg = registry if registry is not None else default_registry
        issues.extend(_unavailable_types(definition, reg))
    if issues:
        raise InvalidDefinition(issues)
