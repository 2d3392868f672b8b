"""A step of a type declaring ``context_on_read`` (the engine's own) gets the run's template
context copied name by name as it first reads it (rendering.ContextOnRead), from a worker or
in the walk: a noop that renders nothing copies nothing, nor does an end with no output;
what a step reads is exactly build_context's dict; a template rendered in a child process
gets it as plain JSON; a plugin's step is handed the dict itself."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from workflows import plugins
from workflows.definitions import rendering
from workflows.definitions.registry import registry
from workflows.definitions.rendering import (
    CONTEXT_NAMES,
    CONTEXT_PARTS,
    ContextOnRead,
    build_context,
)
from workflows.engine.executors import executor_for
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim, run_context, step_context
from workflows.models import Organisation, Run
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

pytestmark = pytest.mark.django_db

ARGUMENTS: dict[str, Any] = {
    "run_input": {"items": [1, (2, 3)], "when": datetime(2026, 1, 2, tzinfo=UTC)},
    "variables": {"who": "Ada"},
    "step_outputs": {"a": {"n": 1}, "b": None},
    "run_id": 7,
    "started_at": datetime(2026, 1, 1, tzinfo=UTC),
    "compensating": None,
}


def copies_made(monkeypatch, *, fake: bool = False) -> list[str]:
    """The names of a context copied from here on (``fake``: copied as {}, not made)."""
    made: list[str] = []
    for name, real in dict(rendering._CONTEXT_PART).items():

        def counted(arguments: Any, name: str = name, real: Any = real) -> Any:
            made.append(name)
            return {} if fake else real(arguments)

        monkeypatch.setitem(rendering._CONTEXT_PART, name, counted)
    return made


def test_it_reads_as_build_context_copying_each_name_once(monkeypatch):
    assert set(CONTEXT_PARTS) == CONTEXT_NAMES
    context = ContextOnRead(**ARGUMENTS)
    made = copies_made(monkeypatch)
    assert "steps" in context and "nope" not in context and len(context) == 5
    assert made == []  # nothing copied until read
    assert context["input"]["items"] == [1, [2, 3]]  # as a JSON round trip gives it back
    assert context["input"]["when"] == "2026-01-02T00:00:00+00:00"
    assert made == ["input"]  # reading the input copies no step's output
    with pytest.raises(KeyError):
        context["nope"]
    plain = build_context(**ARGUMENTS)
    made.clear()
    assert dict(context) == plain and list(context) == list(plain)
    assert made == ["vars", "steps", "run", "compensating"]  # each once, however often read
    context["vars"]["who"] = "changed"  # a copy: the run's own values are not touched
    assert ARGUMENTS["variables"] == {"who": "Ada"}


def started_step(org: Organisation, step: dict[str, Any], run_input: dict[str, Any]) -> Any:
    definition = {"start": "s", "steps": [{"id": "s", **step, "next": "done"},
                                          {"id": "done", "type": "end"}]}  # fmt: skip
    automation_publish_definition(org=org, slug="lazy", definition=definition)
    run_start(org=org, automation_slug="lazy", run_input=run_input, start_key="k")
    (claimed,) = claim(policy=lane_policy("io"), worker="w", limit=1)
    return claimed


def test_a_noop_that_renders_nothing_copies_nothing(org, monkeypatch):
    claimed = started_step(org, {"type": "noop"}, {"big": ["x"] * 1000})
    copies = copies_made(monkeypatch, fake=True)
    step_def, context = run_context(claimed)
    assert isinstance(context, ContextOnRead)
    result = executor_for("noop")(step_def, context, step_context(claimed))
    assert result.output is None and copies == []


def test_a_template_rendered_in_a_child_gets_the_context_as_json(org):
    # A for loop is not on the in-process fast path: the pool renders it, from JSON frames.
    loop = "{% for item in input['items'] %}{{ item }};{% endfor %}"
    claimed = started_step(org, {"type": "noop", "output": loop}, {"items": ["a", "b"]})
    step_def, context = run_context(claimed)
    assert isinstance(context, ContextOnRead)
    result = executor_for("noop")(step_def, context, step_context(claimed))
    assert result.output == "a;b;"


def test_a_plugins_step_is_handed_the_dict(org):
    seen: list[object] = []

    def execute(step: Any, context: Any, ctx: plugins.StepContext) -> plugins.StepResult:
        seen.append(type(context))
        return plugins.StepResult(output=context["input"]["n"])

    plugins.register_step_type(
        plugins.StepType(name="lazy_probe", lane="io", execute=execute, built=True,
                         validate=lambda step, report: None)
    )  # fmt: skip
    try:
        claimed = started_step(org, {"type": "lazy_probe"}, {"n": 3})
        step_def, context = run_context(claimed)
        assert executor_for("lazy_probe")(step_def, context, step_context(claimed)).output == 3
    finally:
        registry._types.pop("lazy_probe", None)  # registered for this test only
    assert seen == [dict]


def test_a_walks_inline_steps_copy_only_what_they_read(org, monkeypatch):
    definition = {
        "start": "note",
        "steps": [
            {"id": "note", "type": "set", "values": {"seen": "{{ input.n }}"}, "next": "done"},
            {"id": "done", "type": "end"},
        ],
    }
    automation_publish_definition(org=org, slug="inline", definition=definition)
    made = copies_made(monkeypatch)
    started = run_start(org=org, automation_slug="inline", run_input={"n": 4}, start_key="i")
    assert made == ["input"]  # the set read its input; the end, with no output, nothing
    run = Run.objects.get(pk=started.run_id)
    assert (run.status, run.vars) == ("succeeded", {"seen": "4"})
