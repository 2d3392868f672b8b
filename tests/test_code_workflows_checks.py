"""What a code workflow refuses (docs/reference/code-workflows.md, "Input and output", "Mistakes a
workflow's code can make"): an input its schema (given, or its TypedDict hint) refuses is
refused at the start before anything is written; an output that fails its schema, a
ctx.run result or an output past the size limits, and one step id used as two step types
fail the run with their own codes; and on a real worker process, none of these leaves a
traceback in the worker's log."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

import pytest
import typing_extensions
from rest_framework.test import APIClient

from workflows.code.registry import registered, unregister
from workflows.models import Organisation, Run, RunEvent, Step
from workflows.plugins.code import CodeWorkflowError, Context, publish_code_workflow, workflow
from workflows.plugins.testing import WorkflowTest

from .code_workflow_bad_input import BAD_INPUT
from .processes import ROOT, engine_env, running, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class Line(TypedDict):
    sku: str
    quantity: int


class Order(TypedDict):
    order: str
    lines: list[Line]
    channel: Literal["web", "shop"]
    note: NotRequired[str | None]


class Odd(TypedDict):
    when: complex  # no JSON type


class Tree(TypedDict):
    name: str
    children: list[Tree]  # holds itself: no schema from it


class Receipt(TypedDict):
    order: str
    count: int


@dataclass
class Shipment:  # a class the run's input (a dict) never is
    order: str


@workflow("code-typed", version=1)
def typed(ctx: Context, order: Order) -> Receipt:
    count = sum(line["quantity"] for line in order["lines"])
    if order.get("note") == "wrong":
        return {"order": order["order"], "count": "many"}  # type: ignore[typeddict-item]
    return {"order": order["order"], "count": count}


@workflow(
    "code-schema", version=1,
    input_schema={"type": "object", "required": ["email"],
                  "properties": {"email": {"type": "string", "minLength": 3}}},
)  # fmt: skip
def with_schema(ctx: Context, run_input: dict[str, Any]) -> str:
    return str(run_input["email"])


class Packed(TypedDict):
    items: list[int]
    by_id: dict[str, str]


@workflow("code-packed", version=1)
def packed(ctx: Context, run_input: dict[str, Any]) -> Packed:
    # A tuple and an int key, which the run keeps as a list and a string key.
    return {"items": (1, 2), "by_id": {7: "seven"}}  # type: ignore[typeddict-item,dict-item]


def start(api: APIClient, slug: str, run_input: Any, key: str = "k") -> Any:
    return api.post("/api/v1/runs", {"automation": slug, "input": run_input, "start_key": key},
                    format="json")  # fmt: skip


def test_an_input_its_typeddict_refuses_is_refused_before_anything_is_written(
    org: Organisation, api: APIClient
) -> None:
    publish_code_workflow(org=org, name="code-typed", version=1)
    bad = {"order": "o-1", "lines": [{"sku": "a", "quantity": "2"}], "channel": "fax"}
    refused = start(api, "code-typed", bad)
    assert refused.status_code == 400
    body = refused.json()
    assert body["code"] == "invalid_input"
    assert body["errors"] == {
        "input.channel": ["'fax' is not one of ['web', 'shop']"],
        "input.lines.0.quantity": ["'2' is not of type 'integer'"],
    }
    assert body["detail"].endswith(
        "input.channel: 'fax' is not one of ['web', 'shop'] (and 1 more: see errors)"
    ), body["detail"]
    assert not Run.objects.filter(org=org).exists()
    assert not RunEvent.objects.filter(org_id=org.pk).exists()

    missing = start(api, "code-typed", {"order": "o-1", "lines": []}, key="k2")
    assert missing.json()["errors"] == {"input": ["'channel' is a required property"]}

    # A number with a fraction part is not an int, as Python reads it, 1.0 included: JSON
    # Schema's integer took it, and the code was handed a float where its hint says int.
    floats = {"order": "o-1", "lines": [{"sku": "a", "quantity": 2.0}], "channel": "web"}
    refused = start(api, "code-typed", floats, key="k4")
    assert refused.json()["errors"] == {"input.lines.0.quantity": ["2.0 is not of type 'integer'"]}

    good = {"order": "o-1", "lines": [{"sku": "a", "quantity": 2}], "channel": "web"}
    started = start(api, "code-typed", good, key="k3")
    assert started.status_code == 201, started.json()


def test_every_start_path_checks_the_input_again_the_one_trip_start_included(
    org: Organisation, api: APIClient
) -> None:
    publish_code_workflow(org=org, name="code-schema", version=1)
    assert start(api, "code-schema", {"email": "a@b.c"}, key="1").status_code == 201
    # The version is now remembered: the next start goes the one-statement way.
    refused = start(api, "code-schema", {"email": "x"}, key="2")
    assert (refused.status_code, refused.json()["code"]) == (400, "invalid_input")
    assert refused.json()["errors"] == {"input.email": ["'x' is too short"]}
    assert Run.objects.filter(org=org).count() == 1


def test_an_output_its_schema_refuses_fails_the_run_with_invalid_output(
    org: Organisation,
) -> None:
    t = WorkflowTest(org=org)
    t.start("code-typed", version=1,
            input={"order": "o-2", "lines": [], "channel": "web", "note": "wrong"})  # fmt: skip
    run = t.run_until_finished()
    assert run.status == "failed"
    assert run.error.startswith("invalid_output: the output does not match its")
    assert "output.count: 'many' is not of type 'integer'" in run.error

    fine = WorkflowTest(org=org)
    fine.start("code-typed", version=1, input={"order": "o-3", "lines": [], "channel": "shop"},
               start_key="fine")  # fmt: skip
    assert fine.run_until_finished().output == {"order": "o-3", "count": 0}


def test_an_output_is_checked_against_its_schema_as_the_run_keeps_it(org: Organisation) -> None:
    """Without a schema the tuple is kept as a list: with one, it was refused ("(1, 2) is not
    of type 'array'"), the same value accepted or refused by whether a schema was given."""
    t = WorkflowTest(org=org)
    t.start("code-packed", version=1, input={})
    run = t.run_until_finished()
    assert (run.status, run.error) == ("succeeded", "")
    assert run.output == {"items": [1, 2], "by_id": {"7": "seven"}}


@workflow("code-when", version=1)
def when(ctx: Context, run_input: dict[str, Any]) -> str:
    if run_input.get("field"):  # a call's field that is not JSON: the call is wrong
        ctx.step("note", "set", values={"at": datetime(2026, 1, 2, tzinfo=UTC)})
    ctx.wait_until("later", at=ctx.now() + timedelta(hours=1))  # a datetime, written so
    return "woke"


def test_wait_until_takes_a_datetime_and_a_call_field_that_is_not_json_is_an_invalid_call(
    org: Organisation,
) -> None:
    t = WorkflowTest(org=org)
    t.start("code-when", version=1, input={})
    run = t.run_until_waiting()
    assert [step.step_id for step in run.waiting] == ["later"]
    t.skip_time()
    assert t.run_until_finished().output == "woke"

    wrong = WorkflowTest(org=org)
    wrong.start("code-when", version=1, input={"field": True}, start_key="wrong")
    run = wrong.run_until_finished()
    # It read unserialisable_result, the code of what a ctx.run function or the workflow
    # gives back.
    assert run.error == ("invalid_code_step: step 'note': not JSON: Object of type datetime is "
                         "not JSON serializable"), run.error  # fmt: skip


@workflow("code-generic-fields", version=1)
def calls_with_generic_fields(ctx: Context, run_input: dict[str, Any]) -> Any:
    """One step called with the fields every definition's step may have, as given."""
    return ctx.step("s", run_input["type"], **run_input["fields"])


@pytest.mark.parametrize(
    ("step_type", "fields", "error"),
    [
        ("noop", {"retry": "often"},
         "retry must be an object such as {\"max_attempts\": 3}"),
        ("noop", {"retry": {"max_attempts": -2}},
         "retry.max_attempts must be a whole number from 1 to 100, not -2"),
        ("noop", {"retry": {"max_attempts": 1000}},
         "retry.max_attempts must be a whole number from 1 to 100, not 1000"),
        ("noop", {"retry": {"attempts": 2}},
         "retry.attempts is not a retry field"),
        ("set", {"vars": {"a": 1}, "retry": {"max_attempts": 2}},
         'retry is not allowed on a "set" step'),
        ("noop", {"name": ""},
         "name must be a non-empty string of at most 200 characters"),
        ("noop", {"irreversible": "yes"},
         "irreversible must be true or false"),
    ],
    ids=["retry-text", "retry-negative", "retry-past-limit", "retry-unknown", "retry-inline",
         "name-empty", "irreversible-text"],
)  # fmt: skip
def test_a_step_s_generic_fields_are_checked_as_a_definition_s_are(
    org: Organisation, step_type: str, fields: dict[str, Any], error: str
) -> None:
    """``retry``, ``name`` and ``irreversible`` are checked as the definition validator
    checks them: a bad one is invalid_code_step naming the field, never an engine error or a
    row the database refuses (it failed the run with engine_error)."""
    t = WorkflowTest(org=org)
    t.start("code-generic-fields", version=1, input={"type": step_type, "fields": fields})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert run.error.startswith("invalid_code_step: step 's': "), run.error
    assert error in run.error, run.error
    assert [s.step_id for s in run.steps] == []  # nothing of it was entered


def test_a_step_s_good_generic_fields_are_kept(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    fields = {"name": "A pause", "irreversible": True, "retry": {"max_attempts": 4}}
    t.start("code-generic-fields", version=1, input={"type": "noop", "fields": fields})
    run = t.run_until_finished()
    assert run.status == "succeeded", run.error
    step = Step.objects.get(run_id=run.id, step_id="s")
    assert (step.status, step.max_attempts) == ("done", 4)


@workflow("code-budgeted", version=1, limits={"max_steps": 5, "max_age": "30d"},
          timer_spread="10m")  # fmt: skip
def budgeted(ctx: Context, run_input: dict[str, Any]) -> str:
    for n in range(10):
        ctx.step(f"s{n}", "noop")
    return "unreachable"


def test_a_code_workflow_s_runs_are_held_to_the_limits_it_declares(org: Organisation) -> None:
    """``limits`` and ``timer_spread``, as a definition declares them: its versions hold
    them, and its runs are held to them (a code workflow could not set them, and its runs
    ran on the defaults)."""
    version = publish_code_workflow(org=org, name="code-budgeted", version=1)
    assert version.definition["limits"] == {"max_steps": 5, "max_age": "30d"}
    assert version.definition["timer_spread"] == "10m"
    t = WorkflowTest(org=org)
    t.start("code-budgeted", version=1, input={})
    run = t.run_until_finished()
    assert (run.status, run.error) == ("failed",
                                       "step_budget_exceeded: the run entered 5 steps")  # fmt: skip
    assert Run.objects.get(pk=run.id).max_steps == 5


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"limits": {"max_steps": 0}}, "limits.max_steps must be a whole number from 1"),
        ({"limits": {"max_age": "soon"}}, "limits.max_age must be a duration"),
        ({"limits": {"steps": 3}}, "limits.steps is not a limit"),
        ({"limits": "many"}, "limits must be an object"),
        ({"timer_spread": "often"}, "timer_spread must be a duration"),
    ],
)
def test_limits_a_definition_would_refuse_are_refused_at_registration(
    given: dict[str, Any], says: str
) -> None:
    with pytest.raises(CodeWorkflowError) as refused:

        @workflow("code-bad-limits", version=1, **given)
        def bad(ctx: Context, run_input: dict[str, Any]) -> None:
            return None

    assert refused.value.code == "invalid_workflow"
    assert refused.value.detail.startswith("'code-bad-limits': "), refused.value.detail
    assert says in refused.value.detail, refused.value.detail
    assert registered("code-bad-limits", 1) is None


def test_a_schema_or_hint_that_cannot_be_used_is_refused_at_registration() -> None:
    with pytest.raises(CodeWorkflowError) as bad_schema:

        @workflow("code-bad-schema", version=1, input_schema={"type": "thing"})
        def bad(ctx: Context, run_input: dict[str, Any]) -> None:
            return None

    assert bad_schema.value.code == "invalid_workflow"
    assert "input_schema is not a valid JSON Schema" in bad_schema.value.detail

    with pytest.raises(CodeWorkflowError) as bad_hint:

        @workflow("code-bad-hint", version=1)
        def odd(ctx: Context, run_input: Odd) -> None:
            return None

    assert bad_hint.value.code == "invalid_workflow"
    assert "input.when" in bad_hint.value.detail and "input_schema=" in bad_hint.value.detail

    class Local(TypedDict):  # not found in the module when the hint is read
        when: str

    with pytest.raises(CodeWorkflowError) as unreadable:

        @workflow("code-bad-hint", version=1)
        def local(ctx: Context, run_input: Local) -> None:
            return None

    assert unreadable.value.code == "invalid_workflow"
    assert "the input (run_input), 'Local', cannot be read" in unreadable.value.detail

    with pytest.raises(CodeWorkflowError) as recursive:

        @workflow("code-bad-hint", version=1)
        def tree(ctx: Context, run_input: Tree) -> None:
            return None

    assert "input.children[]: Tree holds itself" in recursive.value.detail
    assert registered("code-bad-schema", 1) is None and registered("code-bad-hint", 1) is None

    # A schema given explicitly wins over a hint that has none.
    @workflow("code-given", version=1, input_schema={"type": "object"})
    def given(ctx: Context, run_input: Odd) -> None:
        return None

    try:
        found = registered("code-given", 1)
        assert found is not None and found.input_schema == {"type": "object"}
    finally:
        unregister("code-given", 1)


class ExtensionsLine(typing_extensions.TypedDict):  # typing_extensions' own class
    sku: str
    quantity: int
    note: typing_extensions.NotRequired[str]


class TypingLine(TypedDict):
    sku: str
    quantity: int
    note: NotRequired[str]


def test_a_typing_extensions_typeddict_hint_gives_the_schema_typings_gives() -> None:
    # typing.is_typeddict does not know typing_extensions' class: its hint gave no schema.
    @workflow("code-extensions-hint", version=1)
    def hinted(ctx: Context, run_input: ExtensionsLine) -> ExtensionsLine:
        return run_input

    @workflow("code-extensions-hint", version=2)
    def typed(ctx: Context, run_input: TypingLine) -> TypingLine:
        return run_input

    try:
        extensions = registered("code-extensions-hint", 1)
        typing_ = registered("code-extensions-hint", 2)
        assert extensions is not None and typing_ is not None
        assert extensions.input_schema is not None
        assert extensions.input_schema["required"] == ["quantity", "sku"]
        assert extensions.input_schema == typing_.input_schema
        assert extensions.output_schema == typing_.output_schema
    finally:
        unregister("code-extensions-hint", 1)
        unregister("code-extensions-hint", 2)


def test_an_input_hint_a_dict_never_is_is_refused_at_registration() -> None:
    # The input is a JSON object: a dataclass hint failed the run at its first attribute.
    for hint in (Shipment, str, Shipment | None):
        with pytest.raises(CodeWorkflowError) as refused:
            workflow("code-never-dict", version=1)(_taking(hint))
        assert refused.value.code == "invalid_workflow"
        assert "the input (run_input) is a JSON object (a dict), never" in refused.value.detail
        assert "input_schema=" in refused.value.detail
    assert registered("code-never-dict", 1) is None

    # A dict's hints, and one a schema given explicitly stands for, still register.
    for version, fits in enumerate((dict, dict[str, Any], Any, dict[str, Any] | None), 1):
        workflow("code-dict-hint", version=version)(_taking(fits))
    workflow("code-dict-hint", version=5, input_schema={"type": "object"})(_taking(Shipment))
    for version in range(1, 6):
        assert registered("code-dict-hint", version) is not None
        unregister("code-dict-hint", version)


def test_a_named_module_that_registers_wrongly_stops_a_process_with_one_line() -> None:
    # WAYMARK_EXTRA_STEP_MODULES (Part 3 of the tutorial): a registration mistake printed a
    # traceback of Django's app loading, where a module that does not import is one line.
    refused = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
        env=engine_env(WAYMARK_EXTRA_STEP_MODULES="tests.code_workflow_misregistered"),
        timeout=120,
    )  # fmt: skip
    assert refused.returncode == 78, refused.stderr  # EX_CONFIG: runengine does not restart it
    assert "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "cannot import 'tests.code_workflow_misregistered', named in WAYMARK_EXTRA_STEP_MODULES: "
        "workflow_already_registered: 'code-twice' version 1 is already registered "
        "(tests.code_workflow_misregistered.first), and "
        "tests.code_workflow_misregistered.again registers it again: give the new code another "
        "version"
    )


def _taking(hint: object) -> Any:
    def function(ctx: Context, run_input: Any) -> None:
        return None

    function.__annotations__["run_input"] = hint
    return function


@pytest.mark.parametrize(("name", "code"), sorted(BAD_INPUT.items()))
def test_a_mistake_in_the_code_fails_the_run_at_its_step_with_its_code(
    org: Organisation, settings: Any, name: str, code: str
) -> None:
    t = WorkflowTest(org=org)
    t.start(name, version=1, input={"size": 70_000})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert run.error.startswith(f"{code}: "), run.error
    if code == "step_type_conflict":
        assert run.error == (
            "step_type_conflict: step 'a' was entered as ctx.run in this run, and the code "
            "now calls it as a wait step: give each step its own id"
        )
        assert [(s.step_id, s.type) for s in run.steps] == [("a", "code_result")]
    if code == "result_too_large":
        assert "The result of step 'big' is 70002 bytes; the limit is 65536." in run.error
        assert [s.step_id for s in run.steps] == []  # nothing of it was stored


def refuse_with_a_nul(what: str) -> None:
    raise ValueError(f"{what} \x00 byte")


@workflow("code-nul-fail", version=1)
def fails_with_a_nul(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.fail("out of stock: \x00")


@workflow("code-nul-run", version=1)
def run_raises_with_a_nul(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.run("r", refuse_with_a_nul, "last", retry={"max_attempts": int(run_input["attempts"])})


@workflow("code-nul-branch", version=1)
def branch_raises_with_a_nul(ctx: Context, run_input: dict[str, Any]) -> Any:
    return ctx.parallel("fan", lambda c: refuse_with_a_nul("branch"), lambda c: c.run("b", str))


@pytest.mark.parametrize(
    ("name", "attempts", "error"),
    [
        ("code-nul-fail", 1, "workflow_failed: out of stock: \\x00"),
        ("code-nul-run", 1, "step 'r' failed: ValueError: last \\x00 byte (attempt 1 of 1)"),
        # Its first attempt's failure is the decider's row's error, retried.
        ("code-nul-run", 2, "step 'r' failed: ValueError: last \\x00 byte (attempt 2 of 2)"),
        ("code-nul-branch", 1, "step 'fan.0' failed: workflow_failed: ValueError: branch "
         "\\x00 byte"),
    ],
)  # fmt: skip
def test_a_failure_whose_text_holds_a_nul_fails_the_run_with_it_escaped(
    org: Organisation, name: str, attempts: int, error: str
) -> None:
    """PostgreSQL's text and jsonb refuse a NUL: the failure's text (a reason, what an
    exception says) is stored with it escaped, not an engine_error."""
    t = WorkflowTest(org=org)
    t.start(name, version=1, input={"attempts": attempts})
    run = t.run_until_finished()
    assert (run.status, run.error) == ("failed", error)


class OrderRefused(Exception):
    def __str__(self) -> str:
        return f"order {self.order} refused"  # type: ignore[attr-defined]  # never set


def refuse_order() -> None:
    raise OrderRefused()


@workflow("code-unreadable-exception", version=1)
def raises_what_cannot_be_read(ctx: Context, run_input: dict[str, Any]) -> None:
    if run_input["where"] == "run":
        ctx.run("r", refuse_order)
    refuse_order()


@pytest.mark.parametrize(
    ("where", "error"),
    [
        ("code", "workflow_failed: OrderRefused: (its message cannot be read: AttributeError)"),
        ("run", "step 'r' failed: OrderRefused: (its message cannot be read: AttributeError) "
         "(attempt 1 of 1)"),
    ],
)  # fmt: skip
def test_an_exception_whose_message_cannot_be_read_fails_the_run_once_with_its_code(
    org: Organisation, where: str, error: str, caplog: Any
) -> None:
    """Its __str__ raised from the handler that tells the run's failure: the decider's turn
    was retried 100 times, each with a traceback, and the run failed without a code."""
    caplog.set_level(logging.WARNING)
    t = WorkflowTest(org=org)
    t.start("code-unreadable-exception", version=1, input={"where": where})
    run = t.run_until_finished()
    assert (run.status, run.error) == ("failed", error)
    assert Step.objects.get(run_id=run.id, step_id="decide", iteration=1).attempt == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


def nested(levels: int, inner: Any = None) -> Any:
    value: Any = [] if inner is None else [inner]
    for _ in range(levels - 1):
        value = [value]
    return value


@workflow("code-deep", version=1)
def deep_values(ctx: Context, run_input: dict[str, Any]) -> Any:
    levels, where = int(run_input["levels"]), run_input["where"]
    if where == "result":
        ctx.run("deep", nested, levels)
    if where == "nan":  # not JSON, at the bottom of it
        ctx.run("deep", nested, levels, math.nan)
    if where == "call":
        ctx.step("deep", "set", values={"x": nested(levels)})
    if where == "branch":
        ctx.parallel("fan", lambda c: nested(levels), lambda c: c.run("b", str))
    return nested(levels)


@pytest.mark.parametrize("levels", [40, 5000])  # 5000: deeper than json.dumps recurses
@pytest.mark.parametrize(
    ("where", "error"),
    [
        ("result", "result_too_large: deep nests deeper than 32 levels"),
        ("call", "invalid_code_step: deep nests deeper than 32 levels"),
        ("branch", "step 'fan.0' failed: result_too_large: fan.0 nests deeper than 32 levels"),
        ("output", "output_too_large: output nests deeper than 32 levels"),
        ("nan", "unserialisable_result: step 'deep': not JSON: "),
    ],
)
def test_a_value_nested_too_deep_fails_the_run_with_its_size_code_however_deep(
    org: Organisation, levels: int, where: str, error: str
) -> None:
    """A ctx.run result, a step's call, a branch's value and the output are held to 32
    levels of nesting, as an input is, also past the depth json.dumps recurses through
    (it raised RecursionError: workflow_failed, or an engine_error for a branch's)."""
    t = WorkflowTest(org=org)
    t.start("code-deep", version=1, input={"levels": levels, "where": where})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert run.error == error or (error.endswith(": ") and run.error.startswith(error)), run.error


def huge_number(digits: int) -> int:
    return int(10 ** (digits - 1))


@workflow("code-huge-number", version=1)
def huge_numbers(ctx: Context, run_input: dict[str, Any]) -> Any:
    digits = int(run_input["digits"])
    if run_input["where"] == "result":
        ctx.run("huge", huge_number, digits)
    return {"n": huge_number(digits)}


@pytest.mark.parametrize(("where", "step"), [("result", "huge"), ("output", "output")])
def test_a_number_past_the_digits_python_writes_is_not_json_and_one_within_them_is(
    org: Organisation, where: str, step: str
) -> None:
    """Past 4300 digits json.dumps refuses an int (sys.get_int_max_str_digits): the run
    failed with workflow_failed: ValueError; it is unserialisable_result, as NaN is."""
    t = WorkflowTest(org=org)
    t.start("code-huge-number", version=1, input={"digits": 5000, "where": where})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert run.error.startswith(f"unserialisable_result: step {step!r}: not JSON: "), run.error
    fine = WorkflowTest(org=org)
    fine.start("code-huge-number", version=1, input={"digits": 4300, "where": where},
               start_key="fine")  # fmt: skip
    assert fine.run_until_finished().output == {"n": 10**4299}


def numbered(keys: list[Any]) -> dict[Any, str]:
    return {key: f"value {n}" for n, key in enumerate(keys)}


@workflow("code-json-keys", version=1)
def json_keys(ctx: Context, run_input: dict[str, Any]) -> Any:
    keys = [1, "1"] if run_input["collide"] else [1, 2]
    where = run_input["where"]
    if where == "result":
        return ctx.run("keys", numbered, keys)
    if where == "call":
        ctx.step("keys", "set", values={"x": {"nested": numbered(keys)}})
    return [numbered(keys)]


@pytest.mark.parametrize(
    ("where", "step", "code"),
    [("result", "keys", "unserialisable_result"), ("call", "keys", "invalid_code_step"),
     ("output", "output", "unserialisable_result")],
)  # fmt: skip
def test_keys_json_writes_the_same_are_refused_and_other_keys_are_read_back_as_json_keeps_them(
    org: Organisation, where: str, step: str, code: str
) -> None:
    """JSON writes the dict key 1 as "1": a dict holding both kept only the last of the two
    values, silently. It is now unserialisable_result (invalid_code_step in a call's
    fields), naming both keys. Keys that do not collide are stored as JSON writes them, and
    the code reads them back so."""
    t = WorkflowTest(org=org)
    t.start("code-json-keys", version=1, input={"collide": True, "where": where})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert run.error == (
        f"{code}: step {step!r}: not JSON: the keys 1 and '1' of one dict are "
        "both '1' in JSON, and one of the two values would be lost"
    ), run.error
    fine = WorkflowTest(org=org)
    fine.start("code-json-keys", version=1, input={"collide": False, "where": where},
               start_key="fine")  # fmt: skip
    finished = fine.run_until_finished()
    assert finished.status == "succeeded", finished.error
    if where != "call":
        read_back = {"1": "value 0", "2": "value 1"}
        assert finished.output == (read_back if where == "result" else [read_back])


@workflow("code-end-step", version=1, output_schema={"type": "integer"})
def calls_an_end_step(ctx: Context, run_input: dict[str, Any]) -> int:
    where = run_input["where"]
    ctx.run("first", str, "x")
    if where == "top":
        ctx.step("stop", "end", output={"not": "an integer"})
    if where == "branch":
        ctx.parallel("fan", lambda c: c.step("stop", "end"), lambda c: c.sleep("nap", "1h"))
    if where == "compensation":
        ctx.compensate_with("stop", "end", status="failed")
    ctx.run("last", str, "y")
    return 1


@pytest.mark.parametrize(
    ("where", "failed"), [("top", ""), ("branch", "step 'fan.0' failed: "), ("compensation", "")]
)
def test_an_end_step_called_from_code_is_refused_not_the_run_s_end(
    org: Organisation, where: str, failed: str
) -> None:
    """An end step ended the run under the function: succeeded with an output its schema
    refuses and its later steps never called, or (in a branch) the other branch cut."""
    t = WorkflowTest(org=org)
    t.start("code-end-step", version=1, input={"where": where})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert run.error == (
        f"{failed}invalid_code_step: step 'stop': type 'end' ends a run's path and cannot be "
        "called from code: the run ends when the function returns (or calls ctx.fail)"
    )
    assert "stop" not in [s.step_id for s in run.steps]


@workflow("code-conflict-in-branch", version=1)
def top_then_branch(ctx: Context, run_input: dict[str, Any]) -> Any:
    ctx.run("x", str, "top")
    return ctx.parallel("fan", lambda c: c.sleep("x", "1s"), lambda c: c.run("y", str, "y"))


@workflow("code-conflict-across-branches", version=1)
def sibling_branches(ctx: Context, run_input: dict[str, Any]) -> Any:
    return ctx.parallel("fan", lambda c: c.run("s", str, "left"), lambda c: c.step("s", "noop"))


@workflow("code-conflict-compensation", version=1)
def compensation_then_call(ctx: Context, run_input: dict[str, Any]) -> Any:
    ctx.run("reserve", str, "r")
    ctx.compensate_with("undo", "noop")
    return ctx.run("undo", str, "u")


@workflow("code-conflict-call-then-compensation", version=1)
def call_then_compensation(ctx: Context, run_input: dict[str, Any]) -> Any:
    ctx.run("undo", str, "u")
    ctx.compensate_with("undo", "noop")
    return "unreachable"


@pytest.mark.parametrize(
    ("name", "status", "conflict"),
    [
        ("code-conflict-in-branch", "failed", "'x' was entered as ctx.run in this run, and "
         "the code now calls it as a wait step"),
        # Whichever branch asked first, the other meets its step.
        ("code-conflict-across-branches", "failed", "'s' was entered as "),
        # The code failed after registering a compensation: it runs, as for any failure.
        ("code-conflict-compensation", "compensated", "'undo' was entered as a noop step in "
         "this run, and the code now calls it as ctx.run"),
        ("code-conflict-call-then-compensation", "failed", "'undo' was entered as ctx.run in "
         "this run, and the code now calls it as a noop step"),
    ],
)  # fmt: skip
def test_one_step_id_as_two_types_fails_in_a_branch_and_for_a_compensation_too(
    org: Organisation, name: str, status: str, conflict: str
) -> None:
    t = WorkflowTest(org=org)
    t.start(name, version=1)
    run = t.run_until_finished()
    assert run.status == status, run.error
    # (A branch's failure is its decider's: "step 'fan.0' failed: <code>: ...".)
    assert f"step_type_conflict: step {conflict}" in run.error, run.error


@workflow("code-big-call", version=1)
def big_call(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.step("noted", "set", values={"text": "x" * int(run_input["size"])})


def test_a_step_call_past_the_size_limit_fails_the_run_before_anything_stores_it(
    org: Organisation, settings: Any
) -> None:
    settings.WAYMARK = {**settings.WAYMARK, "MAX_INPUT_BYTES": 1000}
    t = WorkflowTest(org=org)
    t.start("code-big-call", version=1, input={"size": 2000})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert run.error.startswith("invalid_code_step: The call of step 'noted' is "), run.error
    assert run.steps == []
    stored = Step.objects.filter(run_id=run.id).values_list("output", flat=True)
    assert all("x" * 1000 not in json.dumps(output) for output in stored)
    assert "x" * 1000 not in json.dumps(Run.objects.get(pk=run.id).outputs)


@workflow("code-big-output", version=1)
def big_output(ctx: Context, run_input: dict[str, Any]) -> str:
    return "x" * int(run_input["size"])


def test_an_output_past_the_size_limit_fails_the_run_and_so_does_a_too_large_input(
    org: Organisation, api: APIClient, settings: Any
) -> None:
    settings.WAYMARK = {**settings.WAYMARK, "MAX_INPUT_BYTES": 1000}
    t = WorkflowTest(org=org)
    t.start("code-big-output", version=1, input={"size": 2000})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert run.error == (
        "output_too_large: The workflow's output is 2002 bytes; the limit is 1000."
    )
    refused = start(api, "code-big-output", {"size": "x" * 1000}, key="big")
    assert (refused.status_code, refused.json()["code"]) == (413, "payload_too_large")


def test_calling_one_id_again_as_the_same_type_is_its_next_iteration(org: Organisation) -> None:
    # Not a conflict: the check is per step type, not per id.
    @workflow("code-again", version=1)
    def again(ctx: Context, run_input: dict[str, Any]) -> int:
        return int(ctx.run("n", int, 1)) + int(ctx.run("n", int, 2))

    try:
        t = WorkflowTest(org=org)
        t.start("code-again", version=1, input={})
        run = t.run_until_finished()
        assert (run.status, run.output) == ("succeeded", 3)
        assert [(s.step_id, s.iteration) for s in run.steps] == [("n", 1), ("n", 2)]
    finally:
        unregister("code-again", 1)


# --- on a real worker process --------------------------------------------------------------


def io_worker_logged_to(log: Path) -> subprocess.Popen[bytes]:
    """An io worker process (the lane a code workflow's function runs on) that registers
    the bad workflows as a host's ready() would, everything it says written to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "manage.py", "worker", "--lane", "io", "--concurrency", "2",
             "--grace", "2"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env=engine_env(WAYMARK_EXTRA_STEP_MODULES="tests.code_workflow_bad_input"),
        )  # fmt: skip


def test_no_mistake_of_the_code_leaves_a_traceback_in_a_worker_s_log(
    org: Organisation, api: APIClient, tmp_path: Path
) -> None:
    """Each bad workflow's run is started through the API and run by a worker process; a
    version that process does not register waits. Each run ends (or waits) with its code,
    and the worker's log holds no traceback."""

    @workflow("code-only-here", version=1)  # registered in this process, not the worker's
    def only_here(ctx: Context, run_input: dict[str, Any]) -> str:
        return "never run by the worker"

    try:
        runs = {}
        for name in [*BAD_INPUT, "code-only-here"]:
            publish_code_workflow(org=org, name=name, version=1)
            answer = start(api, name, {"size": 70_000}, key=name)
            assert answer.status_code == 201, answer.json()
            runs[name] = int(answer.json()["id"])
    finally:
        unregister("code-only-here", 1)

    def ended() -> bool:
        failed = Run.objects.filter(pk__in=[runs[n] for n in BAD_INPUT], status="failed")
        waits = RunEvent.objects.filter(run_id=runs["code-only-here"], kind="step.deferred")
        return failed.count() == len(BAD_INPUT) and waits.exists()

    log = tmp_path / "worker.log"
    worker = io_worker_logged_to(log)
    with running(worker):
        wait_for(ended, what="every bad run to fail and the missing version to wait")
        assert stop(worker) == 0
    said = log.read_text()
    assert "Traceback" not in said and "engine_error" not in said, said
    for name, code in BAD_INPUT.items():
        run = Run.objects.get(pk=runs[name])
        assert run.error.startswith(f"{code}: "), (name, run.error)
    waiting = Run.objects.get(pk=runs["code-only-here"])
    assert waiting.status == "running"
    deferred = RunEvent.objects.get(run_id=waiting.pk, kind="step.deferred")
    assert deferred.detail is not None
    assert "workflow_version_missing" in deferred.detail["error"]
