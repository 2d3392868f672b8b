"""Workflows written as Python code (workflows/code, docs/reference/code-workflows.md), on the real
engine and database: started through the API, each ctx step a step row with its events,
driven by a real Worker's code path (claim, execute, settle) and the timer sweep."""

from __future__ import annotations

import io
import re
import subprocess
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from effects.models import Effect
from timers.models import Timer
from timers.sweep import fire_due_timers
from workflows.code.publish import code_definition
from workflows.code.registry import registered, unregister
from workflows.engine.executors import StepResult
from workflows.engine.health import EXIT_BROKEN
from workflows.engine.places import TOP
from workflows.engine.speculative import NoDatabase, walked_ahead
from workflows.engine.walk import RunState, Walk
from workflows.models import Organisation, Run, RunEvent, Step
from workflows.plugins.code import (
    CodeWorkflowError,
    Context,
    publish_code_workflow,
    workflow,
)
from workflows.services.runs import _LAST_SEEN, run_start

from . import code_workflow_steps  # noqa: F401 (registers "code-crash" here too)
from .effect_setup import connect, drive
from .processes import running, spawn, stop, wait_for
from .stubs import ProviderStub
from .test_doctor import broken_runs, doctor, finding
from .test_run_graph import node_states
from .test_timers import make_due

# --- the workflows under test (registered once, as a host's AppConfig.ready() would) -------


def price_of(items: list[int]) -> int:
    return sum(items)


def receipt_for(item_id: str, total: int) -> dict[str, Any]:
    return {"charge": item_id, "total": total}


@workflow("code-order", version=1)
def order(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    total = ctx.run("price", price_of, run_input["items"])
    ctx.sleep("cool_off", "2s")
    created = ctx.http(
        "charge", connection="api", method="POST", url=f"{run_input['url']}/items",
        body={"total": total},
    )  # fmt: skip
    return ctx.run("receipt", receipt_for, created["body"]["id"], total)  # type: ignore[no-any-return]


pytestmark = pytest.mark.django_db(transaction=True)

FLIPPED = {"order": False}  # what the next replay of "code-flip" calls first


@workflow("code-flip", version=1)
def flip(ctx: Context, run_input: dict[str, Any]) -> str:
    first = "b" if FLIPPED["order"] else "a"
    ctx.run(first, str, first)
    ctx.sleep("nap", "1s")
    return "done"


@workflow("code-fails", version=1)
def fails(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.run("look", str, "x")
    ctx.fail("out_of_stock")


def code_worker(**env: str) -> subprocess.Popen[bytes]:
    """An io worker process that registers the crash tests' code workflow at start."""
    modules = "tests.probe_steps,tests.code_workflow_steps"
    return spawn("worker", "--lane", "io", "--concurrency", "2", "--grace", "5",
                 WAYMARK_EXTRA_STEP_MODULES=modules, **env)  # fmt: skip


def start_through_api(api: APIClient, slug: str, run_input: dict[str, Any], key: str) -> int:
    body = {"automation": slug, "input": run_input, "start_key": key}
    response = api.post("/api/v1/runs", body, format="json")
    assert response.status_code in (200, 201), response.json()
    return int(response.json()["id"])


def forget_last_seen(org_id: int, slug: str) -> None:
    _LAST_SEEN.forget(org_id, slug)


def fire_timers_of(run_id: int) -> None:
    make_due(run_id=run_id)
    assert fire_due_timers().fired == 1


def path_of(run_id: int) -> list[tuple[str, int, str, str]]:
    steps = Step.objects.filter(run_id=run_id).order_by("id")
    return [(s.step_id, s.iteration, s.type, s.status) for s in steps]


# --- the vertical slice ---------------------------------------------------------------------


def test_a_code_workflow_runs_its_steps_as_step_rows_through_the_api(
    org: Organisation, api: APIClient, provider_stub: ProviderStub, admin_client: Client
) -> None:
    connect(org, base_url=provider_stub.url)
    publish_code_workflow(org=org, name="code-order", version=1)
    run_input = {"items": [2, 3, 4], "url": provider_stub.url}
    run_id = start_through_api(api, "code-order", run_input, key="o1")

    drive()  # decides, records the price, decides again, sleeps: the worker is free
    run = Run.objects.get(pk=run_id)
    assert run.status == "running"
    nap = Step.objects.get(run_id=run_id, step_id="cool_off")
    assert (nap.type, nap.status, nap.wait_kind) == ("wait", "waiting", "external")
    assert Timer.objects.filter(run_id=run_id, fired_at__isnull=True).count() == 1
    assert provider_stub.created == []

    fire_timers_of(run_id)
    drive()
    run.refresh_from_db()
    assert (run.status, run.error) == ("succeeded", ""), run.error
    assert run.output == {"charge": "item_1", "total": 9}
    assert [item["body"] for item in provider_stub.created] == [{"total": 9}]
    assert path_of(run_id) == [
        ("decide", 1, "code", "done"),
        ("price", 1, "code_result", "done"),
        ("decide", 2, "code", "done"),
        ("cool_off", 1, "wait", "done"),
        ("decide", 3, "code", "done"),
        ("charge", 1, "http", "done"),
        ("decide", 4, "code", "done"),
        ("receipt", 1, "code_result", "done"),
        ("decide", 5, "code", "done"),
    ]
    succeeded = RunEvent.objects.filter(run_id=run_id, kind="step.succeeded")
    assert {e.step_id for e in succeeded} == {"decide", "price", "charge", "receipt"}
    assert RunEvent.objects.filter(run_id=run_id, kind="step.timer_fired",
                                   step_id="cool_off").count() == 1  # fmt: skip
    assert RunEvent.objects.filter(run_id=run_id, kind="run.succeeded").count() == 1
    # The effect went through the ledger under the step's key, as a definition's does.
    assert str(provider_stub.created[0]["key"]).startswith(f"{run_id}/charge/1")
    assert list(Effect.objects.filter(run_id=run_id).values_list("key", flat=True)) == [
        f"{run_id}/charge/1"
    ]

    # What reads runs reads a code run's rows as any run's: the API, the run page, the CLI.
    for path in ("", "/steps", "/history"):
        assert api.get(f"/api/v1/runs/{run_id}{path}").status_code == 200, path
    steps = api.get(f"/api/v1/runs/{run_id}/steps").json()
    listed = steps["results"] if isinstance(steps, dict) else steps
    assert {"price", "cool_off", "charge", "receipt"} <= {s["step_id"] for s in listed}
    page = admin_client.get(f"/admin/workflows/run/{run_id}/change/")
    assert page.status_code == 200
    assert "charge" in page.content.decode()
    shown = io.StringIO()
    call_command("runs", "show", "--org", org.slug, str(run_id), stdout=shown)
    assert "charge" in shown.getvalue()


def test_the_run_page_draws_the_steps_a_code_run_took_in_call_order(
    org: Organisation, api: APIClient, provider_stub: ProviderStub, admin_client: Client
) -> None:
    connect(org, base_url=provider_stub.url)
    publish_code_workflow(org=org, name="code-order", version=1)
    run_input = {"items": [1], "url": provider_stub.url}
    run_id = start_through_api(api, "code-order", run_input, key="g1")
    drive()  # price recorded, cool_off waiting
    html = admin_client.get(f"/admin/workflows/run/{run_id}/change/").content.decode()
    assert node_states(html) == {"price": "done", "cool_off": "waiting"}

    fire_timers_of(run_id)
    drive()
    assert Run.objects.get(pk=run_id).status == "succeeded"
    html = admin_client.get(f"/admin/workflows/run/{run_id}/change/").content.decode()
    # Each step the code called, in call order, the decide turns between them left out.
    assert list(node_states(html).items()) == [
        ("price", "done"), ("cool_off", "done"), ("charge", "done"), ("receipt", "done"),
    ]  # fmt: skip
    assert html.count('class="edge edge-next taken"') == 3
    layer = {sid: int(y) for sid, y in re.findall(r'data-step="([^"]+)"[^>]*>\s*<title>'
                                                  r'[^<]*</title>\s*<rect x="\d+" y="(\d+)"',
                                                  html)}  # fmt: skip
    assert layer["price"] < layer["cool_off"] < layer["charge"] < layer["receipt"]


def test_a_workflow_named_for_other_organisations_is_neither_published_nor_started(
    org: Organisation, api: APIClient
) -> None:
    @workflow("code-scoped", version=1, organisations=[org.slug])
    def scoped(ctx: Context, run_input: dict[str, Any]) -> str:
        return "done"

    try:
        publish_code_workflow(org=org, name="code-scoped", version=1)
        first = start_through_api(api, "code-scoped", {}, key="s1")
        # A later deploy names only another organisation: no one publishes it here again,
        # and no start writes a run, whether the start path read the version before or not.
        unregister("code-scoped", 1)
        workflow("code-scoped", version=1, organisations=["someone-else"])(scoped)
        with pytest.raises(CodeWorkflowError) as refused:
            publish_code_workflow(org=org, name="code-scoped", version=1)
        assert refused.value.code == "workflow_not_allowed"
        for key in ("s2", "s3"):
            response = api.post("/api/v1/runs", {"automation": "code-scoped", "input": {},
                                                 "start_key": key}, format="json")  # fmt: skip
            assert response.status_code == 403, response.json()
            assert response.json()["code"] == "workflow_not_allowed"
            forget_last_seen(org.pk, "code-scoped")  # the next start looks the version up
        assert list(Run.objects.filter(org=org).values_list("pk", flat=True)) == [first]
        assert not RunEvent.objects.exclude(run_id=first).exists()
    finally:
        unregister("code-scoped", 1)


def test_organisations_must_be_all_or_a_list_of_slugs() -> None:
    for bad in ("acme", [], ["not a slug"], [7]):
        with pytest.raises(CodeWorkflowError) as refused:
            workflow("code-bad-orgs", version=1, organisations=bad)  # type: ignore[arg-type]
        assert refused.value.code == "invalid_workflow"


def test_the_same_start_key_returns_the_same_code_run(org: Organisation, api: APIClient) -> None:
    publish_code_workflow(org=org, name="code-flip", version=1)
    first = run_start(org=org, automation_slug="code-flip", run_input={}, start_key="same")
    # The second start tries the one-statement start (the version is now known): a code run
    # is handed to the ordinary start, which finds the key's run.
    again = run_start(org=org, automation_slug="code-flip", run_input={}, start_key="same")
    other = run_start(org=org, automation_slug="code-flip", run_input={}, start_key="other")
    assert (again.run_id, again.created) == (first.run_id, False)
    assert other.created and other.run_id != first.run_id
    assert path_of(other.run_id) == [("decide", 1, "code", "ready")]


def test_code_that_takes_another_path_than_its_history_fails_the_run_loudly(
    org: Organisation,
) -> None:
    publish_code_workflow(org=org, name="code-flip", version=1)
    run_id = run_start(org=org, automation_slug="code-flip", run_input={}, start_key="f").run_id
    FLIPPED["order"] = False
    drive()
    assert Step.objects.get(run_id=run_id, step_id="nap").status == "waiting"
    FLIPPED["order"] = True  # the code changed under the waiting run
    try:
        fire_timers_of(run_id)
        drive()
    finally:
        FLIPPED["order"] = False
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"
    assert "nondeterministic_workflow" in run.error
    assert "'a' (code_result)" in run.error and "'b' (code_result)" in run.error
    assert not Step.objects.filter(run_id=run_id, step_id="b").exists()


def test_ctx_fail_fails_the_run_with_its_reason(org: Organisation) -> None:
    publish_code_workflow(org=org, name="code-fails", version=1)
    run_id = run_start(org=org, automation_slug="code-fails", run_input={}, start_key="x").run_id
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"
    assert "workflow_failed: out_of_stock" in run.error
    assert Step.objects.get(run_id=run_id, step_id="look").status == "done"


def test_a_name_and_version_registered_twice_is_refused_at_registration() -> None:
    with pytest.raises(CodeWorkflowError) as refused:

        @workflow("code-order", version=1)
        def again(ctx: Context, run_input: dict[str, Any]) -> None:
            return None

    assert refused.value.code == "workflow_already_registered"
    assert "code-order" in refused.value.detail
    # Both places named: the registration kept, and the one refused.
    assert "tests.test_code_workflows.test_a_name_and_version_registered_twice" in (
        refused.value.detail
    )


def test_a_function_the_engine_cannot_call_as_a_workflow_is_refused_at_registration() -> None:
    async def awaited(ctx: Context, run_input: dict[str, Any]) -> None:
        return None

    def input_only(run_input: dict[str, Any]) -> None:
        return None

    def three(ctx: Context, run_input: dict[str, Any], more: int) -> None:
        return None

    def with_defaults(ctx: Context, run_input: Any = None, more: int = 1) -> None:
        return None

    for bad, why in ((awaited, "an async function"), (input_only, "takes (run_input"),
                     (three, "takes (ctx"), ("fulfil", "not a function")):  # fmt: skip
        with pytest.raises(CodeWorkflowError) as refused:
            workflow("code-uncallable", version=1)(bad)  # type: ignore[type-var]
        assert refused.value.code == "invalid_workflow"
        assert why in refused.value.detail, refused.value.detail
        assert registered("code-uncallable", 1) is None
    workflow("code-uncallable", version=1)(with_defaults)  # two it can be called with
    unregister("code-uncallable", 1)


def test_a_decorator_without_its_name_or_version_says_how_to_write_it() -> None:
    """A bare ``@workflow`` (the function taken for the name) and one without ``version=``
    raised Python's own TypeError, with no code."""

    def fulfil(ctx: Context, run_input: Any) -> None:
        return None

    with pytest.raises(CodeWorkflowError, match=r"needs a name and a version") as bare:
        workflow(fulfil)  # type: ignore[arg-type]
    with pytest.raises(CodeWorkflowError, match=r"a version is required") as unversioned:
        workflow("code-unversioned")(fulfil)
    assert bare.value.code == unversioned.value.code == "invalid_workflow"


def test_publishing_a_version_that_is_not_registered_is_refused(org: Organisation) -> None:
    with pytest.raises(CodeWorkflowError) as refused:
        publish_code_workflow(org=org, name="code-order", version=7)
    assert refused.value.code == "workflow_version_missing"


@workflow("code-signal", version=1)
def awaits_signal(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    got = ctx.wait_signal("paid", signal="paid", correlation=run_input["order"], timeout="1h")
    return {"timed_out": got.timed_out, "payload": got.payload}


def test_a_signal_wait_holds_no_worker_and_its_payload_comes_back(
    org: Organisation, api: APIClient
) -> None:
    publish_code_workflow(org=org, name="code-signal", version=1)
    run_id = start_through_api(api, "code-signal", {"order": "o-7"}, key="s1")
    drive()
    paid = Step.objects.get(run_id=run_id, step_id="paid")
    assert (paid.type, paid.status) == ("wait_signal", "waiting")
    body = {"name": "paid", "correlation": "o-7", "payload": {"amount": 12}}
    response = api.post("/api/v1/signals", body, format="json")
    assert response.status_code in (200, 201, 202), response.json()
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == (
        "succeeded",
        {"timed_out": False, "payload": {"amount": 12}},
    )


def test_a_run_whose_version_is_not_registered_waits_and_goes_on_when_it_is(
    org: Organisation,
) -> None:
    publish_code_workflow(org=org, name="code-fails", version=1)
    run_id = run_start(org=org, automation_slug="code-fails", run_input={}, start_key="m").run_id
    unregister("code-fails", 1)
    try:
        drive(fast_forward=False)
        decide = Step.objects.get(run_id=run_id, step_id="decide")
        assert (decide.status, decide.wait_kind, decide.attempt) == ("waiting", "retry", 1)
        deferred = RunEvent.objects.get(run_id=run_id, kind="step.deferred")
        assert deferred.detail is not None
        assert "workflow_version_missing" in deferred.detail["error"]
    finally:
        workflow("code-fails", version=1)(fails)  # deployed again
    drive()  # fast-forwards the deferral
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and "workflow_failed: out_of_stock" in run.error


def test_the_doctor_names_a_run_waiting_for_a_missing_version_and_not_as_stranded(
    org: Organisation, admin_client: Client
) -> None:
    publish_code_workflow(org=org, name="code-fails", version=1)
    run_id = run_start(org=org, automation_slug="code-fails", run_input={}, start_key="d").run_id
    code, report = doctor()
    assert finding(report, "workflows.workflow_version_missing")["severity"] == "ok"
    unregister("code-fails", 1)
    try:
        drive(fast_forward=False)  # its decide step is deferred: the version is missing
        code, report = doctor()
    finally:
        workflow("code-fails", version=1)(fails)
    assert code == EXIT_BROKEN
    missing = broken_runs(report, "workflows.workflow_version_missing")
    assert list(missing) == [run_id]
    assert missing[run_id].startswith("workflow_version_missing: 'code-fails' version 1 ")
    # The deferral is a durable way forward: the run is not stranded, nor late.
    assert finding(report, "workflows.stranded_runs")["severity"] == "ok"
    assert finding(report, "workflows.late_wakes")["severity"] == "ok"
    assert report["broken"] == ["workflows.workflow_version_missing"]
    # The run page says why it waits: the deferral's event, with its error.
    html = admin_client.get(f"/admin/workflows/run/{run_id}/change/").content.decode()
    assert "step.deferred" in html
    assert "workflow_version_missing: &#x27;code-fails&#x27; version 1" in html

    drive()  # deployed again: the run goes on, and nothing is reported any more
    assert Run.objects.get(pk=run_id).status == "failed"
    assert finding(doctor()[1], "workflows.workflow_version_missing")["severity"] == "ok"


# --- a worker killed mid-run ----------------------------------------------------------------


@pytest.mark.parametrize(
    "point",
    [
        "settle.after_step_update",  # the first decide's settle: nothing of it committed
        "effect.after_answer",  # the provider created the charge; its answer is not recorded
    ],
)
def test_a_worker_killed_mid_run_repeats_no_effect(
    org: Organisation, provider_stub: ProviderStub, point: str
) -> None:
    provider_stub.idempotent = True
    connect(org, base_url=provider_stub.url, options={"idempotency_keys": True},
            timeout_seconds=3)  # fmt: skip
    publish_code_workflow(org=org, name="code-crash", version=1)
    run_input = {"items": [4, 5], "url": provider_stub.url}
    run_id = run_start(org=org, automation_slug="code-crash", run_input=run_input,
                       start_key="c").run_id  # fmt: skip
    a = code_worker(WAYMARK_CRASH_AT=point)
    with running(a):
        assert a.wait(timeout=120) == 137, "worker A should have died at the crash point"
    b = code_worker()
    with running(b):
        wait_for(lambda: Run.objects.get(pk=run_id).status != "running", what="the run to end")
        stop(b)
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("succeeded", "")
    assert [item["body"] for item in provider_stub.created] == [{"total": 9}]
    assert run.output == {"charge": provider_stub.created[0]["id"], "total": 9}
    assert Step.objects.filter(run_id=run_id, step_id="charge").count() == 1


# --- the fast paths -------------------------------------------------------------------------


def test_fast_paths_walk_a_code_run_ahead_only_from_what_its_last_turn_knew() -> None:
    """A hop, a group of hops and the one-statement start walk ahead of their transaction
    (engine/speculative.py), from the run's row alone. A code run's start and its decider's
    end are walked ahead; a step it asked for ending runs the next turn, which reads the
    run's history: ahead only from the history the turn that asked for the step knew
    (Walk.carried), else the ordinary walk reads it under the run's lock. What each path
    writes is held equal in tests/test_code_decided_inline.py."""
    definition = code_definition("code-order", 1)
    charge = {"id": "charge", "type": "http", "request": {"method": "POST", "url": "http://x/"}}
    state = RunState(
        id=1, org_id=1, version_id=1, status="running", input={}, vars={},
        outputs={"decide": {"call": charge}}, entered={"decide": 1, "charge": 1},
        steps_executed=2, max_steps=100, expired=False, created_at=timezone.now(),
    )  # fmt: skip

    def ahead(transition: Callable[[Walk], None], run: RunState = state) -> bool:
        # As a hop's walk: a worker's settle, where a turn may run inline.
        walk = Walk(NoDatabase(), run, definition, speculative=True, decide_inline=True)
        return walked_ahead(lambda: transition(walk), run_id=1)

    fresh = replace(state, outputs={}, entered={}, steps_executed=0)
    start = Walk(NoDatabase(), fresh, definition, speculative=True)  # a start runs no turn
    assert walked_ahead(start.start, run_id=1)
    assert [row.status for row in start.new_steps] == ["ready"]
    succeeded = StepResult(output={"status": 200, "body": {}})
    assert not ahead(lambda walk: walk.worker_step_succeeded("charge", 1, 1, succeeded, TOP))
    ended = StepResult(output={"total": 9}, finish="succeeded")
    assert ahead(lambda walk: walk.worker_step_succeeded("decide", 2, 1, ended, TOP))


def test_a_tenant_cannot_write_a_code_step_in_a_definition(api: APIClient) -> None:
    """Only the host publishes a code workflow for an organisation: a definition sent
    through the API naming a host's workflow would run the host's code with the tenant's
    input."""
    assert api.post("/api/v1/automations", {"slug": "sneaky"}, format="json").status_code == 201
    definition = code_definition("code-order", 1)
    response = api.post("/api/v1/automations/sneaky/versions", {"definition": definition},
                        format="json")  # fmt: skip
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_definition"
    assert [e["code"] for e in response.json()["errors"]] == ["code_step_not_allowed"]


def test_a_step_that_fails_for_good_fails_the_run_with_its_error(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    connect(org, base_url=provider_stub.url)
    provider_stub.fail_next(1, status=400)  # a refused request: not retried
    publish_code_workflow(org=org, name="code-crash", version=1)
    run_input = {"items": [1], "url": provider_stub.url}
    run_id = run_start(org=org, automation_slug="code-crash", run_input=run_input,
                       start_key="refused").run_id  # fmt: skip
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"
    assert run.error.startswith("step 'charge' failed: ")
    assert Step.objects.get(run_id=run_id, step_id="charge").status == "failed"
    assert not Step.objects.filter(run_id=run_id, step_id="receipt").exists()
    # The failure goes back to the function (a third turn), which does not catch it.
    assert Step.objects.filter(run_id=run_id, step_id="decide").count() == 3
