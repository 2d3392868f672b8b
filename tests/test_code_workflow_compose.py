"""Code workflows' features together (docs/reference/code-workflows.md): what each of "Parallel
branches", "Sagas", "When a step fails", "Retries of `ctx.run`" and "Re-running" promises
holds inside a ``ctx.parallel`` branch too, on the real engine and database. Each feature has
its own file; this one holds them where they meet, as users combine them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now

from timers.sweep import fire_due_timers
from workflows import plugins
from workflows.definitions.registry import registry
from workflows.errors import NothingToRetry
from workflows.models import Organisation, Run, Step
from workflows.plugins.code import Context, StepFailed, publish_code_workflow, workflow
from workflows.services.control import run_act
from workflows.services.rerun import rerun
from workflows.services.runs import run_start
from workflows.services.signals import signal_send

from .effect_setup import connect, drive
from .stubs import ProviderStub
from .test_timers import make_due

pytestmark = pytest.mark.django_db(transaction=True)

FLAKY_CALLS: dict[str, int] = {}


def flaky_once(name: str) -> str:
    """Raises the first time it is called for ``name``, then answers."""
    FLAKY_CALLS[name] = FLAKY_CALLS.get(name, 0) + 1
    if FLAKY_CALLS[name] == 1:
        raise ConnectionError(f"{name} unavailable")
    return f"{name} ok"


def _item(ctx: Context, step_id: str, url: str, **body: Any) -> Any:
    """An effect the stub records (POST /items, keyed by the effect key)."""
    made = ctx.http(step_id, connection="api", method="POST", url=f"{url}/items", body=body)
    return made["body"]["id"]


@workflow("code-compose-saga", version=1)
def saga_in_branches(ctx: Context, run_input: dict[str, Any]) -> Any:
    """Each branch charges and registers its refund; after the join the run fails."""
    url = run_input["url"]

    def charge(side: str) -> Any:
        def branch(c: Context) -> Any:
            made = _item(c, "charge", url, op="charge", side=side)
            refund = {"op": "refund", "side": side}
            c.compensate_with_http(
                "refund", connection="api", method="POST", url=f"{url}/items", body=refund
            )
            return made

        return branch

    ctx.parallel("pay", charge("left"), charge("right"))
    if run_input.get("fail"):
        ctx.fail("out_of_stock")
    return "kept"


@workflow("code-compose-failures", version=1)
def failures_in_branches(ctx: Context, run_input: dict[str, Any]) -> Any:
    """One branch retries a flaky function, the other catches a refused call."""
    url, name = run_input["url"], run_input["name"]

    def retried(c: Context) -> Any:
        return c.run("fetch", flaky_once, name, retry={"max_attempts": 3})

    def caught(c: Context) -> Any:
        try:
            c.http("ship", connection="api", method="POST", url=f"{url}/nowhere")
        except StepFailed as failed:
            return {"caught": failed.step_id}
        return {"caught": None}

    return ctx.parallel("both", retried, caught)


@workflow("code-compose-rerun", version=1)
def rerun_around_branches(ctx: Context, run_input: dict[str, Any]) -> Any:
    """Two effects at once, then one after the join."""
    url = run_input["url"]
    pair = ctx.parallel("pair", lambda c: _item(c, "left", url, op="left"),
                        lambda c: _item(c, "right", url, op="right"))  # fmt: skip
    after = _item(ctx, "after", url, op="after")
    return {"pair": pair, "after": after}


FIXED: set[str] = set()  # the names whose lookup works (an operator fixed it)


def look_up(name: str) -> str:
    """Fails until ``name`` is fixed: a function that failed for good, fixed, then retried."""
    if name not in FIXED:
        raise LookupError(f"{name} not found")
    return f"{name} found"


@workflow("code-compose-branch-call", version=1)
def call_in_a_branch(ctx: Context, run_input: dict[str, Any]) -> Any:
    """One branch makes an effect, then calls a function; the other makes an effect. After
    the join, one more effect."""
    url, name = run_input["url"], run_input["name"]

    def looked_up(c: Context) -> Any:
        made = _item(c, "before", url, op="before")
        return {"made": made, "found": c.run("look_up", look_up, name)}

    pair = ctx.parallel("pair", looked_up, lambda c: _item(c, "right", url, op="right"))
    return {"pair": pair, "after": _item(ctx, "after", url, op="after")}


@workflow("code-compose-nested-call", version=1)
def call_in_a_nested_branch(ctx: Context, run_input: dict[str, Any]) -> Any:
    """The same call one parallel deeper: an outer branch forks an inner parallel whose
    first branch makes an effect and calls the function; every other branch makes an
    effect. After the joins, one more effect."""
    url, name = run_input["url"], run_input["name"]

    def looked_up(c: Context) -> Any:
        made = _item(c, "before", url, op="before")
        return {"made": made, "found": c.run("look_up", look_up, name)}

    def inner(c: Context) -> Any:
        return c.parallel("inner", looked_up, lambda d: _item(d, "beside", url, op="beside"))

    pair = ctx.parallel("pair", inner, lambda c: _item(c, "right", url, op="right"))
    return {"pair": pair, "after": _item(ctx, "after", url, op="after")}


@workflow("code-compose-same-id-fails", version=1)
def same_id_fails_on_both_branches(ctx: Context, run_input: dict[str, Any]) -> Any:
    """Both branches call "charge": the first branch's is entered first and fails for good
    last (a 503, then refused), not caught; the second's, after a nap, is refused at once,
    caught."""
    url = run_input["url"]

    def uncaught(c: Context) -> Any:
        return _item(c, "charge", url, op="charge", side="left")

    def caught(c: Context) -> Any:
        c.sleep("nap", "1h")
        try:
            c.http("charge", connection="api", method="POST", url=f"{url}/charges", body={})
        except StepFailed:
            return "caught"
        return "made"

    return ctx.parallel("pay", uncaught, caught)


@workflow("code-compose-nested-sibling", version=1)
def fails_beside_a_nested_parallel(ctx: Context, run_input: dict[str, Any]) -> Any:
    """One branch waits inside a ctx.parallel of its own (a signal on one inner branch, the
    other inner branch not run yet); the other branch's call fails for good."""

    def nested(c: Context) -> Any:
        return c.parallel(
            "inner",
            lambda d: d.wait_signal("paid", signal="paid", correlation=run_input["order"]).payload,
            lambda d: d.run("noted", str, "noted"),
        )

    def failing(c: Context) -> Any:
        return c.run("look_up", look_up, run_input["name"])

    return ctx.parallel("outer", nested, failing)


HANDLED = {"fixed": False}  # whether the code after a caught failure was fixed
BOOMS: list[str] = []  # each call of boom


def boom(name: str) -> str:
    BOOMS.append(name)
    raise LookupError(f"{name} not found")


def _caught_then_failed(ctx: Context, url: str) -> Any:
    """Catches a refused call and a failed function; until fixed, then fails the run."""
    try:
        ctx.http("charge", connection="api", method="POST", url=f"{url}/nowhere")
    except StepFailed:
        try:
            ctx.run("look", boom, "ada")
        except StepFailed:
            if not HANDLED["fixed"]:
                ctx.fail("charge_refused")
            return "handled"
    return "charged"


@workflow("code-compose-caught-then-failed", version=1)
def caught_then_failed(ctx: Context, run_input: dict[str, Any]) -> Any:
    if run_input.get("in_branch"):
        return ctx.parallel("pair", lambda c: _caught_then_failed(c, run_input["url"]),
                            lambda c: c.run("beside", str, "beside"))  # fmt: skip
    return _caught_then_failed(ctx, run_input["url"])


LOOKS: list[str] = []  # each call of look_once


def look_once(name: str) -> str:
    """Fails its first call, then answers."""
    LOOKS.append(name)
    if len(LOOKS) == 1:
        raise LookupError(f"{name} not found")
    return f"{name} found"


@workflow("code-compose-two-retries", version=1)
def two_retries_in_a_branch(ctx: Context, run_input: dict[str, Any]) -> Any:
    """A branch's function fails once, then its send is refused once: two retries."""
    url = run_input["url"]

    def left(c: Context) -> Any:
        found = c.run("look", look_once, "ada")
        c.http("send", connection="api", method="POST", url=f"{url}/charges", body={})
        return found

    return ctx.parallel("pair", left, lambda c: c.run("beside", str, "beside"))


GATE = {"open": False}  # whether the compose_gate step passes
COUNTED: list[str] = []  # each call of counted


def counted(name: str) -> str:
    COUNTED.append(name)
    return name


def _gate(step: Any, context: Any, ctx: plugins.StepContext) -> plugins.StepResult:
    """An inline step that fails for good while the gate is closed (an operator opens it)."""
    if not GATE["open"]:
        raise plugins.StepFailure("gate_closed: the gate is closed", retryable=False)
    return plugins.StepResult(output="passed")


GATE_TYPE = plugins.StepType(
    name="compose_gate",
    lane="inline",
    execute=_gate,
    validate=lambda step, report: None,
    built=True,
)  # registered by its test only: the registry is the process's


@workflow("code-compose-inline-fails", version=1)
def inline_step_fails(ctx: Context, run_input: dict[str, Any]) -> Any:
    """An inline step between two functions fails for good, not caught."""
    first = ctx.run("a", counted, "a")
    passed = ctx.step("gate", "compose_gate")
    return [first, passed, ctx.run("b", counted, "b")]


FIXED_NOW: set[str] = set()  # the names fails_until_fixed answers for
FIX_CALLS: list[str] = []


def fails_until_fixed(name: str) -> str:
    FIX_CALLS.append(name)
    if name not in FIXED_NOW:
        raise LookupError(f"{name} not found")
    return f"{name} found"


@workflow("code-compose-nap-then-call", version=1)
def nap_then_call(ctx: Context, run_input: dict[str, Any]) -> Any:
    """One branch naps, then calls a function; the other calls one that fails first."""

    def left(c: Context) -> Any:
        c.sleep("nap", "1h")
        return c.run("look", fails_until_fixed, "look")

    return ctx.parallel("pair", left, lambda c: c.run("boom", fails_until_fixed, "boom"))


def start(org: Organisation, name: str, run_input: dict[str, Any]) -> int:
    publish_code_workflow(org=org, name=name, version=1)
    return run_start(org=org, automation_slug=name, run_input=run_input, start_key="k").run_id


def made(stub: ProviderStub) -> list[tuple[str, str | None]]:
    return sorted((item["body"]["op"], item["body"].get("side")) for item in stub.created)


@pytest.fixture
def stub(org: Organisation, provider_stub: ProviderStub) -> ProviderStub:
    provider_stub.idempotent = True
    connect(org, base_url=provider_stub.url, options={"idempotency_keys": True})
    return provider_stub


def test_compensations_registered_in_branches_each_run_once_when_the_run_fails_after_the_join(
    org: Organisation, stub: ProviderStub
) -> None:
    run_id = start(org, "code-compose-saga", {"url": stub.url, "fail": True})
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("compensated", "workflow_failed: out_of_stock")
    assert made(stub) == [("charge", "left"), ("charge", "right"),
                          ("refund", "left"), ("refund", "right")]  # fmt: skip
    drive()  # nothing moves any more, nothing is made twice
    assert len(stub.created) == 4


def test_branch_compensations_are_not_run_when_the_run_succeeds(
    org: Organisation, stub: ProviderStub
) -> None:
    run_id = start(org, "code-compose-saga", {"url": stub.url})
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", "kept")
    assert made(stub) == [("charge", "left"), ("charge", "right")]


def test_a_branch_retries_its_function_while_the_other_catches_a_failed_step(
    org: Organisation, stub: ProviderStub
) -> None:
    run_id = start(org, "code-compose-failures", {"url": stub.url, "name": "compose"})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", run.error
    assert run.output == ["compose ok", {"caught": "ship"}]
    assert FLAKY_CALLS["compose"] == 2  # failed once, retried once
    ship = Step.objects.get(run_id=run_id, step_id="ship")
    assert ship.status == "failed" and ship.branch == 1


def test_a_rerun_from_the_parallel_runs_its_branches_again_and_reuses_their_effects(
    org: Organisation, stub: ProviderStub
) -> None:
    run_id = start(org, "code-compose-rerun", {"url": stub.url})
    drive()
    first = Run.objects.get(pk=run_id)
    assert first.status == "succeeded", first.error
    assert len(stub.created) == 3
    rerun(org=org, run_id=run_id, from_step="pair", actor="ops", dry_run=False)
    drive()
    again = Run.objects.get(pk=run_id)
    assert again.status == "succeeded", again.error
    # Effects of the steps set aside are reused, as a definition's re-run reuses them.
    assert again.output == first.output
    assert len(stub.created) == 3
    # The branches were entered again: each branch step has a second row.
    for step_id in ("left", "right", "after"):
        assert Step.objects.filter(run_id=run_id, step_id=step_id).count() == 2, step_id


BROKEN = {"code": True}  # whether "code-compose-raises" raises after its effect


@workflow("code-compose-raises", version=1)
def raises_after_effect(ctx: Context, run_input: dict[str, Any]) -> Any:
    made = _item(ctx, "charge", run_input["url"], op="charge")
    if BROKEN["code"]:
        raise LookupError("no receipt printer")
    return made


def test_retry_of_a_run_its_own_code_failed_replays_the_code_deployed_since(
    org: Organisation, stub: ProviderStub
) -> None:
    BROKEN["code"] = True
    run_id = start(org, "code-compose-raises", {"url": stub.url})
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("failed", "workflow_failed: LookupError: no receipt printer")
    BROKEN["code"] = False  # the fix, deployed
    run_act(org=org, run_id=run_id, action="retry", actor="ops")
    drive()
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "item_1")
    assert len(stub.created) == 1  # the charge was replayed, not sent again
    with pytest.raises(NothingToRetry):  # the failed turn is behind the one that succeeded
        Run.objects.filter(pk=run_id).update(status="failed")
        run_act(org=org, run_id=run_id, action="retry", actor="ops")


@pytest.mark.parametrize("in_branch", [False, True], ids=["top", "branch"])
def test_retry_after_the_code_caught_a_failed_call_replays_the_code_and_calls_nothing_again(
    org: Organisation, stub: ProviderStub, in_branch: bool
) -> None:
    """The code caught both failures (a refused call, a function that raised) and then
    failed the run itself: what failed the run is the code, not the calls. Once the code is
    fixed, a retry replays it past both, as they failed, and sends and calls nothing again
    (as a definition's step with an on_failure path is never what a retry runs)."""
    HANDLED["fixed"], BOOMS[:] = False, []
    run_id = start(org, "code-compose-caught-then-failed",
                   {"url": stub.url, "in_branch": in_branch})  # fmt: skip
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and "charge_refused" in run.error, run.error
    assert (stub.count("POST", "/nowhere"), BOOMS) == (1, ["ada"])
    HANDLED["fixed"] = True  # the fix, deployed
    try:
        run_act(org=org, run_id=run_id, action="retry", actor="ops")
        drive()
    finally:
        HANDLED["fixed"] = False
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert run.output == (["handled", "beside"] if in_branch else "handled")
    assert (stub.count("POST", "/nowhere"), BOOMS) == (1, ["ada"])


def test_a_second_retry_in_a_branch_does_not_bring_back_the_failure_the_first_set_aside(
    org: Organisation, stub: ProviderStub
) -> None:
    """The first retry calls the branch's failed function again (its failed row set aside)
    and continues the join in a new row, where the branch's rows move; the second retry
    sends the refused call again and continues the join once more. The branch's replay still
    reads the function's success, not its first failure (it failed the run with the old
    error for good, every retry after the same)."""
    LOOKS[:] = []
    stub.fail_next(1, status=400, path_prefix="/charges")  # the send is refused once
    run_id = start(org, "code-compose-two-retries", {"url": stub.url})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and "ada not found" in run.error, run.error
    run_act(org=org, run_id=run_id, action="retry", actor="ops")
    drive()
    run.refresh_from_db()
    assert run.status == "failed" and "'send' failed" in run.error, run.error
    run_act(org=org, run_id=run_id, action="retry", actor="ops")
    drive()
    run.refresh_from_db()
    assert (run.status, run.error) == ("succeeded", ""), run.error
    assert run.output == ["ada found", "beside"]
    assert LOOKS == ["ada", "ada"]  # called again once, by the first retry only
    assert stub.count("POST", "/charges") == 2  # refused, then sent again by the second
    joins = Step.objects.filter(run_id=run_id, step_id="pair.join").order_by("id")
    assert [j.status for j in joins] == ["cancelled", "cancelled", "done"]


def test_retry_of_an_inline_step_that_failed_the_run_enters_it_again_and_goes_on(
    org: Organisation,
) -> None:
    """A quick step has no worker attempts to begin again: the retry enters it anew, and the
    replay reads its new row, not the failed one (it replayed the failure, and the run
    failed again at once with the old error, its new row done)."""
    GATE["open"], COUNTED[:] = False, []
    plugins.register_step_type(GATE_TYPE)
    try:
        run_id = start(org, "code-compose-inline-fails", {})
        drive()
        run = Run.objects.get(pk=run_id)
        assert run.status == "failed" and "gate_closed" in run.error, run.error
        GATE["open"] = True
        run_act(org=org, run_id=run_id, action="retry", actor="ops")
        drive()
    finally:
        GATE["open"] = False
        registry._types.pop(GATE_TYPE.name, None)
    run.refresh_from_db()
    assert (run.status, run.error) == ("succeeded", ""), run.error
    assert run.output == ["a", "passed", "b"]
    assert COUNTED == ["a", "b"]  # the function before it was replayed, not called again
    gates = Step.objects.filter(run_id=run_id, step_id="gate").order_by("iteration")
    assert [(g.iteration, g.status) for g in gates] == [(1, "failed"), (2, "done")]


def test_a_retry_after_one_that_entered_a_cancelled_step_again_keeps_the_new_entry(
    org: Organisation,
) -> None:
    """The first retry enters the nap the failure cancelled again (its second row), and the
    branch's call after it fails; the second retry keeps the branch's steps before that
    call as its replay reads them, the new nap, not the cancelled one (it kept the
    cancelled row, and the branch failed with nondeterministic_workflow)."""
    FIXED_NOW.clear()
    FIX_CALLS.clear()
    run_id = start(org, "code-compose-nap-then-call", {})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and "boom not found" in run.error, run.error
    FIXED_NOW.add("boom")
    run_act(org=org, run_id=run_id, action="retry", actor="ops")
    drive()
    make_due(run_id=run_id)
    assert fire_due_timers().fired == 1
    drive()
    run.refresh_from_db()
    assert run.status == "failed" and "look not found" in run.error, run.error
    FIXED_NOW.add("look")
    run_act(org=org, run_id=run_id, action="retry", actor="ops")
    drive()
    run.refresh_from_db()
    assert (run.status, run.error) == ("succeeded", ""), run.error
    assert run.output == ["look found", "boom found"]
    assert FIX_CALLS == ["boom", "boom", "look", "look"]
    naps = Step.objects.filter(run_id=run_id, step_id="nap").order_by("iteration")
    assert [(n.iteration, n.status) for n in naps] == [(1, "cancelled"), (2, "done")]


def test_retry_of_a_branch_step_that_failed_the_run_runs_it_and_its_sibling_again(
    org: Organisation, stub: ProviderStub
) -> None:
    stub.fail_next(1, status=400)  # the first call is refused: its step fails for good
    run_id = start(org, "code-compose-rerun", {"url": stub.url})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed", run.error
    run_act(org=org, run_id=run_id, action="retry", actor="ops")
    drive()
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    # Each effect made once: the refused call made nothing, the sibling's was settled.
    assert sorted(item["body"]["op"] for item in stub.created) == ["after", "left", "right"]
    assert Step.objects.filter(run_id=run_id, step_id="pair.join", status="done").count() == 1


def test_retry_runs_the_branch_step_that_failed_the_run_beside_a_caught_one_of_the_same_id(
    org: Organisation, stub: ProviderStub
) -> None:
    """The newest failed row of "charge" is the other branch's, whose failure the code
    caught: the retry runs the one that failed the run (its own branch's), which succeeds,
    and the run goes on; it does not replay the failing branch into the same failure."""
    stub.fail_next(1, status=503, path_prefix="/items")  # retried after a backoff ...
    stub.fail_next(1, status=400, path_prefix="/items")  # ... then refused: failed for good
    stub.fail_next(1, status=400, path_prefix="/charges")  # refused at once, caught
    run_id = start(org, "code-compose-same-id-fails", {"url": stub.url})
    drive(fast_forward=False)  # the first charge waits out its backoff, the other branch naps
    # The other branch's charge first, whatever the machine's speed: the first charge's
    # retry waits until it has run (its backoff may pass meanwhile on a loaded machine, and a
    # claim does not order two due steps of one run).
    retry = Step.objects.filter(run_id=run_id, status="waiting", wait_kind="retry")
    assert retry.update(wake_at=Now() + timedelta(hours=1)) == 1
    make_due(run_id=run_id)
    assert fire_due_timers().fired == 1
    drive(fast_forward=False)
    drive()  # now the first charge is tried again, and refused
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed", run.error
    assert run.error.startswith("step 'pay.0' failed: step 'charge' failed: "), run.error
    charges = Step.objects.filter(run_id=run_id, step_id="charge").order_by("iteration")
    assert [(c.iteration, c.branch, c.status) for c in charges] == [(1, 0, "failed"),
                                                                     (2, 1, "failed")]  # fmt: skip

    run_act(org=org, run_id=run_id, action="retry", actor="ops")
    drive()
    run.refresh_from_db()
    assert (run.status, run.error) == ("succeeded", ""), run.error
    assert run.output == ["item_1", "caught"]
    assert [(c.iteration, c.status) for c in charges.all()] == [(1, "done"), (2, "failed")]


def test_retry_goes_on_inside_the_nested_parallel_a_sibling_branch_waited_in(
    org: Organisation,
) -> None:
    """The failure cancelled the other branch inside its own ctx.parallel (its inner join,
    its signal wait, its inner branch not yet run): the retry continues that inner join
    too and enters its branches again, so the outer join can meet and the run ends, rather
    than accepting the retry and waiting forever at a join one branch can never reach."""
    run_id = start(org, "code-compose-nested-sibling", {"name": "lin", "order": "n-1"})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed", run.error
    assert Step.objects.get(run_id=run_id, step_id="paid").status == "cancelled"
    FIXED.add("lin")
    try:
        run_act(org=org, run_id=run_id, action="retry", actor="ops")
        drive()
        assert Step.objects.filter(run_id=run_id, step_id="paid", status="waiting").count() == 1
        signal_send(org=org, name="paid", correlation="n-1", payload={"paid": 5})
        drive()
    finally:
        FIXED.discard("lin")
    run.refresh_from_db()
    assert (run.status, run.error) == ("succeeded", ""), run.error
    assert run.output == [[{"paid": 5}, "noted"], "lin found"]
    joins = Step.objects.filter(run_id=run_id, step_id__in=["outer.join", "inner.join"])
    assert sorted((j.step_id, j.iteration, j.status) for j in joins) == [
        ("inner.join", 1, "cancelled"), ("inner.join", 2, "done"),
        ("outer.join", 1, "cancelled"), ("outer.join", 2, "done"),
    ]  # fmt: skip


def test_retry_of_a_branch_call_that_failed_for_good_calls_the_function_again(
    org: Organisation, stub: ProviderStub
) -> None:
    """A ctx.run function inside a branch that failed for good failed the run (the other
    branch and the join ended with it); once it is fixed, a retry calls it again, in its
    branch, after the branch's steps before it, and the run goes on past the join."""
    run_id = start(org, "code-compose-branch-call", {"url": stub.url, "name": "ada"})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed", run.error
    assert "look_up" in run.error and "ada not found" in run.error, run.error
    FIXED.add("ada")
    try:
        run_act(org=org, run_id=run_id, action="retry", actor="ops")
        drive()
    finally:
        FIXED.discard("ada")
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert run.output is not None and run.output["pair"][0]["found"] == "ada found"
    # Each effect made once: the branch's effect before the call was replayed, not sent again.
    assert sorted(item["body"]["op"] for item in stub.created) == ["after", "before", "right"]
    calls = Step.objects.filter(run_id=run_id, step_id="look_up").order_by("id")
    assert [(c.iteration, c.status) for c in calls] == [(1, "failed"), (2, "done")]
    assert Step.objects.filter(run_id=run_id, step_id="pair.join", status="done").count() == 1


def test_retry_of_a_call_that_failed_for_good_in_a_nested_branch_calls_it_again_there(
    org: Organisation, stub: ProviderStub
) -> None:
    """The failure ended both joins and every other branch; the retry continues each join,
    innermost first, in a new row, and calls the function again in its branch."""
    run_id = start(org, "code-compose-nested-call", {"url": stub.url, "name": "grace"})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed", run.error
    assert "look_up" in run.error and "grace not found" in run.error, run.error
    FIXED.add("grace")
    try:
        run_act(org=org, run_id=run_id, action="retry", actor="ops")
        drive()
    finally:
        FIXED.discard("grace")
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert run.output is not None
    assert run.output["pair"][0][0]["found"] == "grace found"
    # Each effect made once: the effects before the failure were replayed, not sent again.
    ops = sorted(item["body"]["op"] for item in stub.created)
    assert ops == ["after", "before", "beside", "right"]
    calls = Step.objects.filter(run_id=run_id, step_id="look_up").order_by("id")
    assert [(c.iteration, c.status) for c in calls] == [(1, "failed"), (2, "done")]
    # Each join met once, in the row that continued the one the failure cancelled.
    for join in ("pair.join", "inner.join"):
        rows = Step.objects.filter(run_id=run_id, step_id=join).order_by("id")
        assert [r.status for r in rows] == ["cancelled", "done"], join
    inner = Step.objects.get(run_id=run_id, step_id="inner.join", status="done")
    outer = Step.objects.get(run_id=run_id, step_id="pair.join", status="done")
    assert (inner.fork_join_id, inner.branch) == (outer.id, 0)
    assert calls.last().fork_join_id == inner.id  # type: ignore[union-attr]


@workflow("code-compose-bytes", version=1)
def charged_after_a_step(ctx: Context, run_input: dict[str, Any]) -> Any:
    ctx.step("first", "noop")
    # Keys in an order jsonb does not keep (it sorts shorter keys first).
    body = {"charge": "x", "run": 7, "amount": {"value": 10, "currency": "EUR"}, "é": "ü",
            # and values jsonb gives back in another form: an integer, 0.0, a list
            "cents": 1e16, "zero": -0.0, "pair": (1, 2)}  # fmt: skip
    return ctx.http("charge", connection="api", method="POST", url=f"{run_input['url']}/items",
                    body=body)  # fmt: skip


def test_every_send_of_an_effect_sends_the_same_bytes(
    org: Organisation, stub: ProviderStub
) -> None:
    """The charge's first attempt is taken straight from the settle that asked it (the call
    as the code wrote it), its retry after a 503 claimed from the database (jsonb's key
    order, its numbers as numeric writes them): a provider that fingerprints an
    Idempotency-Key's request sees one body."""
    stub.fail_next(1, status=503, path_prefix="/items")
    run_id = start(org, "code-compose-bytes", {"url": stub.url})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", run.error
    sends = [r for r in stub.requests if r["path"] == "/items"]
    assert len(sends) == 2
    assert sends[0]["headers"]["idempotency-key"] == sends[1]["headers"]["idempotency-key"]
    assert sends[0]["raw"] == sends[1]["raw"]
    assert sends[0]["headers"]["content-type"] == "application/json"
    assert sends[0]["raw"] == (
        '{"amount":{"currency":"EUR","value":10},"cents":10000000000000000,"charge":"x",'
        '"pair":[1,2],"run":7,"zero":0.0,"é":"ü"}'
    )
