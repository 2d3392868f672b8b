"""Templates and definitions cannot exhaust memory or CPU (the "Hostile tenants" issue, 1).

Every bomb an attacker sent with one ordinary API key is bounded here: rendered directly,
by a worker-lane step in a real `manage.py worker` process, and by an inline `set` step of a
run started through the API. Oversized definitions are refused before they cost much: the
template tokens a refusal lexes stop at the cap, whatever follows (counted, not timed).
Ordinary templates render as before, in-process when provably cheap (the fast path must
render exactly what Jinja renders).

Time bounds are structural, never tuned to an idle machine: a caller always returns within
TEMPLATE_WAIT_SECONDS (plus slack for process start-up); validation cost is the number of
template tokens lexed, which does not depend on the machine.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import psutil
import pytest
from pytest_django.fixtures import Settings
from rest_framework.test import APIClient

from workflows import steptypes
from workflows.definitions import sandbox
from workflows.definitions.expressions import (
    ExpressionError,
    build_context,
    evaluate_condition,
    render_template,
    render_value,
)
from workflows.definitions.rendering import evaluate_condition_here, render_template_here
from workflows.definitions.validator import validate_definition
from workflows.engine.executors import StepFailure
from workflows.models import Run
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .processes import spawn_worker, wait_for

WAIT_SECONDS = 30.0  # the callers' bound in these tests (generous: the machine is loaded)
SLACK = 15.0  # starting a rendering process, the test's own scheduling

BOMB_INPUT = {"s": "x", "l": [1], "n": 3}
CPU_BOMB = "{% for a in input.s * 60000 %}{% for b in input.s * 60000 %}{% endfor %}{% endfor %}"
MEMORY_BOMBS = {
    "concat doubling": "{% set a = input.s * 60000 %}"
    + "{% set a = a ~ a %}" * 24
    + "{{ a|length }}",
    "plus doubling": "{% set a = input.s * 60000 %}"
    + "{% set a = a + a %}" * 24
    + "{{ a|length }}",
    "join filter": "{% set l = [input.s] * 60000 %}{{ l|join(input.s * 60000)|length }}",
    "str.join": "{% set l = [input.s] * 60000 %}{{ (input.s * 60000).join(l)|length }}",
    "replace filter": "{{ (input.s * 60000)|replace(input.s, input.s * 60000)|length }}",
    "tojson indent": "{% set l = [[input.l]] * 60000 %}{{ l|tojson(indent=60000)|length }}",
    "wordwrap": "{{ ((input.s ~ ' ') * 30000)|wordwrap(1, wrapstring=input.s * 60000)|length }}",
    "batch": "{{ input.l|batch(10**8, input.s)|list|length }}",
    "slice": "{{ input.l|slice(10**7)|list|length }}",
    "int times int": "{% set n = 7 ** 4000 %}" + "{% set n = n * n %}" * 18 + "{{ n > 0 }}",
}
BOUNDED = ("template_limit", "too_large")


@pytest.fixture
def budget(settings: Settings) -> None:
    settings.WAYMARK = {
        **settings.WAYMARK,
        "TEMPLATE_CPU_SECONDS": 1.0,
        "TEMPLATE_MEMORY_MB": 256,
        "TEMPLATE_WAIT_SECONDS": WAIT_SECONDS,
        "TEMPLATE_PROCESSES": 2,
    }


def context(**run_input: Any) -> dict[str, Any]:
    return build_context(run_input=run_input or BOMB_INPUT, run_id=7)


def bounded(render: Any) -> tuple[ExpressionError, float]:
    started = time.monotonic()
    with pytest.raises(ExpressionError) as caught:
        render()
    return caught.value, time.monotonic() - started


# --- the bombs, rendered directly -----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MEMORY_BOMBS))
def test_memory_bombs_are_bounded(budget: None, name: str) -> None:
    me = psutil.Process()
    error, took = bounded(lambda: render_template(MEMORY_BOMBS[name], context()))
    assert error.code in BOUNDED, error
    assert took < WAIT_SECONDS + SLACK
    # It ran elsewhere: this process did not grow by the gigabytes the bomb asked for.
    assert me.memory_info().rss < 1024 * 1024 * 1024


def test_cpu_bomb_stops_at_its_cpu_budget(budget: None) -> None:
    error, took = bounded(lambda: render_template(CPU_BOMB, context()))
    assert error.code == "template_limit"
    assert "CPU" in error.message or "did not finish" in error.message
    assert took < WAIT_SECONDS + SLACK


def test_bombs_in_values_and_conditions_are_bounded(budget: None) -> None:
    error, _ = bounded(lambda: render_value({"a": "{{ input.s }}", "b": [CPU_BOMB]}, context()))
    assert error.code == "template_limit"
    condition = "(input.s * 60000)|replace(input.s, input.s * 60000)|length > 0"
    error, _ = bounded(lambda: evaluate_condition(condition, context()))
    assert error.code in BOUNDED


def test_the_pool_serves_again_after_overruns(budget: None) -> None:
    for _ in range(3):
        error, _ = bounded(lambda: render_template(MEMORY_BOMBS["join filter"], context()))
        assert error.code in BOUNDED
    looped = "{% for t in input.tags %}{{ t|upper }}{% if not loop.last %},{% endif %}{% endfor %}"
    assert render_template(looped, context(tags=["a", "b"])) == "A,B"
    assert sandbox._pool().count <= 2


# --- ordinary templates ---------------------------------------------------------------------

DATA = {
    "name": "Ada",
    "tier": "gold",
    "n": 7,
    "total": 120.5,
    "tags": ["b", "a", "b"],
    "user": {"email": "ada@example.com", "items": [1, 2]},
    "empty": "",
    "text": "  Hi <there>  ",
}
FAST_TEMPLATES = [
    "plain {",
    "Hello {{ input.name }}!",
    "{{ input.user.email }} {{ input['user']['items'][1] }} {{ input.user.items.0 }}",
    "{{ input.n % 2 }} {{ input.n + 1 }} {{ input.total * 2 }} {{ input.n // 2 }} {{ -input.n }}",
    "{{ input.n / 2 }} {{ input.n - 10 }} {{ input.n ** 2 }}",
    "{{ input.tags|length }} {{ input.tags|first }} {{ input.tags|sort|unique|last }}",
    "{{ input.name|upper }} {{ input.text|trim|lower }} {{ input.text|e }} {{ input.user|tojson }}",
    "{{ input.missing|default('none') }} {{ input.empty|default('x', true) }}",
    "{% if input.tier == 'gold' %}VIP{% elif input.n > 3 %}big{% else %}other{% endif %}",
    "{{ 'yes' if input.n is odd else 'no' }} {{ input.coupon is defined }}",
    "{{ input.tier in ['gold', 'silver'] }} {{ 1 < input.n < 10 }} {{ input.n is divisibleby 7 }}",
    "{{ input.user }} {{ input.tags }} {{ run.id }} {{ input.n and input.name or 'z' }}",
    "{{ input.tags|reverse|string }} {{ input.total|int }} {{ input.n|float|abs }}",
    "{{ not input.empty }} {{ input.tags|min }} {{ input.tags|max }}|{{ input.name|title }}",
]
FAST_FAILING = [
    ("{{ input.nmae }}", "undefined_value"),
    ("{{ input.name.upper }}", "not_renderable"),
    ("{{ input.n / 0 }}", "division_by_zero"),
    ("{{ input.name + 1 }}", "invalid_operation"),
    ("{{ input.name * 100000 }}", "too_large"),
    ("{{ input.__class__ }}", "not_allowed"),
    ("{% if input.nope %}x{% endif %}", "undefined_value"),
]
FAST_CONDITIONS = [
    "input.n % 2 == 1",
    "input.tier == 'gold' and input.total > 100",
    "input.coupon is defined",
    "input.tags|length > 2",
    "not input.empty",
    "input.name|lower in ['ada', 'bo']",
    "input.user.items[0] >= 1",
]
POOL_TEMPLATES = [
    "{% for t in input.tags %}{{ t }}{% endfor %}",
    "{{ input.tags|join(', ') }}",
    "{{ input.name ~ '!' }}",
    "{{ input.name.upper() }}",
    "{% set x = input.n %}{{ x }}",
    "{{ input.tags|map('upper')|list }}",
    "{{ input.name|replace('A', 'a') }}",
    "{{ input.name|upper|string|lower }}",  # two growing filters on one chain
    "{{ input.name % input.user }}",  # printf with data on both sides
    "{{ input.text[1:4] }}",
]


def outcome(render: Any) -> tuple[str, Any]:
    try:
        return "ok", render()
    except ExpressionError as exc:
        return "error", exc.code


@pytest.mark.parametrize("template", FAST_TEMPLATES + [t for t, _ in FAST_FAILING])
def test_the_fast_path_renders_exactly_what_jinja_renders(template: str) -> None:
    ctx = context(**DATA)
    assert sandbox._fast_template(template) is not None or "{" not in template
    fast = outcome(lambda: render_template(template, ctx))
    assert fast == outcome(lambda: render_template_here(template, ctx))
    expected = dict(FAST_FAILING).get(template)
    assert fast[0] == ("error" if expected else "ok"), fast
    if expected:
        assert fast[1] == expected


@pytest.mark.parametrize("condition", FAST_CONDITIONS)
def test_fast_conditions_evaluate_like_jinja(condition: str) -> None:
    ctx = context(**DATA)
    assert sandbox._fast_condition(condition) is not None
    assert outcome(lambda: evaluate_condition(condition, ctx)) == outcome(
        lambda: evaluate_condition_here(condition, ctx)
    )


@pytest.mark.parametrize("template", POOL_TEMPLATES)
def test_other_templates_render_in_the_pool_with_the_same_result(
    budget: None, template: str
) -> None:
    ctx = context(**DATA)
    assert sandbox._fast_template(template) is None
    assert outcome(lambda: render_template(template, ctx)) == outcome(
        lambda: render_template_here(template, ctx)
    )


def test_values_mix_fast_and_pool_templates(budget: None) -> None:
    ctx = context(**DATA)
    value = {"a": "{{ input.name }}", "b": [1, "{% for t in input.tags %}{{ t }}{% endfor %}"]}
    assert render_value(value, ctx) == {"a": "Ada", "b": [1, "bab"]}
    with pytest.raises(ExpressionError) as caught:
        render_value({"a": "{{ input.name }}" * 10, "b": "x" * 100}, ctx, max_bytes=50)
    assert caught.value.code == "too_large"


# --- validation -----------------------------------------------------------------------------


def set_definition(values: dict[str, Any]) -> dict[str, Any]:
    return {
        "start": "s",
        "steps": [{"id": "s", "type": "set", "values": values, "next": "done"},
                  {"id": "done", "type": "end"}],
    }  # fmt: skip


def branch_definition(count: int) -> dict[str, Any]:
    when = [{"outcome": f"o{i}", "if": f"input.v=={i}"} for i in range(count)]
    nxt = {case["outcome"]: "done" for case in when} | {"default": "done"}
    return {
        "start": "route",
        "steps": [{"id": "route", "type": "branch", "when": when, "next": nxt},
                  {"id": "done", "type": "end"}],
    }  # fmt: skip


def validate_counted(
    definition: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[tuple[str, str]], int]:
    """Validate; the issues, and how many template tokens the validator lexed to find them.
    The work a refusal costs is counted, not timed: a CPU-time bound would depend on the
    machine, while the count proves the mechanism (it stops at the cap, whatever follows)."""
    lexed = [0]
    counted = sandbox._counted

    def counting(tokens: Any, limit: int) -> Any:
        for token in counted(tokens, limit):
            lexed[0] += 1
            yield token

    monkeypatch.setattr(sandbox, "_counted", counting)
    issues = validate_definition(definition)
    monkeypatch.setattr(sandbox, "_counted", counted)
    return [(i.code, i.message) for i in issues], lexed[0]


def test_a_240_kb_subscript_chain_is_refused_before_it_is_lexed(monkeypatch) -> None:
    definition = set_definition({"x": "{{ input" + "[0]" * 80_000 + " }}"})
    issues, lexed = validate_counted(definition, monkeypatch)
    assert [code for code, _ in issues] == ["template_too_large"]
    assert "MAX_TEMPLATE_BYTES: 16384" in issues[0][1]
    assert lexed == 0  # refused by its size alone


def test_a_4500_condition_branch_is_refused_before_its_conditions_are_lexed(monkeypatch):
    issues, lexed = validate_counted(branch_definition(4_500), monkeypatch)
    assert [code for code, _ in issues] == ["too_many_conditions"]
    assert "4500 conditions" in issues[0][1] and "MAX_BRANCH_CONDITIONS: 64" in issues[0][1]
    assert lexed == 0


def test_dense_templates_are_capped_per_template_and_per_definition(monkeypatch) -> None:
    dense = "{{ input" + "[0]" * 4_000 + " }}"  # 12 KB: under the byte limit, 12000 tokens
    issues, lexed = validate_counted(set_definition({"x": dense}), monkeypatch)
    assert [code for code, _ in issues] == ["template_too_large"]
    assert "MAX_TEMPLATE_TOKENS: 2000" in issues[0][1]
    assert lexed <= 2_000  # lexing stopped at the cap, not at the template's 12,000 tokens
    flat = "{{ [" + ",".join(["1"] * 800) + "] }}"  # 1600 tokens in 1.6 KB, shallow
    many = {f"v{i}": flat for i in range(120)}  # 192,000 tokens in all
    issues, lexed = validate_counted(set_definition(many), monkeypatch)
    assert [code for code, _ in issues] == ["template_too_large"]
    assert "MAX_DEFINITION_TEMPLATE_TOKENS: 50000" in issues[0][1]
    # The definition's budget spent, the templates after it are not lexed at all.
    assert lexed <= 50_000 + 1_600
    deep = "{{ " + "(" * 300 + "input" + ")" * 300 + " }}"
    issues, _ = validate_counted(set_definition({"x": deep}), monkeypatch)
    assert [code for code, _ in issues] == ["template_too_large"]
    assert "MAX_TEMPLATE_DEPTH" in issues[0][1]


def test_ordinary_definitions_stay_valid() -> None:
    assert validate_definition(branch_definition(64)) == []
    values = {
        "a": "{% for t in input.tags %}{{ t }}{% endfor %}",
        "b": "{{ input.x|default('y') }}",
        "c": "{{ input.x|nofilter }}",
    }
    issues = validate_definition(set_definition(values))
    assert [(i.code, i.field) for i in issues] == [("malformed_template", "values.c")]


@pytest.mark.django_db
def test_the_api_refuses_an_oversized_branch_with_its_code(api: APIClient) -> None:
    assert api.post("/api/v1/automations", {"slug": "big"}, format="json").status_code == 201
    response = api.post(
        "/api/v1/automations/big/versions", {"definition": branch_definition(65)}, format="json"
    )
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_definition"
    assert [e["code"] for e in body["errors"]] == ["too_many_conditions"]
    assert "MAX_BRANCH_CONDITIONS" in body["errors"][0]["message"]


# --- in the engine: a worker-lane step, a start's inline walk -------------------------------


def noop_definition(template: str) -> dict[str, Any]:
    return {
        "start": "work",
        "steps": [{"id": "work", "type": "noop", "output": {"x": template}, "next": "done"},
                  {"id": "done", "type": "end", "output": "{{ steps.work.output.x }}"}],
    }  # fmt: skip


def ended(run_id: int) -> Run | None:
    run = Run.objects.get(pk=run_id)
    return run if run.status not in ("running", "paused") else None


@pytest.mark.django_db(transaction=True)
def test_a_worker_step_bomb_fails_with_template_limit_and_the_worker_serves_on(
    org: Any, procs: list[Any]
) -> None:
    bombs = {"cpu": CPU_BOMB, "join": MEMORY_BOMBS["join filter"],
             "double": MEMORY_BOMBS["concat doubling"]}  # fmt: skip
    runs = {}
    for slug, template in bombs.items():
        automation_publish_definition(org=org, slug=slug, definition=noop_definition(template))
        runs[slug] = run_start(org=org, automation_slug=slug, run_input=BOMB_INPUT).run_id
    automation_publish_definition(
        org=org,
        slug="fine",
        definition=noop_definition("{% for t in input.l %}{{ t }}{% endfor %}"),
    )
    worker = spawn_worker(
        concurrency=2,
        WAYMARK_TEMPLATE_CPU_SECONDS="1",
        WAYMARK_TEMPLATE_WAIT_SECONDS=str(WAIT_SECONDS),
        WAYMARK_TEMPLATE_MEMORY_MB="256",
        WAYMARK_IO_LEASE_SECONDS="5",
    )
    procs.append(worker)
    for slug, run_id in runs.items():
        run = wait_for(
            functools.partial(ended, run_id), timeout=3 * (WAIT_SECONDS + SLACK), what=slug
        )
        assert run.status == "failed", (slug, run.error)
        assert "template error: template_limit" in run.error, (slug, run.error)
    # The same worker process serves other runs afterwards, and it did not balloon.
    fine = run_start(org=org, automation_slug="fine", run_input={"l": [1, 2]}).run_id
    run = wait_for(lambda: ended(fine), timeout=WAIT_SECONDS + SLACK, what="the next run")
    assert (run.status, run.output) == ("succeeded", "12")
    assert worker.poll() is None
    assert psutil.Process(worker.pid).memory_info().rss < 512 * 1024 * 1024


@pytest.mark.django_db(transaction=True)
def test_a_start_whose_inline_set_step_is_a_bomb_fails_and_the_api_answers(
    api: APIClient, org: Any, budget: None
) -> None:
    for slug, template in (("cpu", CPU_BOMB), ("mem", MEMORY_BOMBS["replace filter"])):
        automation_publish_definition(
            org=org, slug=slug, definition=set_definition({"x": template})
        )
        started = time.monotonic()
        response = api.post(
            "/api/v1/runs", {"automation": slug, "input": BOMB_INPUT}, format="json"
        )
        assert time.monotonic() - started < WAIT_SECONDS + SLACK
        assert response.status_code == 201, response.json()
        assert response.json()["status"] == "failed"
        detail = api.get(f"/api/v1/runs/{response.json()['id']}").json()
        assert "template error: template_limit" in detail["error"], detail["error"]
    automation_publish_definition(
        org=org, slug="ok", definition=set_definition({"x": "hi {{ input.s }}"})
    )
    response = api.post("/api/v1/runs", {"automation": "ok", "input": BOMB_INPUT}, format="json")
    assert (response.status_code, response.json()["status"]) == (201, "succeeded")


# --- a busy pool is not the template's fault -------------------------------------------------


def test_no_free_renderer_is_a_retryable_failure(settings: Settings) -> None:
    settings.WAYMARK = {**settings.WAYMARK, "TEMPLATE_PROCESSES": 1,
                        "TEMPLATE_WAIT_SECONDS": 0.2, "TEMPLATE_CPU_SECONDS": 0.2}  # fmt: skip
    pool = sandbox._pool()
    limits = sandbox.template_limits()
    held = pool._checkout(limits, time.monotonic() + 60)  # another tenant's bomb, say
    try:
        costly = "{% for x in input.l %}{{ x }}{% endfor %}"
        error, _ = bounded(lambda: render_template(costly, context(l=[1, 2])))
        assert (error.code, error.retryable) == ("renderer_busy", True)
        with pytest.raises(StepFailure) as failure:
            steptypes.render({"v": costly}, context(l=[1, 2]))
        assert failure.value.retryable  # the step is retried, not failed for good
    finally:
        pool._checkin(held, True)
    assert render_template(costly, context(l=[1, 2])) == "12"  # and renders once one is free


def test_a_rendering_child_whose_parent_is_gone_ends_quietly() -> None:
    """Its parent killed (a chaos run's SIGKILL), the child's answer meets a closed pipe: it
    ends with status 0 and writes no traceback into the engine's log."""
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-I", "-c", sandbox._CHILD_CODE, sandbox._ROOT, "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert child.stdout is not None
    child.stdout.close()  # as the parent's end is closed when it dies, before the "ready"
    _, err = child.communicate(timeout=120)
    assert child.returncode == 0, err.decode(errors="replace")
    assert b"Traceback" not in err, err.decode(errors="replace")


def test_a_renderer_that_cannot_start_in_time_is_a_retryable_failure(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a machine too loaded to start a Python process within the wait (found by the chaos
    run: four runs failed for good after a restart), the step is retried, not failed: no
    template was sent yet."""
    monkeypatch.setattr(sandbox, "_POOL", sandbox.RenderPool())  # none idle: one is started
    settings.WAYMARK = {**settings.WAYMARK, "TEMPLATE_WAIT_SECONDS": 0.001,
                        "TEMPLATE_CPU_SECONDS": 0.001}  # fmt: skip
    costly = "{% for x in input.l %}{{ x }}{% endfor %}"
    error, _ = bounded(lambda: render_template(costly, context(l=[1, 2])))
    assert (error.code, error.retryable) == ("renderer_busy", True)
    with pytest.raises(StepFailure) as failure:
        steptypes.render({"v": costly}, context(l=[1, 2]))
    assert failure.value.retryable
