"""The workflow test helper (workflows.plugins.testing, docs/reference/code-workflows.md, "Testing a
code workflow"), used exactly as a host's test uses it: a code workflow that sleeps 3 days,
waits for a morning in a zone, waits for a signal with a timeout and calls http against a
local stub runs to its end in seconds, on the real engine, timer rows and sweep."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from timers.models import Timer
from workflows.code.testing import run_due_steps
from workflows.engine.lanes import lane_policy
from workflows.engine.worker import Attempt, Worker
from workflows.errors import InvalidInput
from workflows.models import Organisation, Run, RunEvent
from workflows.plugins.code import Context, publish_code_workflow, workflow
from workflows.plugins.testing import WorkflowTest, WorkflowTestError
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .effect_setup import connect
from .stubs import ProviderStub
from .test_approvals_setup import person

pytestmark = pytest.mark.django_db(transaction=True)


@workflow("code-tested", version=1)
def fulfil(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
    ctx.sleep("cool_off", "3d")
    ctx.step("morning", "wait_until", rule={"time": "09:00"}, timezone="Europe/Berlin")
    paid = ctx.wait_signal("paid", signal="paid", correlation=order["order"], timeout="2d")
    if paid.timed_out:
        return {"paid": False}
    created = ctx.http("charge", connection="api", method="POST", url=f"{order['url']}/items",
                       body={"amount": paid.payload["amount"]})  # fmt: skip
    return {"paid": True, "charge": created["body"]["id"]}


@workflow("code-approved", version=1)
def refund(ctx: Context, request: dict[str, Any]) -> dict[str, Any]:
    asked = ctx.step_result("approve", "approval", approvers=["group:finance"],
                            message="Refund {{ input.amount }}?", deadline="1d")  # fmt: skip
    return {"outcome": asked.outcome, "by": asked.output["by"]}


@workflow("code-undone", version=1)
def reserve_then_give_up(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.step("reserve", "noop")
    ctx.compensate_with("release", "noop")
    ctx.fail("out_of_stock")


def test_a_run_that_compensated_has_finished(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("code-undone", version=1)
    run = t.run_until_finished()
    assert (run.status, run.error) == ("compensated", "workflow_failed: out_of_stock")
    assert [(s.step_id, s.status) for s in run.steps] == [
        ("reserve", "done"), ("ctx.compensate", "done"), ("release", "done")]  # fmt: skip


def test_an_input_that_is_not_an_object_is_refused_as_the_api_refuses_it(
    org: Organisation,
) -> None:
    for bad in ([1], [], ""):
        with pytest.raises(InvalidInput, match="input must be a JSON object"):
            WorkflowTest(org=org).start("code-undone", version=1, input=bad)  # type: ignore[arg-type]
    assert not Run.objects.exists()


def test_the_helper_says_so_under_a_tests_wrapping_transaction(org: Organisation) -> None:
    with transaction.atomic(), pytest.raises(WorkflowTestError) as refused:
        WorkflowTest(org=org).start("code-undone", version=1)
    assert "test_helper_in_transaction" in str(refused.value)
    assert "TransactionTestCase" in str(refused.value)


def test_a_3_day_sleep_a_zoned_morning_a_signal_and_a_stub_call_run_in_seconds(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    connect(org, base_url=provider_stub.url)  # the "api" connection, at the local stub
    t = WorkflowTest(org=org)
    t.start("code-tested", version=1, input={"order": "o-1", "url": provider_stub.url},
            start_key="t1")  # fmt: skip

    run = t.run_until_waiting()
    assert run.status == "running"
    assert [(s.step_id, s.status) for s in run.waiting] == [("cool_off", "waiting")]
    assert t.skip_time() == 1  # the 3-day sleep's timer, fired by the real firing
    run = t.run_until_waiting()
    assert [(s.step_id, s.type) for s in run.waiting] == [("morning", "wait_until")]
    morning = Timer.objects.get(run_id=run.id, step_id="morning")
    assert morning.zone == "Europe/Berlin" and morning.fired_at is None
    assert t.skip_time() == 1
    run = t.run_until_waiting()
    assert [(s.step_id, s.type) for s in run.waiting] == [("paid", "wait_signal")]

    t.signal("paid", correlation="o-1", payload={"amount": 12})
    run = t.run_until_finished()
    assert (run.status, run.error) == ("succeeded", "")
    assert run.output == {"paid": True, "charge": "item_1"}
    assert [(s.step_id, s.type, s.status) for s in run.steps] == [
        ("cool_off", "wait", "done"),
        ("morning", "wait_until", "done"),
        ("paid", "wait_signal", "done"),
        ("charge", "http", "done"),
    ]
    assert run.step("paid").output["payload"] == {"amount": 12}
    assert [item["body"] for item in provider_stub.created] == [{"amount": 12}]
    # Real timer rows, fired by the sweep's own batches: marked fired, their steps woken.
    assert Timer.objects.filter(run_id=run.id, fired_at__isnull=False).count() == 2
    fired = RunEvent.objects.filter(run_id=run.id, kind="step.timer_fired")
    assert sorted(e.step_id for e in fired) == ["cool_off", "morning"]


def test_skipping_time_past_a_signal_wait_times_it_out(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("code-tested", version=1, input={"order": "o-2", "url": "http://127.0.0.1:9"})
    t.run_until_waiting()
    t.skip_time()  # the sleep
    t.run_until_waiting()
    t.skip_time()  # the morning
    run = t.run_until_waiting()
    assert [s.step_id for s in run.waiting] == ["paid"]
    assert t.skip_time() == 1  # the signal's 2-day timeout, passed by the engine's sweep
    run = t.run_until_finished()
    assert (run.status, run.output) == ("succeeded", {"paid": False})
    assert run.step("paid").status == "done"
    assert "charge" not in [s.step_id for s in run.steps]


def test_a_run_left_waiting_for_a_signal_raises_naming_the_step_instead_of_hanging(
    org: Organisation,
) -> None:
    t = WorkflowTest(org=org)
    t.start("code-tested", version=1, input={"order": "o-3", "url": "http://127.0.0.1:9"})
    t.run_until_waiting()
    t.skip_time()
    t.run_until_waiting()
    t.skip_time()
    with pytest.raises(WorkflowTestError) as stuck:
        t.run_until_finished()  # nobody sends "paid"
    message = str(stuck.value)
    assert "not finished" in message and "step 'paid' (wait_signal" in message
    assert t.run().status == "running"  # left as it was, waiting


def _sleeps_a(ctx: Context) -> None:
    ctx.sleep("a_wait", "2d")


def _sleeps_b(ctx: Context) -> None:
    ctx.sleep("b_wait", "1d")


@workflow("code-listed-fan", version=1)
def fanned(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.parallel("fan", _sleeps_a, _sleeps_b)


def test_a_parallels_steps_are_listed_as_the_page_shows(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("code-listed-fan", version=1, input={})
    run = t.run_until_waiting()
    assert [s.step_id for s in run.steps] == ["fan.join", "fan", "a_wait", "b_wait"]
    t.skip_time()
    run = t.run_until_finished()
    assert [s.step_id for s in run.steps] == ["fan.join", "fan", "a_wait", "b_wait"]


FLAKY_CALLS: list[str] = []


def flaky_rate(currency: str) -> float:
    FLAKY_CALLS.append(currency)
    if len(FLAKY_CALLS) == 1:
        raise ConnectionError("rates down")
    return 1.5


@workflow("code-retried", version=1)
def rated(ctx: Context, run_input: dict[str, Any]) -> float:
    return float(ctx.run("rate", flaky_rate, "EUR", retry={"max_attempts": 2}))


def test_a_retry_runs_at_once_its_backoff_not_waited_out(org: Organisation, settings: Any) -> None:
    # Pages say the helper runs a ctx.run retry at once (the backoff an hour here, so the
    # jitter cannot make it due by chance), with no skip_time.
    lanes = {lane: {**config, "backoff_base_seconds": 3600.0, "backoff_cap_seconds": 3600.0}
             for lane, config in settings.WAYMARK["LANES"].items()}  # fmt: skip
    settings.WAYMARK = {**settings.WAYMARK, "LANES": lanes}
    FLAKY_CALLS.clear()
    t = WorkflowTest(org=org)
    t.start("code-retried", version=1, input={})
    run = t.run_until_finished()
    assert (run.status, run.output, FLAKY_CALLS) == ("succeeded", 1.5, ["EUR", "EUR"])
    retried = RunEvent.objects.filter(run_id=run.id, kind="step.retry_scheduled")
    assert retried.count() == 1


def test_a_sleep_whose_time_is_not_skipped_is_not_passed(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("code-tested", version=1, input={"order": "o-4", "url": "http://127.0.0.1:9"})
    with pytest.raises(WorkflowTestError, match="step 'cool_off' \\(wait"):
        t.run_until_finished()


def test_a_decision_is_taken_as_a_named_user_with_the_services_permission_checks(
    org: Organisation,
) -> None:
    t = WorkflowTest(org=org)
    t.start("code-approved", version=1, input={"amount": 40})
    run = t.run_until_waiting()
    assert [(s.step_id, s.type) for s in run.waiting] == [("approve", "approval")]

    outsider = person(org, "outsider", group="finance", may_decide=False)
    with pytest.raises(WorkflowTestError, match="not_permitted"):
        t.decide("approve", user=outsider, decision="approve")
    assert t.run_until_waiting().waiting[0].step_id == "approve"  # still open

    t.decide("approve", user=person(org, "maya"), decision="approve", comment="fine")
    run = t.run_until_finished()
    assert (run.status, run.output) == ("succeeded", {"outcome": "approved", "by": "maya"})


def test_the_helper_refuses_to_run_in_production(org: Organisation, settings: Any) -> None:
    with override_settings(PRODUCTION=True), pytest.raises(WorkflowTestError) as refused:
        WorkflowTest(org=org)
    assert "test_helper_in_production" in str(refused.value)
    # A host imports the settings objects only (docs/how-to/embed-in-django.md): its
    # WAYMARK_PRODUCTION arrives in WAYMARK, and the helper refuses there too.
    del settings.PRODUCTION
    settings.WAYMARK = {**settings.WAYMARK, "PRODUCTION": True}
    with pytest.raises(WorkflowTestError, match="test_helper_in_production"):
        WorkflowTest(org=org)


def test_skipping_time_passes_an_approvals_deadline(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("code-approved", version=1, input={"amount": 40})
    t.run_until_waiting()
    assert t.skip_time() == 1  # the 1-day deadline, passed by the engine's sweep
    run = t.run_until_finished()
    assert (run.status, run.output) == ("succeeded", {"outcome": "timed_out", "by": "deadline"})


def test_skipping_time_moves_only_its_own_runs_waits(org: Organisation) -> None:
    first, second = WorkflowTest(org=org), WorkflowTest(org=org)
    for t, key in ((first, "a"), (second, "b")):
        t.start("code-tested", version=1, input={"order": key, "url": "http://127.0.0.1:9"},
                start_key=key)  # fmt: skip
        t.run_until_waiting()
    assert first.skip_time() == 1
    assert [s.step_id for s in first.run_until_waiting().waiting] == ["morning"]
    assert [s.step_id for s in second.run_until_waiting().waiting] == ["cool_off"]
    other = Timer.objects.get(run_id=second.run().id, step_id="cool_off")
    assert other.fired_at is None
    assert other.due_at > timezone.now() + timedelta(days=2)  # still 3 days out


@workflow("code-chained", version=1)
def chained(ctx: Context, run_input: dict[str, Any]) -> str:
    for n in (1, 2, 3):
        ctx.step(f"s{n}", "noop")
    return "done"


def test_running_due_steps_holds_each_attempt_only_while_it_runs(org: Organisation) -> None:
    """run_due_steps runs a settle's next step as the worker's threads do: held (counted in
    the worker's fair share) while it runs, let go after, so a long test or drain never
    piles up attempts the worker believes it still holds."""
    publish_code_workflow(org=org, name="code-chained", version=1)
    run_id = run_start(org=org, automation_slug="code-chained", run_input={},
                       start_key="c1").run_id  # fmt: skip
    worker = Worker(lane_policy("io"), concurrency=1, name="test-worker")
    held_while_running: list[list[str]] = []
    execute = worker._execute

    def spied(attempt: Attempt) -> Attempt | None:
        held_while_running.append([a.step.step_id for a in worker.inflight.values()])
        return execute(attempt)

    worker._execute = spied  # type: ignore[method-assign]
    # The first turn with s1 (a pure step run with it), then s2 and s3, each handed over by
    # the settle before it.
    assert run_due_steps(worker) == 3
    assert Run.objects.get(pk=run_id).status == "succeeded"
    assert held_while_running == [["decide"], ["s2"], ["s3"]]
    assert worker.inflight == {}


def test_skipping_time_passes_only_the_waits_pending_when_it_began(org: Organisation) -> None:
    """A definition's sleep fired by the skip walks on inline into a signal wait: that wait
    begins now, and its 2-day timeout is not passed by the same skip."""
    automation_publish_definition(org=org, slug="slept-then-signalled", definition={
        "start": "cool_off",
        "steps": [
            {"id": "cool_off", "type": "wait", "duration": "1d", "next": "kyc"},
            {"id": "kyc", "type": "wait_signal", "signal": "kyc", "correlation": "c",
             "timeout": "2d", "next": {"received": "done", "timed_out": "done"}},
            {"id": "done", "type": "end"},
        ],
    })  # fmt: skip
    t = WorkflowTest(org=org)
    t.run_id = run_start(org=org, automation_slug="slept-then-signalled", run_input={}).run_id
    assert [s.step_id for s in t.run_until_waiting().waiting] == ["cool_off"]
    assert t.skip_time() == 1
    assert [s.step_id for s in t.run_until_waiting().waiting] == ["kyc"]
    assert t.skip_time() == 1
    assert t.run_until_finished().status == "succeeded"
