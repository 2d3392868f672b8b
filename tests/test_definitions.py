"""The definition language: validation, step types, templates and the sandbox.

Pure unit tests: no database. They register the step types themselves (idempotent), so they
also run without the Django plugin.
"""

from __future__ import annotations

import copy
import json
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from approvals.steptypes import register_step_types as register_approvals
from effects.steptypes import register_step_types as register_effects
from timers.steptypes import is_time_zone
from timers.steptypes import register_step_types as register_timers
from workflows.definitions.expressions import (
    MAX_OUTPUT_BYTES,
    ExpressionError,
    build_context,
    check_condition,
    check_template,
    check_templates_in,
    evaluate_condition,
    render_template,
    render_value,
)
from workflows.definitions.fields import parse_duration
from workflows.definitions.graph import strongly_connected_components
from workflows.definitions.registry import Registry, StepReport, StepType, registry
from workflows.definitions.step_checks import IssueReport
from workflows.definitions.validator import (
    DEFAULT_MAX_DEFINITION_BYTES,
    DEFAULT_MAX_DEFINITION_STEPS,
    ISSUE_CODES,
    DefinitionIssue,
    InvalidDefinition,
    canonical_json,
    definition_digest,
    ensure_valid,
    validate_definition,
)
from workflows.steptypes import register_step_types as register_workflows

for _register in (register_workflows, register_timers, register_effects, register_approvals):
    _register()

EXAMPLE: dict[str, Any] = {
    "start": "greet",
    "limits": {"max_steps": 200, "max_age": "30d"},
    "steps": [
        {
            "id": "greet",
            "type": "set",
            "values": {"greeting": "Hello {{ input.name }}"},
            "next": "route",
        },
        {
            "id": "route",
            "type": "branch",
            "when": [{"outcome": "vip", "if": "input.tier == 'gold'"}],
            "next": {"vip": "thank", "default": "done"},
        },
        {
            "id": "thank",
            "type": "http",
            "request": {
                "method": "POST",
                "url": "https://example.com/{{ input.id }}",
                "body": {"text": "{{ vars.greeting }}"},
            },
            "next": "done",
        },
        {"id": "done", "type": "end"},
    ],
}


def example() -> dict[str, Any]:
    return copy.deepcopy(EXAMPLE)


def step(definition: dict[str, Any], step_id: str) -> dict[str, Any]:
    return next(s for s in definition["steps"] if s["id"] == step_id)


def triples(issues: list[DefinitionIssue]) -> list[tuple[str, str | None, str | None]]:
    return [(issue.code, issue.step, issue.field) for issue in issues]


def only(definition: object, **kwargs: Any) -> tuple[str, str | None, str | None]:
    issues = validate_definition(definition, **kwargs)
    assert len(issues) == 1, issues
    return triples(issues)[0]


def chain(count: int, step_type: str = "noop") -> dict[str, Any]:
    steps: list[dict[str, Any]] = [
        {"id": f"s{i}", "type": step_type, "next": f"s{i + 1}"} for i in range(count - 1)
    ]
    steps.append({"id": f"s{count - 1}", "type": "end"})
    return {"start": "s0", "steps": steps}


def configured(key: str, default: int) -> int:
    from django.conf import settings

    if not settings.configured:
        return default
    return int(getattr(settings, "WAYMARK", {}).get(key, default))


# --- the registry ---------------------------------------------------------------------------


def test_every_step_type_is_registered_with_its_lane_and_flags() -> None:
    expected = {
        # name: (lane, waits, terminal, built, app)
        "set": ("inline", False, False, True, "workflows"),
        "branch": ("inline", False, False, True, "workflows"),
        "end": ("inline", False, True, True, "workflows"),
        "noop": ("io", False, False, True, "workflows"),
        "wait_signal": ("inline", True, False, True, "workflows"),
        "parallel": ("inline", False, False, True, "workflows"),
        "join": ("inline", False, False, True, "workflows"),
        "wait": ("inline", True, False, True, "timers"),
        "wait_until": ("inline", True, False, True, "timers"),
        "http": ("io", False, False, True, "effects"),
        "email": ("io", False, False, True, "effects"),
        "slack_message": ("io", False, False, True, "effects"),
        "model": ("slow", False, False, True, "effects"),
        "crm_upsert": ("io", False, False, True, "effects"),
        "approval": ("human", True, False, True, "approvals"),
        "task": ("human", True, False, True, "approvals"),
        "code": ("io", False, False, True, "workflows"),
        "code_result": ("inline", False, False, True, "workflows"),
    }
    # The tests' own types (tests/probe_steps.py's `probe`) are not Waymark's.
    assert [t.name for t in registry if t.app != "tests"] == sorted(expected)
    for name, flags in expected.items():
        t = registry.get(name)
        assert t is not None
        assert (t.lane, t.waits, t.terminal, t.built, t.app) == flags, name


def test_registering_again_is_idempotent() -> None:
    before = registry.names()
    for register in (register_workflows, register_timers, register_effects, register_approvals):
        register()
    assert registry.names() == before


def test_outcomes_of_each_type() -> None:
    def outcomes(name: str, step_dict: dict[str, Any]) -> set[str] | None:
        t = registry.get(name)
        assert t is not None
        return None if t.outcomes is None else set(t.outcomes(step_dict))

    assert outcomes(
        "branch", {"when": [{"outcome": "a", "if": "true"}, {"outcome": "b", "if": "false"}]}
    ) == {"a", "b", "default"}
    assert outcomes("branch", {"when": "nonsense"}) == {"default"}
    assert outcomes("wait_signal", {}) == {"received", "timed_out"}
    assert outcomes("approval", {}) == {"approved", "rejected", "timed_out"}
    for effect in ("http", "model", "crm_upsert"):
        assert outcomes(effect, {}) == {"ok", "failed"}
    for contact in ("email", "slack_message"):  # they contact a person
        assert outcomes(contact, {}) == {"ok", "failed", "suppressed"}
    for plain in ("set", "end", "noop", "parallel", "join", "wait", "wait_until"):
        assert outcomes(plain, {}) is None


# --- valid definitions ----------------------------------------------------------------------


def test_the_example_is_valid() -> None:
    assert validate_definition(example()) == []
    ensure_valid(example())  # does not raise


def test_a_definition_using_every_step_type_is_valid() -> None:
    definition = {
        "start": "init",
        "description": "every step type once",
        "steps": [
            {"id": "init", "type": "set", "name": "Init", "values": {"n": 1}, "next": "fan"},
            {"id": "fan", "type": "parallel", "branches": ["left", "right"], "next": "merge"},
            {"id": "left", "type": "noop", "output": {"side": "left"}, "next": "merge"},
            {
                "id": "right",
                "type": "wait_signal",
                "signal": "order.paid",
                "correlation": "{{ input.order_id }}",
                "timeout": "2d",
                "next": {"received": "merge", "timed_out": "merge"},
            },
            {"id": "merge", "type": "join", "wait_for": ["left", "right"], "next": "pause"},
            {"id": "pause", "type": "wait", "duration": "15m", "next": "monday"},
            {
                "id": "monday",
                "type": "wait_until",
                "rule": {"weekdays": ["mon", "thu"], "time": "09:30"},
                "timezone": "UTC",
                "spread": "10m",
                "next": "tomorrow",
            },
            {
                "id": "tomorrow",
                "type": "wait_until",
                "at": "{{ input.when }}",
                "next": "call",
            },
            {
                "id": "call",
                "type": "http",
                "retry": {"max_attempts": 5},
                "request": {
                    "method": "GET",
                    "url": "{{ input.base_url }}/status",
                    "headers": {"Authorization": "Bearer {{ input.token }}"},
                },
                "connection": "crm",
                "next": {"ok": "mail", "failed": "failed"},
            },
            {
                "id": "mail",
                "type": "email",
                "to": "{{ input.email }}",
                "subject": "Hi",
                "body": "Dear {{ input.name }},\n",
                "connection": "mail",
                "next": "chat",
            },
            {
                "id": "chat",
                "type": "slack_message",
                "channel": "#ops",
                "text": "done",
                "connection": "slack",
                "next": "ask",
            },
            {
                "id": "ask",
                "type": "approval",
                "approvers": ["alice@example.com"],
                "message": "Approve {{ input.order_id }}?",
                "deadline": "3d",
                "on_timeout": "escalate",
                "next": {"approved": "think", "rejected": "failed", "timed_out": "failed"},
            },
            {
                "id": "think",
                "type": "model",
                "prompt": "Summarise {{ steps.call.output }}",
                "model": "small",
                "max_tokens": 500,
                "budget": 0.25,
                "connection": "llm",
                "next": "crm",
            },
            {
                "id": "crm",
                "type": "crm_upsert",
                "connection": "crm",
                "object": "contacts",
                "external_id": "{{ input.email }}",
                "fields": {"summary": "{{ steps.think.output.text }}"},
                "next": "done",
            },
            {"id": "done", "type": "end", "output": {"summary": "{{ steps.think.output }}"}},
            {"id": "failed", "type": "end", "status": "failed"},
        ],
    }
    assert validate_definition(definition) == []


def test_a_missing_next_on_a_non_terminal_step_is_allowed() -> None:
    definition = {"start": "a", "steps": [{"id": "a", "type": "set", "values": {"x": 1}}]}
    assert validate_definition(definition) == []


def test_a_plain_string_next_on_a_type_with_outcomes_is_allowed() -> None:
    definition = example()
    step(definition, "thank")["next"] = "done"
    assert validate_definition(definition) == []


# --- each issue code ------------------------------------------------------------------------


def test_not_an_object() -> None:
    assert only([]) == ("not_an_object", None, None)
    definition = example()
    definition["steps"].insert(1, "greet")
    assert only(definition) == ("not_an_object", None, "steps.1")


def test_unknown_field_at_top_level_on_a_step_and_nested() -> None:
    definition = example()
    definition["owner"] = "me"
    assert only(definition) == ("unknown_field", None, "owner")

    definition = example()
    step(definition, "greet")["colour"] = "red"
    issues = validate_definition(definition)
    assert triples(issues) == [("unknown_field", "greet", "colour")]
    assert issues[0].message == (
        'step "greet": colour is not a field of a "set" step (its fields: values)'
    )

    definition = example()
    step(definition, "thank")["request"]["verb"] = "GET"
    assert only(definition) == ("unknown_field", "thank", "request.verb")

    definition = example()
    definition["limits"]["max_runs"] = 3
    assert only(definition) == ("unknown_field", None, "limits.max_runs")


def test_retry_is_refused_on_fast_steps_and_checked_elsewhere() -> None:
    definition = example()
    step(definition, "greet")["retry"] = {"max_attempts": 3}
    assert only(definition) == ("unknown_field", "greet", "retry")

    definition = example()
    step(definition, "thank")["retry"] = {"max_attempts": 0}
    assert only(definition) == ("invalid_field", "thank", "retry.max_attempts")

    definition = example()
    step(definition, "thank")["retry"] = {}
    assert only(definition) == ("missing_field", "thank", "retry.max_attempts")


def test_missing_field() -> None:
    definition = example()
    del definition["start"]
    assert only(definition) == ("missing_field", None, "start")

    definition = example()
    del step(definition, "greet")["values"]
    assert only(definition) == ("missing_field", "greet", "values")

    definition = example()
    del step(definition, "thank")["type"]
    assert ("missing_field", "thank", "type") in triples(validate_definition(definition))


def test_branch_must_map_default_and_every_condition() -> None:
    definition = example()
    del step(definition, "route")["next"]["default"]
    issues = validate_definition(definition)
    assert triples(issues) == [("missing_field", "route", "next.default")]
    assert issues[0].message == 'step "route": next.default is required'

    definition = example()
    step(definition, "route")["when"].append({"outcome": "big", "if": "input.total > 100"})
    assert only(definition) == ("missing_field", "route", "next.big")

    definition = example()
    step(definition, "route")["next"] = "done"
    assert triples(validate_definition(definition)) == [
        ("invalid_field", "route", "next"),
        ("unreachable_step", "thank", None),  # the plain next is still followed
    ]

    definition = example()
    step(definition, "route")["when"] = []
    assert ("invalid_field", "route", "when") in triples(validate_definition(definition))


def test_invalid_field() -> None:
    definition = example()
    step(definition, "thank")["request"]["method"] = "FETCH"
    assert only(definition) == ("invalid_field", "thank", "request.method")

    definition = example()
    step(definition, "done")["next"] = "greet"
    assert only(definition) == ("invalid_field", "done", "next")

    definition = example()
    step(definition, "greet")["next"] = {"x": "route"}
    assert only(definition) == ("invalid_field", "greet", "next")

    definition = example()
    step(definition, "thank")["request"]["url"] = "ftp://example.com"
    assert only(definition) == ("invalid_field", "thank", "request.url")

    definition = example()
    step(definition, "done")["status"] = "crashed"
    assert only(definition) == ("invalid_field", "done", "status")

    definition = example()
    step(definition, "greet")["values"] = {"1st": "x"}
    assert only(definition) == ("invalid_field", "greet", "values.1st")

    definition = example()
    definition["description"] = 5
    assert only(definition) == ("invalid_field", None, "description")


def test_definition_too_large_stops_validation() -> None:
    definition = example()
    definition["owner"] = "unknown field that would otherwise be reported"
    size = len(canonical_json(definition).encode())
    issues = validate_definition(definition, max_bytes=size - 1)
    assert triples(issues) == [("definition_too_large", None, None)]
    assert str(size) in issues[0].message
    assert triples(validate_definition(definition, max_bytes=size)) == [
        ("unknown_field", None, "owner")
    ]


def test_definition_too_large_with_the_configured_limit() -> None:
    limit = configured("MAX_DEFINITION_BYTES", DEFAULT_MAX_DEFINITION_BYTES)
    definition = example()
    definition["description"] = "x" * limit
    assert only(definition) == ("definition_too_large", None, None)


def test_too_many_steps() -> None:
    assert only(chain(4), max_steps=3) == ("too_many_steps", None, "steps")
    assert validate_definition(chain(3), max_steps=3) == []


def test_duplicate_step_id() -> None:
    definition = example()
    definition["steps"].append({"id": "greet", "type": "end"})
    issues = validate_definition(definition)
    assert triples(issues) == [("duplicate_step_id", "greet", "id")]
    assert "steps.0" in issues[0].message


def test_invalid_and_missing_step_ids() -> None:
    definition: dict[str, Any] = {
        "start": "a",
        "steps": [{"id": "a", "type": "set", "values": {"x": 1}}],
    }
    definition["steps"].append({"id": "Bad-Id", "type": "end"})
    definition["steps"].append({"type": "end"})
    definition["steps"].append({"id": 7, "type": "end"})
    definition["steps"].append({"id": "a" * 64, "type": "end"})
    assert triples(validate_definition(definition)) == [
        ("invalid_step_id", None, "steps.1.id"),
        ("missing_step_id", None, "steps.2.id"),
        ("invalid_step_id", None, "steps.3.id"),
        ("invalid_step_id", None, "steps.4.id"),
    ]


def test_problems_of_a_step_without_a_valid_id_name_its_position() -> None:
    definition = example()
    definition["steps"].append({"id": "Oops", "type": "set", "values": {"x": "{{ input.x"}})
    issues = validate_definition(definition)
    assert triples(issues) == [
        ("invalid_step_id", None, "steps.4.id"),
        ("malformed_template", None, "steps.4.values.x"),
    ]
    assert issues[1].message.startswith("steps.4: values.x is not a valid template")


def test_unknown_step_type() -> None:
    definition = example()
    step(definition, "thank")["type"] = "htp"
    issues = validate_definition(definition)
    assert triples(issues) == [("unknown_step_type", "thank", "type")]
    assert '"htp" is not a known step type' in issues[0].message
    assert "http" in issues[0].message


def test_unknown_step_reference_in_next_with_a_precise_message() -> None:
    definition = example()
    step(definition, "route")["next"]["vip"] = "thnk"
    issues = validate_definition(definition)
    assert ("unknown_step_reference", "route", "next.vip") in triples(issues)
    message = next(i.message for i in issues if i.code == "unknown_step_reference")
    assert message == 'step "route": next.vip refers to unknown step "thnk"'


def test_unknown_step_reference_in_start_and_in_references() -> None:
    definition = example()
    definition["start"] = "hello"
    issues = validate_definition(definition)
    assert triples(issues) == [("unknown_step_reference", None, "start")]
    assert issues[0].message == 'start refers to unknown step "hello"'

    definition = {
        "start": "fan",
        "steps": [
            {"id": "fan", "type": "parallel", "branches": ["a", "zzz"], "next": "j"},
            {"id": "a", "type": "noop", "next": "j"},
            {"id": "j", "type": "join", "wait_for": ["a", "nope"]},
        ],
    }
    assert triples(validate_definition(definition)) == [
        ("unknown_step_reference", "fan", "branches.1"),
        ("unknown_step_reference", "j", "wait_for.1"),
    ]


def test_unknown_outcome() -> None:
    definition = example()
    step(definition, "thank")["next"] = {"ok": "done", "maybe": "done"}
    issues = validate_definition(definition)
    assert triples(issues) == [("unknown_outcome", "thank", "next.maybe")]
    assert issues[0].message == (
        'step "thank": next.maybe is not an outcome of a "http" step (outcomes: failed, ok)'
    )

    definition = example()
    step(definition, "route")["next"]["gold"] = "done"
    assert only(definition) == ("unknown_outcome", "route", "next.gold")


def test_unreachable_step() -> None:
    definition = example()
    definition["steps"].append({"id": "orphan", "type": "end"})
    issues = validate_definition(definition)
    assert triples(issues) == [("unreachable_step", "orphan", None)]
    assert '"orphan"' in issues[0].message
    assert '"greet"' in issues[0].message


def test_parallel_branches_count_as_reachable() -> None:
    definition = {
        "start": "fan",
        "steps": [
            {"id": "fan", "type": "parallel", "branches": ["a", "b"]},
            {"id": "a", "type": "noop", "next": "j"},
            {"id": "b", "type": "noop", "next": "j"},
            {"id": "j", "type": "join", "wait_for": ["a", "b"]},
        ],
    }
    assert validate_definition(definition) == []


def test_malformed_template_names_the_exact_nested_path() -> None:
    definition = example()
    step(definition, "thank")["request"]["body"] = {"items": ["{{ input.x ", "ok"]}
    issues = validate_definition(definition)
    assert triples(issues) == [("malformed_template", "thank", "request.body.items.0")]
    assert issues[0].message.startswith(
        'step "thank": request.body.items.0 is not a valid template:'
    )

    definition = example()
    step(definition, "greet")["values"]["greeting"] = "{% if input.x %}unclosed"
    assert only(definition) == ("malformed_template", "greet", "values.greeting")


def test_templates_may_only_use_the_context_names() -> None:
    definition = example()
    step(definition, "greet")["values"]["greeting"] = "{{ settings.SECRET_KEY }}"
    issues = validate_definition(definition)
    assert triples(issues) == [("malformed_template", "greet", "values.greeting")]
    assert '"settings"' in issues[0].message


def test_malformed_condition() -> None:
    definition = example()
    step(definition, "route")["when"][0]["if"] = "input.tier =="
    issues = validate_definition(definition)
    assert triples(issues) == [("malformed_condition", "route", "when.0.if")]

    definition = example()
    step(definition, "route")["when"][0]["if"] = "{{ input.tier == 'gold' }}"
    issues = validate_definition(definition)
    assert triples(issues) == [("malformed_condition", "route", "when.0.if")]
    assert "without {{ }}" in issues[0].message


def test_invalid_limits() -> None:
    for bad in (0, -1, 100_001, True, "5", 2.5, None):
        definition = example()
        definition["limits"] = {"max_steps": bad}
        assert only(definition) == ("invalid_limits", None, "limits.max_steps"), bad
    for bad in ("30x", "0s", "1.5h", "3651d", 30, "", " 5m"):
        definition = example()
        definition["limits"] = {"max_age": bad}
        assert only(definition) == ("invalid_limits", None, "limits.max_age"), bad
    definition = example()
    definition["limits"] = [1]
    assert only(definition) == ("invalid_limits", None, "limits")


def test_step_type_not_available_when_publishing() -> None:
    # Every shipped type is built; a plugin's type may not be yet (no executor).
    with_sketch = Registry()
    for step_type in registry:
        with_sketch.register(step_type)
    with_sketch.register(StepType(name="sketch", lane="io", validate=lambda step, report: None))
    unbuilt = example()
    thank = step(unbuilt, "thank")
    thank.clear()
    thank.update({"id": "thank", "type": "sketch", "next": "done"})
    ensure_valid(unbuilt, registry=with_sketch)  # a draft may use it
    with pytest.raises(InvalidDefinition) as caught:
        ensure_valid(unbuilt, for_publish=True, registry=with_sketch)
    assert triples(caught.value.issues) == [("step_type_not_available", "thank", "type")]
    assert '"sketch"' in caught.value.issues[0].message
    ensure_valid(example(), for_publish=True)  # http is built

    built_only = example()
    route = step(built_only, "route")
    route["next"]["vip"] = "done"
    built_only["steps"].remove(step(built_only, "thank"))
    ensure_valid(built_only, for_publish=True)  # set, branch, end: all built


# The definition language's pages, the first example's first.
REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference"
DOCS = [
    REFERENCE / f"{page}.md"
    for page in (
        "definitions",
        "step-types",
        "effect-people-code-steps",
        "sagas",
        "custom-step-types",
        "issue-codes",
    )
]


def docs_text() -> str:
    return "\n".join(page.read_text() for page in DOCS)


def test_every_issue_code_and_step_type_is_documented() -> None:
    docs = docs_text()
    for code in ISSUE_CODES:
        assert f"`{code}`" in docs, code
    for name in (t.name for t in registry if t.app != "tests"):  # not the tests' own types
        assert re.search(rf"^#+ `{name}`$", docs, re.M), name
    assert "WAYMARK_MAX_DEFINITION_BYTES" in docs
    assert "WAYMARK_MAX_DEFINITION_STEPS" in docs


def test_the_definitions_in_the_docs_are_valid() -> None:
    blocks = re.findall(r"```json\n(.*?)```", docs_text(), flags=re.DOTALL)
    definitions = [
        parsed
        for parsed in (json.loads(block) for block in blocks)
        if isinstance(parsed, dict) and "steps" in parsed
    ]
    assert len(definitions) == 3  # the first example, the complete one, the saga
    for definition in definitions:
        assert validate_definition(definition) == []
    assert definitions[0] == EXAMPLE


# --- shapes that must never raise -----------------------------------------------------------


@pytest.mark.parametrize(
    "definition",
    [
        None,
        0,
        1.5,
        float("nan"),
        True,
        "",
        "{}",
        b"{}",
        [],
        [EXAMPLE],
        (),
        {1, 2},
        object(),
        {},
        {1: 2},
        {"a": {1, 2}},
        {"start": None, "steps": None},
        {"start": 5, "steps": {}},
        {"start": "a", "steps": "a"},
        {"start": "a", "steps": []},
        {"start": "a", "steps": [None, 1, "a", [], {}]},
        {"start": "a", "steps": [{"id": None}, {"id": []}, {"id": {"x": 1}}, {"id": 1.5}]},
        {"start": ["a"], "steps": [{"id": "a", "type": ["set"], "next": ["a"]}]},
        {"start": "a", "steps": [{"id": "a", "type": "set", "values": None}]},
        {"start": "a", "steps": [{"id": "a", "type": "set", "values": {"x": {"y": "{{"}}}]},
        {"start": "a", "steps": [{"id": "a", "type": "branch", "when": None, "next": None}]},
        {
            "start": "a",
            "steps": [
                {"id": "a", "type": "branch", "when": [{"outcome": "x", "if": 1}], "next": {}}
            ],
        },
        {"start": "a", "steps": [{"id": "a", "type": "http", "request": []}]},
        {"start": "a", "steps": [{"id": "a", "type": "http", "request": {"headers": []}}]},
        {"start": "a", "steps": [{"id": "a", "type": "http", "request": {"url": 5}}]},
        {"start": "a", "steps": [{"id": "a", "type": "parallel", "branches": "ab"}]},
        {"start": "a", "steps": [{"id": "a", "type": "parallel", "branches": [1, None]}]},
        {"start": "a", "steps": [{"id": "a", "type": "join", "wait_for": {"a": 1}}]},
        {"start": "a", "steps": [{"id": "a", "type": "wait_until", "rule": "daily"}]},
        {"start": "a", "steps": [{"id": "a", "type": "wait_until", "timezone": ["x"]}]},
        {"start": "a", "steps": [{"id": "a", "type": "wait_until", "timezone": "../etc/x"}]},
        {"start": "a", "steps": [{"id": "a", "type": "approval", "approvers": [None, 1]}]},
        {"start": "a", "steps": [{"id": "a", "type": "model", "budget": float("inf")}]},
        {"start": "a", "steps": [{"id": "a", "type": "end", "retry": [], "next": 3}]},
        {"limits": "x", "steps": [{"id": "a", "type": "noop", "retry": {"x": 1}}]},
    ],
)
def test_any_shape_gives_issues_without_raising(definition: object) -> None:
    issues = validate_definition(definition)
    assert issues
    for issue in issues:
        assert issue.code in ISSUE_CODES
        assert isinstance(issue.message, str) and issue.message
    with pytest.raises(InvalidDefinition):
        ensure_valid(definition, for_publish=True)


def test_non_objects_give_not_an_object() -> None:
    for value in (None, 3, "x", [], [1, 2], {1, 2}, object()):
        assert only(value) == ("not_an_object", None, None), value


def test_circular_and_deeply_nested_data_does_not_raise() -> None:
    circular: dict[str, Any] = {}
    circular["self"] = circular
    assert only(circular) == ("invalid_field", None, None)

    deep: list[Any] = []
    cursor = deep
    for _ in range(50_000):
        cursor.append([])
        cursor = cursor[0]
    definition = {"start": "a", "steps": [{"id": "a", "type": "set", "values": {"x": deep}}]}
    assert only(definition) == ("invalid_field", None, None)


def test_templates_nested_too_deeply_are_reported() -> None:
    value: Any = "{{ input.x }}"
    for _ in range(70):
        value = [value]
    definition = {"start": "a", "steps": [{"id": "a", "type": "set", "values": {"x": value}}]}
    code, step_id, field = only(definition)
    assert (code, step_id) == ("invalid_field", "a")
    assert field is not None and field.startswith("values.x.0.0")


# --- loops ----------------------------------------------------------------------------------


def loop_definition(middle_type: str = "noop", **extra: Any) -> dict[str, Any]:
    middle: dict[str, Any] = {"id": "b", "type": middle_type, "next": "c", **extra}
    return {
        "start": "a",
        "steps": [
            {"id": "a", "type": "set", "values": {"n": 1}, "next": "b"},
            middle,
            {
                "id": "c",
                "type": "branch",
                "when": [{"outcome": "again", "if": "input.more"}],
                "next": {"again": "a", "default": "done"},
            },
            {"id": "done", "type": "end"},
        ],
    }


def test_unbounded_loop_is_detected_and_named_in_order() -> None:
    issues = validate_definition(loop_definition())
    assert triples(issues) == [("unbounded_loop", "a", "next")]
    assert '"a" -> "b" -> "c" -> "a"' in issues[0].message
    assert "limits.max_steps" in issues[0].message


def test_a_loop_is_allowed_with_an_explicit_max_steps() -> None:
    definition = loop_definition()
    definition["limits"] = {"max_steps": 50}
    assert validate_definition(definition) == []


def test_a_loop_through_a_waiting_step_is_allowed() -> None:
    assert validate_definition(loop_definition("wait", duration="1h")) == []
    approval = loop_definition(
        "approval", approvers=["bob"], message="ok?", deadline="1d", on_timeout="reject"
    )
    assert validate_definition(approval) == []


def test_self_loop_and_loop_through_an_outcome() -> None:
    definition = {
        "start": "a",
        "steps": [{"id": "a", "type": "noop", "next": "a"}],
    }
    issues = validate_definition(definition)
    assert triples(issues) == [("unbounded_loop", "a", "next")]
    assert '"a" -> "a"' in issues[0].message

    definition = {
        "start": "poll",
        "steps": [
            {
                "id": "poll",
                "type": "http",
                "request": {"url": "https://example.com"},
                "next": {"failed": "poll", "ok": "done"},
            },
            {"id": "done", "type": "end"},
        ],
    }
    assert triples(validate_definition(definition)) == [("unbounded_loop", "poll", "next.failed")]


def test_two_separate_loops_are_both_reported() -> None:
    definition = {
        "start": "a",
        "steps": [
            {"id": "a", "type": "noop", "next": "b"},
            {"id": "b", "type": "noop", "next": "a"},
            {"id": "c", "type": "noop", "next": "d"},
            {"id": "d", "type": "noop", "next": "c"},
        ],
    }
    issues = validate_definition(definition)
    assert triples(issues) == [
        ("unreachable_step", "c", None),
        ("unreachable_step", "d", None),
        ("unbounded_loop", "a", "next"),
        ("unbounded_loop", "c", "next"),
    ]


def test_strongly_connected_components() -> None:
    successors = {"a": ["b"], "b": ["c", "d"], "c": ["a"], "d": ["e"], "e": ["d"], "f": []}
    components = {frozenset(c) for c in strongly_connected_components(successors, successors)}
    assert components == {frozenset("abc"), frozenset("de"), frozenset("f")}


def test_a_long_loop_is_found_without_recursion_and_summarised() -> None:
    count = 3000
    steps = [{"id": f"s{i}", "type": "noop", "next": f"s{(i + 1) % count}"} for i in range(count)]
    definition = {"start": "s0", "steps": steps}
    issues = validate_definition(definition, max_steps=count, max_bytes=10**7)
    assert triples(issues) == [("unbounded_loop", "s0", "next")]
    assert "more steps" in issues[0].message
    assert len(issues[0].message) < 600


# --- size and speed -------------------------------------------------------------------------


def test_the_configured_number_of_steps_validates_fast_and_one_more_is_refused() -> None:
    limit = configured("MAX_DEFINITION_STEPS", DEFAULT_MAX_DEFINITION_STEPS)
    definition = chain(limit, "set")
    for s in definition["steps"][:-1]:
        s["values"] = {"n": "{{ input.n }} and " + s["id"]}
    started = time.perf_counter()
    assert validate_definition(definition) == []
    assert time.perf_counter() - started < 5

    too_many = chain(limit + 1)
    assert only(too_many) == ("too_many_steps", None, "steps")


def test_a_500_step_chain_is_valid() -> None:
    assert validate_definition(chain(500), max_steps=500) == []
    assert only(chain(501), max_steps=500) == ("too_many_steps", None, "steps")


# --- canonical form and digest --------------------------------------------------------------


def test_canonical_json_and_digest_ignore_key_order() -> None:
    reordered = json.loads(json.dumps(EXAMPLE))
    reordered = {key: reordered[key] for key in reversed(list(reordered))}
    reordered["steps"] = [{k: s[k] for k in reversed(list(s))} for s in reordered["steps"]]
    assert canonical_json(reordered) == canonical_json(EXAMPLE)
    assert definition_digest(reordered) == definition_digest(EXAMPLE)
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == '{"a":[1,{"c":3,"d":2}],"b":1}'
    assert len(definition_digest(EXAMPLE)) == 64

    changed = example()
    step(changed, "done")["status"] = "failed"
    assert definition_digest(changed) != definition_digest(EXAMPLE)


# --- issues and the exception ---------------------------------------------------------------


def test_issue_as_dict_and_invalid_definition_summary() -> None:
    issue = DefinitionIssue("unknown_field", "x is unknown", "a", "x")
    assert issue.as_dict() == {
        "code": "unknown_field",
        "message": "x is unknown",
        "step": "a",
        "field": "x",
    }
    issues = [DefinitionIssue("invalid_field", f"problem {i}") for i in range(5)]
    error = InvalidDefinition(issues)
    assert error.issues == issues
    assert str(error) == ("the definition is invalid: problem 0; problem 1; problem 2 (and 2 more)")


def test_issue_report_records_codes_and_plain_errors() -> None:
    report = IssueReport("a", step_ids={"a", "b"})
    report.error("x", "is wrong")
    report.issue("malformed_template", "y", "is broken")
    assert report.issues == [
        ("invalid_field", "x", "is wrong"),
        ("malformed_template", "y", "is broken"),
    ]
    assert report.step_ids == {"a", "b"}


def test_check_templates_in_works_with_a_plain_step_report() -> None:
    report = StepReport("a")
    check_templates_in({"a": ["ok", "{{ input.x", {"b": "{% for %}"}], "n": 5}, "body", report)
    assert [(code, field) for code, field, _ in report.issues] == [
        ("malformed_template", "body.a.1"),
        ("malformed_template", "body.a.2.b"),
    ]


def test_a_crashing_step_type_becomes_an_issue() -> None:
    from workflows.definitions.registry import StepType

    def explode(step_dict: Any, report: StepReport) -> None:
        raise RuntimeError("bug")

    local = Registry()
    local.register(StepType(name="boom", lane="inline", validate=explode))
    definition = {"start": "a", "steps": [{"id": "a", "type": "boom"}]}
    assert only(definition, registry=local) == ("invalid_field", "a", None)


def test_parse_duration() -> None:
    assert parse_duration("30s") == timedelta(seconds=30)
    assert parse_duration("15m") == timedelta(minutes=15)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("3650d") == timedelta(days=3650)
    for bad in ("3651d", "0s", "1w", "-5m", "5", "m", "1.5h", 5, None, "5m\n"):
        assert parse_duration(bad) is None, bad


# --- step type details ----------------------------------------------------------------------


def single(step_dict: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    step_dict = {"id": "x", **step_dict}
    return triples(validate_definition({"start": "x", "steps": [step_dict]}))


def test_wait_until_needs_at_or_rule_and_a_real_time_zone() -> None:
    assert single({"type": "wait_until"}) == [("missing_field", "x", "at")]
    assert single({"type": "wait_until", "at": "{{ input.t }}", "rule": {"time": "09:00"}}) == [
        ("invalid_field", "x", "rule")
    ]
    assert single({"type": "wait_until", "rule": {"weekdays": ["mon"]}}) == [
        ("missing_field", "x", "rule.time")
    ]
    assert single({"type": "wait_until", "rule": {"time": "25:00", "days": 1}}) == [
        ("unknown_field", "x", "rule.days"),
        ("invalid_field", "x", "rule.time"),
    ]
    assert single({"type": "wait_until", "rule": {"time": "09:00", "weekdays": ["monday"]}}) == [
        ("invalid_field", "x", "rule.weekdays")
    ]
    assert single({"type": "wait_until", "at": "2030-01-01T09:00", "timezone": "Mars/Olympus"}) == [
        ("invalid_field", "x", "timezone")
    ]
    assert single({"type": "wait_until", "at": "tomorrow"}) == [("invalid_field", "x", "at")]
    assert single({"type": "wait_until", "at": "2030-01-01T09:00:00+01:00"}) == []
    assert single({"type": "wait_until", "at": "{{ input.t }}", "spread": "soon"}) == [
        ("invalid_field", "x", "spread")
    ]
    assert not is_time_zone("../../etc/passwd")
    assert not is_time_zone("")
    assert is_time_zone("UTC")


def test_wait_until_accepts_europe_berlin() -> None:
    if not is_time_zone("Europe/Berlin"):
        pytest.skip("no IANA time zone database on this machine (install tzdata)")
    assert single({"type": "wait_until", "at": "{{ input.t }}", "timezone": "Europe/Berlin"}) == []


def test_effect_and_approval_fields() -> None:
    assert single({"type": "http"}) == [("missing_field", "x", "request")]
    assert single({"type": "http", "request": {}}) == [("missing_field", "x", "request.url")]
    assert single(
        {"type": "http", "request": {"url": "https://a.example", "headers": {"X-A": 1}}}
    ) == [("invalid_field", "x", "request.headers.X-A")]
    assert single(
        {"type": "http", "request": {"url": "https://a.example", "headers": {"X": "{{ x }}"}}}
    ) == [("malformed_template", "x", "request.headers.X")]
    assert single({"type": "email", "to": "a@example.com", "subject": "s"}) == [
        ("missing_field", "x", "body"),
        ("missing_field", "x", "connection"),  # the mail server to send through
    ]
    assert single({"type": "slack_message", "channel": "#a", "text": 5, "connection": "s"}) == [
        ("invalid_field", "x", "text")
    ]
    model = {"type": "model", "prompt": "p", "max_tokens": 100_001, "budget": -1, "connection": "m"}
    assert single(model) == [
        ("invalid_field", "x", "max_tokens"),
        ("invalid_field", "x", "budget"),
    ]
    assert single(
        {"type": "approval", "approvers": [], "message": "m", "deadline": "1d", "on_timeout": "x"}
    ) == [("invalid_field", "x", "approvers"), ("invalid_field", "x", "on_timeout")]
    assert single({"type": "approval", "approvers": ["a"], "message": "m"}) == [
        ("missing_field", "x", "deadline")
    ]
    assert single({"type": "wait_signal", "signal": "paid", "correlation": "{{ input.id }}"}) == []
    assert single({"type": "wait_signal", "signal": "has space", "correlation": "c"}) == [
        ("invalid_field", "x", "signal")
    ]
    assert ("invalid_field", "x", "branches") in single({"type": "parallel", "branches": ["x"]})
    assert single({"type": "wait", "duration": "1y"}) == [("invalid_field", "x", "duration")]


# --- templates and the sandbox --------------------------------------------------------------


CONTEXT = build_context(
    run_input={"name": "Ann", "tier": "gold", "items": ["a", "b"], "total": 120},
    variables={"greeting": "Hello Ann"},
    step_outputs={"thank": {"status": 200}},
    run_id="run-1",
    started_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
)


def test_rendering_reads_the_context() -> None:
    assert render_template("Hi {{ input.name }}", CONTEXT) == "Hi Ann"
    assert render_template("{{ vars.greeting }}!", CONTEXT) == "Hello Ann!"
    assert render_template("{{ steps.thank.output.status }}", CONTEXT) == "200"
    assert render_template("{{ run.id }} {{ run.started_at }}", CONTEXT) == (
        "run-1 2025-01-02T03:04:05+00:00"
    )
    # keys win over dict methods: input.items is the data, not dict.items
    assert render_template("{{ input.items|join(',') }}", CONTEXT) == "a,b"
    assert render_template("no markup\n", CONTEXT) == "no markup\n"
    assert render_template("{{ input.name }}\n", CONTEXT) == "Ann\n"


def test_render_value_renders_nested_strings_only() -> None:
    value = {"text": "{{ input.name }}", "list": [1, "{{ input.total + 1 }}", None, True]}
    assert render_value(value, CONTEXT) == {"text": "Ann", "list": [1, "121", None, True]}
    assert render_value(7, CONTEXT) == 7


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ input.__class__ }}",
        "{{ input.__init__.__globals__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ joiner.__init__.__globals__ }}",
        "{{ namespace.__init__.__globals__ }}",
        "{{ lipsum.__globals__ }}",
        "{{ range.__self__ }}",
        "{{ self.__init__.__globals__ }}",
        "{{ input|attr('__class__') }}",
        "{{ '{0.__class__}'.format(input) }}",
        "{{ input.items.mro() }}",
        "{{ input['items'].append('c') }}",
        "{{ input.pop('name') }}",
        "{{ settings }}",
        "{{ config }}",
        "{{ settings.SECRET_KEY }}",
        "{% include '/etc/passwd' %}",
        "{% import 'x' as y %}",
    ],
)
def test_the_sandbox_refuses_escapes(template: str) -> None:
    with pytest.raises(ExpressionError):
        render_template(template, CONTEXT)
    assert CONTEXT["input"]["items"] == ["a", "b"]
    assert CONTEXT["input"]["name"] == "Ann"


def test_settings_and_config_are_undefined() -> None:
    for name in ("settings", "config", "os", "request", "range", "cycler"):
        with pytest.raises(ExpressionError, match="undefined"):
            render_template("{{ " + name + " }}", CONTEXT)
        assert check_template("{{ " + name + " }}") == (
            f'uses unknown name "{name}" (available: compensating, input, run, steps, vars)'
        )


def test_security_errors_mention_what_was_refused() -> None:
    with pytest.raises(ExpressionError, match="__class__"):
        render_template("{{ ''.__class__ }}", CONTEXT)


def test_strict_undefined_raises_on_unknown_keys() -> None:
    with pytest.raises(ExpressionError, match="nope"):
        render_template("{{ input.nope }}", CONTEXT)
    with pytest.raises(ExpressionError):
        render_template("{{ steps.never_ran.output }}", CONTEXT)
    with pytest.raises(ExpressionError):
        render_template("{{ input.nope|default }}x{{ vars.missing.deeper }}", CONTEXT)
    assert render_template("{{ input.nope|default('-') }}", CONTEXT) == "-"
    assert render_template("{% if input.nope is defined %}y{% else %}n{% endif %}", CONTEXT) == "n"


def test_output_size_is_capped() -> None:
    big = {"input": {"chunk": "x" * 1000, "rows": list(range(100))}}
    with pytest.raises(ExpressionError, match="larger than"):
        render_template("{% for r in input.rows %}{{ input.chunk }}{% endfor %}", big)
    assert len(render_template("{{ input.chunk }}", big)) == 1000
    with pytest.raises(ExpressionError, match="larger than"):
        render_template("{{ input.chunk }}", big, max_bytes=999)
    # the cap counts bytes: 30000 two-byte characters are 60000 bytes
    wide = {"input": {"s": "é" * 30_000}}
    assert render_template("{{ input.s }}", wide) == "é" * 30_000
    with pytest.raises(ExpressionError, match="larger than"):
        render_template("{{ input.s }}{{ input.s }}", wide)
    # render_value bounds the total of all its strings
    many = ["{{ input.chunk }}"] * 70
    with pytest.raises(ExpressionError, match="larger than"):
        render_value(many, big)
    assert MAX_OUTPUT_BYTES == 65536


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'x' * 100000000 }}",
        "{{ [1] * 100000000 }}",
        "{{ 10 ** 100000000 }}",
        "{{ '%999999999s' % 'x' }}",
        "{{ '%*s' % (999999999, 'x') }}",
        "{{ 'x'.ljust(999999999) }}",
        "{{ 'x'.zfill(999999999) }}",
        "{{ 'x'|center(999999999) }}",
        "{{ 'x'|indent(999999999) }}",
        "{{ '%999999999s'|format('x') }}",
        "{{ '{:>999999999}'.format('x') }}",
        "{{ 'a\tb'.expandtabs(999999999) }}",
        "{{ ('x' * 60000).replace('x', 'yy') }}",
    ],
)
def test_expansion_bombs_are_refused_before_they_allocate(template: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ExpressionError):
        render_template(template, CONTEXT)
    assert time.perf_counter() - started < 2


def test_runtime_errors_become_expression_errors() -> None:
    for template in (
        "{{ 1 / 0 }}",
        "{{ input.name + 1 }}",
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    ):
        with pytest.raises(ExpressionError):
            render_template(template, CONTEXT)
    with pytest.raises(ExpressionError):
        render_template(5, CONTEXT)  # type: ignore[arg-type]


def test_check_template() -> None:
    assert check_template("plain text") is None
    assert check_template("Hello {{ input.name|upper }}") is None
    assert check_template("{% for i in input.items %}{{ loop.index }}{{ i }}{% endfor %}") is None
    assert check_template("{{ input.name ") is not None
    assert check_template("{{ input.name|no_such_filter }}") is not None
    assert check_template("{% include 'x' %}") == (
        "cannot extend, include or import other templates"
    )
    assert check_template(5) == "must be a string"
    message = check_template("line one\n{{ input.x }}\n{% if %}")
    assert message is not None and "(line 3)" in message


def test_conditions() -> None:
    assert evaluate_condition("input.tier == 'gold'", CONTEXT) is True
    assert evaluate_condition("input.total > 200", CONTEXT) is False
    assert evaluate_condition("'b' in input['items'] and vars.greeting", CONTEXT) is True
    assert evaluate_condition("input.nope is defined", CONTEXT) is False
    with pytest.raises(ExpressionError):
        evaluate_condition("input.nope", CONTEXT)
    with pytest.raises(ExpressionError):
        evaluate_condition("input.__class__", CONTEXT)
    with pytest.raises(ExpressionError):
        evaluate_condition("input.tier ==", CONTEXT)
    assert check_condition("input.tier == 'gold'") is None
    assert check_condition("") == "is empty"
    assert check_condition("input.x == 1 }}") is not None
    assert check_condition("input.x == 1 junk") is not None
    assert check_condition("secrets.x") == (
        'uses unknown name "secrets" (available: compensating, input, run, steps, vars)'
    )


def test_build_context_holds_plain_data_only() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque"

    context = build_context(
        run_input={"when": datetime(2025, 1, 1, tzinfo=UTC), "o": Opaque()},
        run_id=12,
        started_at="2025-01-01T00:00:00+00:00",
    )
    assert context == {
        "input": {"when": "2025-01-01T00:00:00+00:00", "o": "opaque"},
        "vars": {},
        "steps": {},
        "run": {"id": "12", "started_at": "2025-01-01T00:00:00+00:00"},
        "compensating": None,  # (a compensation step's: what it undoes)
    }
