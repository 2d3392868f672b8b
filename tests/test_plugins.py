"""A host project's own step type, registered through the public API (workflows.plugins),
validated, published and run like any built-in one."""

from __future__ import annotations

from typing import Any

import pytest

from workflows import plugins
from workflows.code.testing import run_due_steps
from workflows.definitions.registry import registry
from workflows.definitions.validator import validate_definition
from workflows.engine.executors import executor_for
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim, run_context, settle_failure, settle_success, step_context
from workflows.engine.worker import Worker
from workflows.models import Run
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

pytestmark = pytest.mark.django_db


def validate_greet(step: Any, report: plugins.StepReport) -> None:
    plugins.check_fields(step, report, ("name",))
    plugins.check_template_field(step, "name", report)


def greet(step: Any, context: Any, ctx: plugins.StepContext) -> plugins.StepResult:
    name = plugins.render(step["name"], context)
    if not name:
        raise plugins.StepFailure("nobody to greet", retryable=False)
    return plugins.StepResult(output={"greeting": f"Hello {name}", "key": ctx.effect_key})


GREET = plugins.StepType(
    name="test_greet", lane="io", validate=validate_greet, execute=greet, built=True,
    app="tests",
)  # fmt: skip

DEFINITION = {
    "start": "hello",
    "steps": [
        {"id": "hello", "type": "test_greet", "name": "{{ input.who }}", "next": "done"},
        {"id": "done", "type": "end", "output": "{{ steps.hello.output.greeting }}"},
    ],
}


@pytest.fixture(autouse=True)
def greet_type():
    plugins.register_step_type(GREET)
    yield
    registry._types.pop("test_greet", None)  # registered for these tests only


def run_one(org, who: str) -> Run:
    automation_publish_definition(org=org, slug="greet", definition=DEFINITION)
    run = run_start(org=org, automation_slug="greet", run_input={"who": who}, start_key=f"k{who}")
    (step,) = claim(policy=lane_policy("io"), worker="w", limit=1)
    step_def, context = run_context(step)
    try:
        result = executor_for(step.type)(step_def, context, step_context(step))
    except plugins.StepFailure as failure:
        settle_failure(step, failure, worker="w", policy=lane_policy("io"))
    else:
        settle_success(step, result, worker="w")
    return Run.objects.get(pk=run.run_id)


def test_a_registered_step_type_validates_publishes_and_runs_on_its_lane(org) -> None:
    run = run_one(org, "Ada")
    assert (run.status, run.output) == ("succeeded", "Hello Ada")
    assert run.outputs["hello"]["key"] == f"{run.pk}/hello/1"


def test_its_validation_and_failures_are_the_engines(org) -> None:
    issues = validate_definition({**DEFINITION, "steps": [
        {"id": "hello", "type": "test_greet", "nme": "typo", "next": "done"},
        DEFINITION["steps"][1],
    ]})  # fmt: skip
    assert [(i.code, i.field) for i in issues] == [
        ("unknown_field", "nme"),
        ("missing_field", "name"),
    ]
    run = run_one(org, "")
    assert run.status == "failed"
    assert "nobody to greet" in run.error


def test_another_type_under_a_taken_name_is_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        plugins.register_step_type(plugins.StepType(name="set", lane="io", validate=validate_greet))


class Unreadable(Exception):
    """A host's exception whose message cannot be read (its __str__ reads what __init__
    never set)."""

    def __str__(self) -> str:
        raise AttributeError("no message was set")


def explode(step: Any, context: Any, ctx: plugins.StepContext) -> plugins.StepResult:
    raise RuntimeError("bad\x00byte") if step.get("nul") else Unreadable()


EXPLODE = plugins.StepType(
    name="test_explode", lane="io", validate=lambda step, report: None, execute=explode,
    built=True, app="tests",
)  # fmt: skip


@pytest.mark.django_db(transaction=True)  # the worker's executors run outside a transaction
@pytest.mark.parametrize(
    ("nul", "error"),
    [
        (False, "Unreadable: (its message cannot be read: AttributeError)"),
        (True, "RuntimeError: bad\\x00byte"),
    ],
)
def test_a_step_whose_exception_cannot_be_told_or_stored_fails_with_it_named(
    org, nul: bool, error: str
) -> None:
    """The worker's own path (claim, execute, settle) for an executor that raises: an
    exception whose __str__ raises, or whose text holds a NUL (which text columns refuse),
    fails the step and the run with a readable error, not the worker's own."""
    plugins.register_step_type(EXPLODE)
    try:
        definition = {"start": "x", "steps": [
            {"id": "x", "type": "test_explode", "nul": nul, "retry": {"max_attempts": 1},
             "next": "done"},
            {"id": "done", "type": "end"},
        ]}  # fmt: skip
        automation_publish_definition(org=org, slug="explode", definition=definition)
        started = run_start(org=org, automation_slug="explode", run_input={}, start_key="x")
        run_due_steps(Worker(lane_policy("io"), concurrency=1, name="test-worker"))
    finally:
        registry._types.pop("test_explode", None)
    run = Run.objects.get(pk=started.run_id)
    assert run.status == "failed"
    assert error in run.error
