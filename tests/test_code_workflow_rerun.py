"""Run control of a code run (docs/reference/code-workflows.md, "Re-running, retrying and
controlling a code run"): a re-run from a step it entered keeps the steps before it and replays the
code into new work; retry runs the failed step (or the decider) again; cancel, pause and resume act
as on a definition's run. On the real engine and database, driven in this process through a real
Worker's code path."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse
from rest_framework.test import APIClient

from timers.sweep import fire_due_timers
from workflows.code.registry import unregister
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim
from workflows.engine.worker import Attempt, Worker
from workflows.errors import NothingToRetry, UnknownStep, WorkflowNotAllowed
from workflows.models import Organisation, Run, RunEvent, Step
from workflows.plugins.code import Context, publish_code_workflow, workflow
from workflows.plugins.testing import WorkflowTest
from workflows.services.control import run_act
from workflows.services.rerun import rerun
from workflows.services.runs import run_start

from .effect_setup import connect, drive
from .stubs import ProviderStub
from .test_timers import make_due

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: list[str] = []  # each ctx.run function called, in order, by any run of this module
BROKEN = {"receipt": False}  # whether the next "receipt" raises (a bug fixed by a deploy)


def priced(items: list[int]) -> int:
    CALLS.append("price")
    return sum(items)


def polled(n: int) -> int:
    CALLS.append(f"poll {n}")
    return n


def receipt_for(item_id: str, total: int) -> dict[str, Any]:
    CALLS.append("receipt")
    if BROKEN["receipt"]:
        raise LookupError("no receipt printer")
    return {"charge": item_id, "total": total}


@workflow("code-rerun", version=1)
def charge_order(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    total = ctx.run("price", priced, run_input["items"])
    for n in range(run_input.get("polls", 1)):
        ctx.run("poll", polled, n)
    created = ctx.http(
        "charge", connection="api", method="POST", url=f"{run_input['url']}/items",
        body={"total": total},
    )  # fmt: skip
    return ctx.run("receipt", receipt_for, created["body"]["id"], total)  # type: ignore[no-any-return]


@workflow("code-rerun-nap", version=1)
def nap_between(ctx: Context, run_input: dict[str, Any]) -> str:
    ctx.run("before", polled, 0)
    ctx.sleep("nap", "1h")
    ctx.run("after", polled, 1)
    return "rested"


@workflow("code-rerun-inline", version=1)
def receipt_then_notes(ctx: Context, run_input: dict[str, Any]) -> Any:
    # Inline steps after a ctx.run: after a retry or a re-run (a cut in the run's history),
    # each turn reads the history, which must hold the steps its own settle just entered.
    made = ctx.run("receipt", receipt_for, "item", 1)
    ctx.step("noted", "set", values={"noted": True})
    ctx.step("filed", "set", values={"filed": True})
    return made


def charging(url: str) -> Callable[[Context], Any]:
    """A branch that charges at the provider (step "charge") and gives the item's id."""

    def charge(c: Context) -> Any:
        created = c.http("charge", connection="api", method="POST", url=f"{url}/items",
                         body={"total": 1})  # fmt: skip
        return created["body"]["id"]

    return charge


@workflow("code-rerun-fan", version=1)
def charge_beside_a_price(ctx: Context, run_input: dict[str, Any]) -> Any:
    def price(c: Context) -> Any:
        return c.run("price", priced, [1])

    both = ctx.parallel("fan", charging(run_input["url"]), price)
    return ctx.run("receipt", receipt_for, both[0], both[1])


@workflow("code-rerun-sends", version=1)
def send_twice(ctx: Context, run_input: dict[str, Any]) -> Any:
    url = run_input["url"]
    first = ctx.http("send", connection="api", method="POST", url=f"{url}/items", body={"n": 1})
    ctx.run("mid", polled, 0)
    second = ctx.http("send", connection="api", method="POST", url=f"{url}/items", body={"n": 2})
    return [first["body"]["body"], second["body"]["body"]]


@workflow("code-rerun-refund", version=1)
def charge_maybe_refund(ctx: Context, run_input: dict[str, Any]) -> Any:
    url = run_input["url"]
    made = ctx.http("charge", connection="api", method="POST", url=f"{url}/items",
                    body={"op": "charge"})  # fmt: skip
    if run_input.get("register"):
        ctx.compensate_with_http("refund", connection="api", method="POST", url=f"{url}/items",
                                 body={"op": "refund"})  # fmt: skip
    if run_input.get("fail"):
        ctx.fail("out_of_stock")
    return made["body"]["id"]


@workflow("code-rerun-same-id", version=1)
def charge_in_each_branch(ctx: Context, run_input: dict[str, Any]) -> Any:
    """Both branches call a step of the same id ("charge"), each after a wait of its own:
    which one charges first is up to the outside world."""
    url = run_input["url"]

    def after_a_nap(c: Context) -> Any:
        c.sleep("nap", "1h")
        made = c.http("charge", connection="api", method="POST", url=f"{url}/items",
                      body={"who": "nap"})  # fmt: skip
        return made["body"]["body"]["who"]

    def once_paid(c: Context) -> Any:
        c.wait_signal("paid", signal="paid", correlation=run_input["order"])
        made = c.http("charge", connection="api", method="POST", url=f"{url}/items",
                      body={"who": "paid"})  # fmt: skip
        return made["body"]["body"]["who"]

    return ctx.parallel("fan", after_a_nap, once_paid)


@workflow("code-rerun-charge-beside-a-check", version=1)
def charge_beside_a_check(ctx: Context, run_input: dict[str, Any]) -> Any:
    def check(c: Context) -> Any:
        return c.run("receipt", receipt_for, "check", 1)

    return ctx.parallel("fan", charging(run_input["url"]), check)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    CALLS.clear()
    BROKEN["receipt"] = False


def start(org: Organisation, name: str, run_input: dict[str, Any], key: str = "k") -> int:
    publish_code_workflow(org=org, name=name, version=1)
    return run_start(org=org, automation_slug=name, run_input=run_input,
                     start_key=key).run_id  # fmt: skip


def taken(run_id: int) -> list[tuple[str, int, str]]:
    """The run's steps in the order entered (the decider's turns left out)."""
    rows = Step.objects.filter(run_id=run_id).exclude(step_id="decide").order_by("id")
    return [(s.step_id, s.iteration, s.status) for s in rows]


def finished(org: Organisation, url: str, key: str, **extra: Any) -> int:
    connect(org, base_url=url)
    run_id = start(org, "code-rerun", {"items": [2, 3], "url": url, **extra}, key)
    drive()
    assert Run.objects.get(pk=run_id).status == "succeeded"
    return run_id


def test_a_rerun_from_a_step_keeps_the_steps_before_it_and_replays_into_new_work(
    org: Organisation, api: APIClient, provider_stub: ProviderStub
) -> None:
    run_id = finished(org, provider_stub.url, "r1")
    assert CALLS == ["price", "poll 0", "receipt"]
    assert len(provider_stub.created) == 1
    CALLS.clear()

    # A preview changes nothing and says what becomes of the settled effect set aside.
    url = f"/api/v1/runs/{run_id}/rerun"
    preview = api.post(url, {"from_step": "charge"}, format="json")
    assert preview.status_code == 200, preview.json()
    body = preview.json()
    assert (body["dry_run"], body["status"], body["iteration"]) == (True, "succeeded", 1)
    assert [(e["key"], e["action"], e["new_key"]) for e in body["effects"]] == [
        (f"{run_id}/charge/1", "reuse", f"{run_id}/charge/2")
    ]
    assert Run.objects.get(pk=run_id).status == "succeeded"

    done = api.post(url, {"from_step": "charge", "dry_run": False}, format="json")
    assert done.status_code == 200, done.json()
    assert done.json()["status"] == "running"
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("succeeded", ""), run.error
    # price and poll were replayed from the history (not called again); charge was entered
    # anew under a new key and took its settled answer (not sent again); receipt ran again.
    assert CALLS == ["receipt"]
    assert len(provider_stub.created) == 1
    assert taken(run_id) == [
        ("price", 1, "done"), ("poll", 1, "done"), ("charge", 1, "done"),
        ("receipt", 1, "done"), ("charge", 2, "done"), ("receipt", 2, "done"),
    ]  # fmt: skip
    (event,) = RunEvent.objects.filter(run_id=run_id, kind="run.rerun")
    assert event.detail is not None
    assert (event.step_id, event.detail["iteration"], event.detail["kept"]) == ("charge", 1, 2)
    assert RunEvent.objects.filter(run_id=run_id, kind="effect.reused").count() == 1

    # A re-run of the re-run, from the first step, with a new input and every effect made
    # again: the cuts add up, so the replay reads only the steps of the newest walk.
    CALLS.clear()
    new_input = {"items": [10], "url": provider_stub.url}
    again = rerun(org=org, run_id=run_id, from_step="price", actor="ops", run_input=new_input,
                  repeat_effects=True, dry_run=False)  # fmt: skip
    assert [(e.key, e.action, e.new_key) for e in again.effects] == [
        (f"{run_id}/charge/1", "repeat", f"{run_id}/charge/3")
    ]
    drive()
    run.refresh_from_db()
    assert (run.status, run.error) == ("succeeded", ""), run.error
    assert CALLS == ["price", "poll 0", "receipt"]
    assert [item["body"] for item in provider_stub.created] == [{"total": 5}, {"total": 10}]
    assert str(provider_stub.created[1]["key"]).startswith(f"{run_id}/charge/3")
    assert run.output == {"charge": provider_stub.created[1]["id"], "total": 10}
    assert taken(run_id)[6:] == [
        ("price", 2, "done"),
        ("poll", 2, "done"),
        ("charge", 3, "done"),
        ("receipt", 3, "done"),
    ]


def test_a_second_rerun_from_the_same_step_takes_the_same_settled_answer(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    run_id = finished(org, provider_stub.url, "r4")
    # charge/2 reuses charge/1's answer; charge/3 takes it again
    rerun_twice_taking_charge_1(org, run_id, "charge", provider_stub, calls=["receipt"])


def test_reruns_from_a_parallel_take_its_branches_settled_answers_each_time(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    connect(org, base_url=provider_stub.url)
    run_id = start(org, "code-rerun-fan", {"url": provider_stub.url}, "fan")
    drive()
    assert Run.objects.get(pk=run_id).status == "succeeded"
    # The branch's charge/1 holds the only settled answer, each time.
    rerun_twice_taking_charge_1(org, run_id, "fan", provider_stub, calls=["price", "receipt"],
                                branch="fan.join:0")  # fmt: skip


def rerun_twice_taking_charge_1(
    org: Organisation, run_id: int, from_step: str, stub: ProviderStub, *, calls: list[str],
    branch: str = "",
) -> None:  # fmt: skip
    """Re-run ``run_id`` from ``from_step`` twice: each time charge's new entry takes the
    one settled answer (charge/1), the provider is never called again, and the ctx.run
    functions called are ``calls``. Made on ``branch``, the answer goes to the first new
    entry on that branch, whose key its turn decides."""
    for entry in (2, 3):
        CALLS.clear()
        done = rerun(org=org, run_id=run_id, from_step=from_step, actor="ops", dry_run=False)
        new_key = None if branch else f"{run_id}/charge/{entry}"
        assert [(e.key, e.action, e.new_key, e.place, e.entry) for e in done.effects] == [
            (f"{run_id}/charge/1", "reuse", new_key, branch, 1)
        ]
        drive()
        run = Run.objects.get(pk=run_id)
        assert (run.status, run.error) == ("succeeded", ""), run.error
        assert calls == CALLS
        assert len(stub.created) == 1  # never sent again


def test_a_rerun_from_a_parallel_gives_each_branch_the_answer_its_own_call_settled(
    org: Organisation, api: APIClient, provider_stub: ProviderStub
) -> None:
    # The branches charged in one order (the signal came before the nap's end); after the
    # re-run they charge in the other. Each new entry takes the answer of the charge made on
    # its own branch, not the one made first: the k-th new entry of "charge" overall is the
    # other branch's this time.
    connect(org, base_url=provider_stub.url)
    t = WorkflowTest(org=org)
    t.start("code-rerun-same-id", version=1, input={"url": provider_stub.url, "order": "o-7"})
    t.run_until_waiting()
    t.signal("paid", correlation="o-7")
    t.run_until_waiting()
    make_due(run_id=t.run().id)
    assert fire_due_timers().fired == 1
    run = t.run_until_finished()
    assert (run.status, run.output) == ("succeeded", ["nap", "paid"]), run.error
    assert [item["body"]["who"] for item in provider_stub.created] == ["paid", "nap"]

    # The preview cannot know which key each branch's new entry gets: it names the branch.
    preview = api.post(f"/api/v1/runs/{run.id}/rerun", {"from_step": "fan"}, format="json")
    assert preview.status_code == 200, preview.json()
    assert sorted((e["key"], e["new_key"], e["place"], e["entry"], e["action"])
                  for e in preview.json()["effects"]) == [
        (f"{run.id}/charge/1", None, "fan.join:1", 1, "reuse"),
        (f"{run.id}/charge/2", None, "fan.join:0", 1, "reuse"),
    ]  # fmt: skip
    shown = io.StringIO()
    call_command("runs", "rerun", "--org", org.slug, str(run.id), "--from", "fan", stdout=shown)
    assert (f"effect {run.id}/charge/1 (http): reused, not sent again as charge's new entry 1 "
            "on branch fan.join:1") in shown.getvalue()  # fmt: skip
    done = api.post(f"/api/v1/runs/{run.id}/rerun", {"from_step": "fan", "dry_run": False},
                    format="json")  # fmt: skip
    assert done.status_code == 200, done.json()
    t.run_until_waiting()
    make_due(run_id=run.id, fired_at__isnull=True)
    assert fire_due_timers().fired == 1  # the nap's branch charges first this time
    t.run_until_waiting()
    t.signal("paid", correlation="o-7", payload={"again": True})
    run = t.run_until_finished()
    assert (run.status, run.output) == ("succeeded", ["nap", "paid"]), run.error
    assert len(provider_stub.created) == 2  # both answers reused, nothing charged again
    reused = {(e.iteration, (e.detail or {})["reused"])
              for e in RunEvent.objects.filter(run_id=run.id, kind="effect.reused")}  # fmt: skip
    assert reused == {(3, f"{run.id}/charge/2"), (4, f"{run.id}/charge/1")}


def test_a_branch_entry_a_failure_cancelled_takes_its_reused_answer_when_retried(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    # Re-run from the parallel: the charge's new entry is to take the settled answer. The
    # other branch fails before that entry ran, which cancels it; the retry enters it again
    # (another iteration), and that entry takes the answer: the charge is not made twice.
    connect(org, base_url=provider_stub.url)
    run_id = start(org, "code-rerun-charge-beside-a-check", {"url": provider_stub.url}, "c1")
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", ["item_1", {"charge": "check", "total": 1}])

    rerun(org=org, run_id=run_id, from_step="fan", actor="ops", dry_run=False)
    BROKEN["receipt"] = True
    worker = Worker(lane_policy("io"), concurrency=1, name="w")
    now = time.monotonic()

    def attempts() -> dict[str, Attempt]:
        claimed = claim(policy=worker.policy, worker=worker.name, limit=10)
        return {s.step_id: Attempt(s, deadline=now + 60, extended=now) for s in claimed}

    # The decider replays up to the parallel and forks again; the first branch asks for the
    # charge (its new entry, claimed here and not run yet) ...
    (decide,) = attempts().values()
    handed = worker._execute(decide)
    claimed = {**attempts(), **({} if handed is None else {handed.step.step_id: handed})}
    assert sorted(claimed) == ["charge", "fan.1"]
    # ... and the other branch's call fails for good: the run fails, the entry is cancelled.
    assert worker._execute(claimed["fan.1"]) is None
    drive()
    run.refresh_from_db()
    assert run.status == "failed", run.error
    charges = Step.objects.filter(run_id=run_id, step_id="charge").order_by("iteration")
    assert [(c.iteration, c.status) for c in charges] == [(1, "done"), (2, "cancelled")]

    BROKEN["receipt"] = False
    run_act(org=org, run_id=run_id, action="retry", actor="ops")
    drive()
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", ["item_1", {"charge": "check", "total": 1}])
    assert len(provider_stub.created) == 1  # the settled charge's answer, not a second charge
    (reused,) = RunEvent.objects.filter(run_id=run_id, kind="effect.reused")
    assert (reused.iteration, (reused.detail or {})["reused"]) == (3, f"{run_id}/charge/1")


def test_a_kept_step_keeps_the_answer_it_took_from_an_earlier_rerun(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    connect(org, base_url=provider_stub.url)
    run_id = start(org, "code-rerun-sends", {"url": provider_stub.url}, "s1")
    drive()
    first = Run.objects.get(pk=run_id).output
    assert first == [{"n": 1}, {"n": 2}]
    rerun(org=org, run_id=run_id, from_step="send", actor="ops", dry_run=False)
    drive()  # send/3 took send/1's answer, send/4 send/2's
    # From mid: send/3 is kept with send/1's answer; only send/2's is the next call's.
    preview = rerun(org=org, run_id=run_id, from_step="mid", actor="ops")
    assert [(e.key, e.action, e.new_key) for e in preview.effects] == [
        (f"{run_id}/send/2", "reuse", f"{run_id}/send/5")
    ]
    rerun(org=org, run_id=run_id, from_step="mid", actor="ops", dry_run=False)
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", first), run.error
    assert len(provider_stub.created) == 2
    reused = RunEvent.objects.filter(run_id=run_id, kind="effect.reused").order_by("id")
    assert [(e.iteration, (e.detail or {})["reused"]) for e in reused][-1:] == [
        (5, f"{run_id}/send/2")
    ]


def test_an_answer_a_compensation_undid_after_a_rerun_reused_it_is_made_again(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    connect(org, base_url=provider_stub.url)
    url = provider_stub.url
    run_id = start(org, "code-rerun-refund", {"url": url}, "u1")
    drive()
    # charge/2 takes charge/1's answer, registers its refund, and the run fails: the one
    # charge at the provider is refunded.
    rerun(org=org, run_id=run_id, from_step="charge", actor="ops", dry_run=False,
          run_input={"url": url, "register": True, "fail": True})  # fmt: skip
    drive()
    assert Run.objects.get(pk=run_id).status == "compensated"
    assert [item["body"]["op"] for item in provider_stub.created] == ["charge", "refund"]
    fixed = {"url": url, "register": True}
    preview = rerun(org=org, run_id=run_id, from_step="charge", actor="ops", run_input=fixed)
    assert [(e.key, e.action) for e in preview.effects] == [(f"{run_id}/charge/1", "repeat")]
    rerun(org=org, run_id=run_id, from_step="charge", actor="ops", dry_run=False,
          run_input=fixed)  # fmt: skip
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", run.error
    assert [item["body"]["op"] for item in provider_stub.created] == ["charge", "refund", "charge"]


def test_a_rerun_chooses_the_iteration_of_a_step_called_again(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    run_id = finished(org, provider_stub.url, "r2", polls=3)
    assert CALLS == ["price", "poll 0", "poll 1", "poll 2", "receipt"]
    CALLS.clear()
    shown = io.StringIO()
    call_command("runs", "rerun", "--org", org.slug, str(run_id), "--from", "poll",
                 "--iteration", "2", "--yes", stdout=shown)  # fmt: skip
    assert "from step 'poll' (iteration 2)" in shown.getvalue()
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("succeeded", ""), run.error
    # The history kept price and the first poll; the code met the second poll as new work.
    assert CALLS == ["poll 1", "poll 2", "receipt"]
    assert [row for row in taken(run_id) if row[0] == "poll"] == [
        ("poll", 1, "done"), ("poll", 2, "done"), ("poll", 3, "done"),
        ("poll", 4, "done"), ("poll", 5, "done"),
    ]  # fmt: skip
    # Without an iteration, the step's first entry.
    preview = rerun(org=org, run_id=run_id, from_step="poll", actor="ops")
    assert preview.iteration == 1


def test_a_rerun_from_a_step_the_run_never_entered_is_refused(
    org: Organisation, api: APIClient, provider_stub: ProviderStub
) -> None:
    run_id = finished(org, provider_stub.url, "r3", polls=2)
    url = f"/api/v1/runs/{run_id}/rerun"
    for asked in ({"from_step": "refund"}, {"from_step": "poll", "iteration": 3},
                  {"from_step": "decide"}):  # fmt: skip
        refused = api.post(url, {**asked, "dry_run": False}, format="json")
        assert refused.status_code == 400, asked
        assert refused.json()["code"] == "unknown_step", refused.json()
    bad = api.post(url, {"from_step": "poll", "iteration": 0}, format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_input"
    with pytest.raises(UnknownStep):
        rerun(org=org, run_id=run_id, from_step="poll", iteration=7, actor="ops")
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded"
    assert not RunEvent.objects.filter(run_id=run_id, kind="run.rerun").exists()
    # A step set aside by a re-run is no longer in the history a re-run chooses from.
    rerun(org=org, run_id=run_id, from_step="poll", actor="ops", dry_run=False)
    with pytest.raises(UnknownStep):  # (poll, 2) is set aside: the re-run took (poll, 3)
        Run.objects.filter(pk=run_id).update(status="failed")
        rerun(org=org, run_id=run_id, from_step="poll", iteration=2, actor="ops")


def test_retry_runs_the_step_that_failed_the_code_run_then_the_code_goes_on(
    org: Organisation, api: APIClient, provider_stub: ProviderStub
) -> None:
    connect(org, base_url=provider_stub.url)
    provider_stub.fail_next(1, status=400)  # a refused request: not retried, the run fails
    run_id = start(org, "code-rerun", {"items": [1], "url": provider_stub.url}, "f1")
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and run.error.startswith("step 'charge' failed: ")

    retried = api.post(f"/api/v1/runs/{run_id}/retry", format="json")
    assert retried.status_code == 200, retried.json()
    drive()
    run.refresh_from_db()
    assert (run.status, run.error) == ("succeeded", ""), run.error
    # The same row of the failed step, a new series of attempts (its effect key unchanged),
    # then the decider replayed into the rest.
    assert taken(run_id) == [
        ("price", 1, "done"),
        ("poll", 1, "done"),
        ("charge", 1, "done"),
        ("receipt", 1, "done"),
    ]
    (created,) = provider_stub.created
    assert str(created["key"]).startswith(f"{run_id}/charge/1:")
    (event,) = RunEvent.objects.filter(run_id=run_id, kind="run.retried")
    assert event.detail is not None and event.detail["steps"] == ["charge"]


def test_retry_of_a_run_its_code_failed_replays_the_code_deployed_since(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    BROKEN["receipt"] = True
    connect(org, base_url=provider_stub.url)
    run_id = start(org, "code-rerun", {"items": [1], "url": provider_stub.url}, "f2")
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"
    # The ctx.run function failed for good, and the code did not catch its StepFailed.
    assert run.error == "step 'receipt' failed: LookupError: no receipt printer (attempt 1 of 1)"

    BROKEN["receipt"] = False  # the fix, deployed
    run_act(org=org, run_id=run_id, action="retry", actor="ops")
    drive()
    run.refresh_from_db()
    assert (run.status, run.error) == ("succeeded", ""), run.error
    assert len(provider_stub.created) == 1  # the charge was replayed, not sent again
    with pytest.raises(NothingToRetry):  # nothing failed any more
        Run.objects.filter(pk=run_id).update(status="failed")
        run_act(org=org, run_id=run_id, action="retry", actor="ops")


def test_after_a_retry_and_a_rerun_each_inline_step_is_entered_once(org: Organisation) -> None:
    BROKEN["receipt"] = True
    run_id = start(org, "code-rerun-inline", {}, "i1")
    drive()
    assert Run.objects.get(pk=run_id).status == "failed"

    BROKEN["receipt"] = False
    run_act(org=org, run_id=run_id, action="retry", actor="ops")
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("succeeded", ""), run.error
    # The failed call's row stays; the function's new call is its next iteration.
    before = [("receipt", 1, "failed"), ("receipt", 2, "done"), ("noted", 1, "done"),
              ("filed", 1, "done")]  # fmt: skip
    assert taken(run_id) == before

    rerun(org=org, run_id=run_id, from_step="receipt", actor="ops", dry_run=False)
    drive()
    run.refresh_from_db()
    assert (run.status, run.error) == ("succeeded", ""), run.error
    assert taken(run_id) == [
        *before, ("receipt", 3, "done"), ("noted", 2, "done"), ("filed", 2, "done"),
    ]  # fmt: skip
    assert CALLS == ["receipt", "receipt", "receipt"]


def test_pause_resume_and_cancel_act_on_a_code_run_and_a_rerun_goes_on_after_cancel(
    org: Organisation, api: APIClient
) -> None:
    run_id = start(org, "code-rerun-nap", {}, "p1")
    paused = api.post(f"/api/v1/runs/{run_id}/pause", format="json")
    assert paused.status_code == 200, paused.json()
    assert drive() == 0  # the decider's turn is parked: nothing runs
    api.post(f"/api/v1/runs/{run_id}/resume", format="json")
    drive()
    assert taken(run_id) == [("before", 1, "done"), ("nap", 1, "waiting")]

    # Paused while it sleeps: the timer fires, and what it would enter waits for the resume.
    run_act(org=org, run_id=run_id, action="pause", actor="ops")
    make_due(run_id=run_id)
    assert fire_due_timers().fired == 1
    assert drive() == 0
    assert Run.objects.get(pk=run_id).status == "paused"
    run_act(org=org, run_id=run_id, action="resume", actor="ops")
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", "rested")
    assert CALLS == ["poll 0", "poll 1"]

    # Cancelled while it sleeps: the wait ends, nothing more runs.
    other = start(org, "code-rerun-nap", {}, "p2")
    drive()
    cancelled = api.post(f"/api/v1/runs/{other}/cancel", format="json")
    assert cancelled.status_code == 200, cancelled.json()
    assert taken(other) == [("before", 1, "done"), ("nap", 1, "cancelled")]
    make_due(run_id=other)
    fire_due_timers()
    assert drive() == 0
    assert Run.objects.get(pk=other).status == "cancelled"

    # Re-run from the cancelled sleep: it sleeps again, then the code goes on.
    rerun(org=org, run_id=other, from_step="nap", actor="ops", dry_run=False)
    drive()
    assert taken(other)[-1] == ("nap", 2, "waiting")
    make_due(run_id=other, fired_at__isnull=True)
    assert fire_due_timers().fired == 1
    drive()
    run = Run.objects.get(pk=other)
    assert (run.status, run.output) == ("succeeded", "rested")
    assert json.dumps(taken(other)) == json.dumps(
        [["before", 1, "done"], ["nap", 1, "cancelled"], ["nap", 2, "done"], ["after", 1, "done"]]
    )


def test_narrowing_organisations_lets_runs_in_flight_go_on_and_refuses_their_reruns(
    org: Organisation, api: APIClient
) -> None:
    def napping(ctx: Context, run_input: dict[str, Any]) -> str:
        ctx.sleep("nap", "1h")
        return "rested"

    workflow("code-narrowed", version=1, organisations=[org.slug])(napping)
    try:
        run_id = start(org, "code-narrowed", {}, "n1")
        drive()
        # A later deploy names only another organisation: the run already started goes on
        # (its replays are not refused), and ends as its code says.
        unregister("code-narrowed", 1)
        workflow("code-narrowed", version=1, organisations=["someone-else"])(napping)
        make_due(run_id=run_id)
        assert fire_due_timers().fired == 1
        drive()
        run = Run.objects.get(pk=run_id)
        assert (run.status, run.output) == ("succeeded", "rested")
        # A re-run makes new work, as a start does: refused as a start is, nothing changed.
        refused = api.post(f"/api/v1/runs/{run_id}/rerun", {"from_step": "nap"}, format="json")
        assert refused.status_code == 403, refused.json()
        assert refused.json()["code"] == "workflow_not_allowed"
        with pytest.raises(WorkflowNotAllowed):
            rerun(org=org, run_id=run_id, from_step="nap", actor="ops", dry_run=False)
        run.refresh_from_db()
        assert run.status == "succeeded"
        assert not RunEvent.objects.filter(run_id=run_id, kind="run.rerun").exists()
    finally:
        unregister("code-narrowed", 1)


def test_the_admin_offers_each_entry_of_the_steps_a_code_run_took(
    org: Organisation, provider_stub: ProviderStub, admin_client: Any
) -> None:
    run_id = finished(org, provider_stub.url, "a1", polls=2)
    rerun_url = reverse("admin:workflows_run_rerun", args=[run_id])
    form = admin_client.get(rerun_url).content.decode()
    assert '<option value="poll:2">poll (iteration 2)</option>' in form
    assert 'value="decide' not in form  # the decider is not a step to re-run from

    shown = admin_client.post(rerun_url, {"from_step": "poll:2", "input": ""})
    text = shown.content.decode()
    assert "from step “poll” (iteration 2)?" in text
    assert 'name="iteration" value="2"' in text
    assert Run.objects.get(pk=run_id).status == "succeeded"  # nothing yet

    done = admin_client.post(rerun_url, {"from_step": "poll", "iteration": "2", "input": "",
                                         "confirmed": "yes"})  # fmt: skip
    assert done.status_code == 302
    (event,) = RunEvent.objects.filter(run_id=run_id, kind="run.rerun")
    assert event.detail is not None and event.detail["iteration"] == 2
    drive()
    assert Run.objects.get(pk=run_id).status == "succeeded"
    assert CALLS[-2:] == ["poll 1", "receipt"]  # the second poll, then what follows it


FETCHED: list[str] = []  # each call of fetch_until_fixed
FETCH = {"fixed": False}


def fetch_until_fixed(name: str) -> str:
    FETCHED.append(name)
    if not FETCH["fixed"]:
        raise ConnectionError(f"{name} unavailable")
    return f"{name} fetched"


@workflow("code-rerun-cancelled-call", version=1)
def cancelled_in_a_call(ctx: Context, run_input: dict[str, Any]) -> Any:
    """A function, then one that fails and is retried after the engine's backoff."""
    first = ctx.run("price", priced, [1, 2])
    return [first, ctx.run("fetch", fetch_until_fixed, "order", retry={"max_attempts": 3})]


def test_a_run_cancelled_between_a_call_s_attempts_reruns_from_that_call(
    org: Organisation,
) -> None:
    """The call has no row of its own (its attempts are its turn's): the re-run from it
    keeps every recorded step and makes the call anew, as a definition's run re-runs from a
    step cancelled in its backoff (it was unknown_step, and a re-run from an earlier step
    called the recorded functions again)."""
    CALLS.clear()
    FETCHED.clear()
    FETCH["fixed"] = False
    publish_code_workflow(org=org, name="code-rerun-cancelled-call", version=1)
    run_id = run_start(org=org, automation_slug="code-rerun-cancelled-call", run_input={},
                       start_key="c1").run_id  # fmt: skip
    drive(fast_forward=False)  # the first attempt fails; the second waits out its backoff
    assert FETCHED == ["order"]
    run_act(org=org, run_id=run_id, action="cancel", actor="ops")
    assert Run.objects.get(pk=run_id).status == "cancelled"
    with pytest.raises(UnknownStep):  # not a call the code makes next
        rerun(org=org, run_id=run_id, from_step="nowhere", actor="ops", dry_run=True)
    preview = rerun(org=org, run_id=run_id, from_step="fetch", actor="ops", dry_run=True)
    assert preview.iteration == 1
    FETCH["fixed"] = True
    try:
        rerun(org=org, run_id=run_id, from_step="fetch", actor="ops", dry_run=False)
        drive()
    finally:
        FETCH["fixed"] = False
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", [3, "order fetched"]), run.error
    assert CALLS == ["price"]  # the step before it was kept, not called again
    assert FETCHED == ["order", "order"]


@workflow("code-rerun-cancelled-nap", version=1)
def cancelled_in_a_nap(ctx: Context, run_input: dict[str, Any]) -> Any:
    first = ctx.run("price", priced, [1])
    ctx.sleep("nap", "1h")
    return [first, ctx.run("poll", polled, 2)]


def test_a_step_the_run_was_at_is_not_a_call_it_was_making(org: Organisation) -> None:
    """Cancelled in its sleep, the run was at the nap's row, not about to make a new one: a
    re-run from the nap's next iteration is unknown_step (the preview accepted it, and the
    re-run failed with nondeterministic_workflow); from its first, it is a re-run as any."""
    CALLS.clear()
    publish_code_workflow(org=org, name="code-rerun-cancelled-nap", version=1)
    run_id = run_start(org=org, automation_slug="code-rerun-cancelled-nap", run_input={},
                       start_key="n1").run_id  # fmt: skip
    drive()
    run_act(org=org, run_id=run_id, action="cancel", actor="ops")
    for step_id, iteration in (("nap", 2), ("poll", None), ("ctx.now", None)):
        with pytest.raises(UnknownStep):
            rerun(org=org, run_id=run_id, from_step=step_id, iteration=iteration, actor="ops",
                  dry_run=True)  # fmt: skip
    rerun(org=org, run_id=run_id, from_step="nap", actor="ops", dry_run=False)
    drive()
    make_due(run_id=run_id)
    assert fire_due_timers().fired == 1
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", [1, 2]), run.error
    assert CALLS == ["price", "poll 2"]
