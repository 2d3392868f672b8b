"""Sagas and failures of code workflows (docs/reference/code-workflows.md, "Sagas: undoing what a
run did" and "When a step fails"): compensations registered with ``ctx.compensate_with`` run through
the engine's own sagas (latest first, once per execution, each once at the provider, also when the
worker is killed mid-compensation); a step that fails for good is raised in the function as
``StepFailed``; ``ctx.run`` retries a function that raises on the engine's retry schedule. The
workflows: tests/code_saga_steps.py (the stub's paths are described there)."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from django.db.models.functions import Now
from django.test import override_settings
from pytest_django.fixtures import Settings

from timers.models import Timer
from timers.sweep import fire_due_timers
from workflows.code.context import RetryCall, Suspended
from workflows.models import Organisation, Run, RunEvent, Step
from workflows.plugins.code import Context, StepFailed, publish_code_workflow, workflow
from workflows.services.control import run_act
from workflows.services.rerun import rerun
from workflows.services.runs import run_start

from . import code_saga_steps  # noqa: F401 (registers the workflows here too)
from .effect_setup import connect, drive, events
from .processes import running, spawn, stop, wait_for
from .stubs import ProviderStub

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: dict[str, int] = {}  # how often each flaky function below was called


def flaky(name: str, fails: int) -> str:
    """Raises the first ``fails`` times it is called (per name), then answers."""
    CALLS[name] = CALLS.get(name, 0) + 1
    if CALLS[name] <= fails:
        raise ConnectionError(f"{name} unavailable ({CALLS[name]})")
    return f"{name} ok"


@workflow("code-retry", version=1)
def retried(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    name, fails, most = run_input["name"], run_input["fails"], run_input["max_attempts"]
    try:
        answer = ctx.run("fetch", flaky, name, fails, retry={"max_attempts": most})
    except StepFailed as failed:
        return {"caught": failed.error, "code": failed.code}
    return {"answer": answer}


@workflow("code-early-compensation", version=1)
def early(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.compensate_with("undo", "code_result", output=1)  # follows no step


FLIPPED = {"later": False}  # what the next replay of "code-flip-saga" calls after its nap


@workflow("code-flip-saga", version=1)
def flips(ctx: Context, run_input: dict[str, Any]) -> str:
    ctx.run("book", str, "booked")
    ctx.compensate_with("unbook", "code_result", output="unbooked")
    if FLIPPED["later"]:
        ctx.run("other", str, "x")  # the deployed code no longer takes the nap here
    ctx.sleep("nap", "1h")
    return "done"


def set_up(org: Organisation, stub: ProviderStub) -> None:
    stub.idempotent = True
    connect(org, base_url=stub.url, options={"idempotency_keys": True}, timeout_seconds=5)


def start(org: Organisation, name: str, run_input: dict[str, Any], key: str = "k1") -> int:
    publish_code_workflow(org=org, name=name, version=1)
    return run_start(org=org, automation_slug=name, run_input=run_input, start_key=key).run_id


def undone(stub: ProviderStub) -> list[tuple[str, Any]]:
    """The compensations the provider made, in the order it made them."""
    return [(item["body"]["op"], item["body"].get("n")) for item in stub.created]


def entered(run_id: int) -> list[tuple[str, Any, Any]]:
    return [(e.step_id, (e.detail or {})["compensates"], (e.detail or {})["compensates_iteration"])
            for e in events(run_id, "compensation.entered")]  # fmt: skip


# --- compensations ----------------------------------------------------------------------------


def test_a_charge_then_a_failure_is_refunded_once_and_the_run_ends_compensated(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    set_up(org, provider_stub)
    run_id = start(org, "code-saga", {"url": provider_stub.url, "fail": "fail"})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error
    assert run.error == "workflow_failed: out_of_stock"
    # Latest first: the charge's refund, then the reservation's release; each made once.
    assert undone(provider_stub) == [("undo_charge", 0), ("undo_reserve", None)]
    assert provider_stub.count("POST", "/echo/charge") == 1
    assert provider_stub.count("POST", "/echo/reserve") == 1
    (begun,) = events(run_id, "run.compensating")
    assert begun.step_id == "decide" and begun.detail is not None
    assert [e["step"] for e in begun.detail["plan"]] == ["undo_charge", "undo_reserve"]
    assert entered(run_id) == [("undo_charge", "charge", 1), ("undo_reserve", "reserve", 1)]
    # Each registration is a recorded step of the history, as replay reads it.
    records = Step.objects.filter(run_id=run_id, step_id="ctx.compensate").order_by("id")
    outputs: list[dict[str, Any]] = [r.output or {} for r in records]
    assert [(o["compensates"], o["call"]["id"]) for o in outputs] == [
        ("reserve", "undo_reserve"), ("charge", "undo_charge")]  # fmt: skip
    drive()  # nothing moves any more
    assert len(provider_stub.created) == 2


def test_a_rerun_of_a_compensated_run_makes_again_what_its_compensations_undid(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    set_up(org, provider_stub)
    run_id = start(org, "code-saga", {"url": provider_stub.url, "fail": "fail"})
    drive()
    assert Run.objects.get(pk=run_id).status == "compensated"
    assert undone(provider_stub) == [("undo_charge", 0), ("undo_reserve", None)]

    # The reservation is before the chosen step (kept); the charge was refunded, so its
    # answer is not taken again; the compensations' own effects are never reused.
    fixed = {"url": provider_stub.url}
    preview = rerun(org=org, run_id=run_id, from_step="charge", actor="ops", run_input=fixed)
    assert [(e.step_id, e.action) for e in preview.effects] == [("charge", "repeat")]
    assert preview.effects[0].why == "a compensation undid it: made again under the new key"

    rerun(org=org, run_id=run_id, from_step="charge", actor="ops", run_input=fixed,
          dry_run=False)  # fmt: skip
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("succeeded", ""), run.error
    assert provider_stub.count("POST", "/echo/charge") == 2  # charged again
    # Kept as it was: released by the compensation, and not made again (a re-run from a
    # later step keeps the steps before it; re-run from reserve to reserve again).
    assert provider_stub.count("POST", "/echo/reserve") == 1
    assert len(provider_stub.created) == 2  # no compensation ran again
    # Each registration of the new walk once (the re-run's turns read their own steps).
    records = Step.objects.filter(run_id=run_id, step_id="ctx.compensate")
    assert records.count() == 3  # reserve's and the first charge's, then the new charge's


def test_after_a_rerun_each_execution_is_undone_once(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    set_up(org, provider_stub)
    url = provider_stub.url
    # A run that succeeded, re-run from its charge to fail: the new entry took the one
    # charge's answer and registered its own refund; the set-aside entry's is not the run's.
    run_id = start(org, "code-saga", {"url": url}, key="once-a")
    drive()
    rerun(org=org, run_id=run_id, from_step="charge", actor="ops",
          run_input={"url": url, "fail": "fail"}, dry_run=False)  # fmt: skip
    drive()
    assert Run.objects.get(pk=run_id).status == "compensated"
    assert provider_stub.count("POST", "/echo/charge") == 1
    assert undone(provider_stub) == [("undo_charge", 0), ("undo_reserve", None)]
    assert entered(run_id) == [("undo_charge", "charge", 2), ("undo_reserve", "reserve", 1)]

    # Re-run again from the charge, failing again: the refunded charge is made again and
    # refunded; the reservation, released already, is not released twice.
    rerun(org=org, run_id=run_id, from_step="charge", actor="ops",
          run_input={"url": url, "fail": "fail"}, dry_run=False)  # fmt: skip
    drive()
    assert Run.objects.get(pk=run_id).status == "compensated"
    assert provider_stub.count("POST", "/echo/charge") == 2
    assert undone(provider_stub) == [("undo_charge", 0), ("undo_reserve", None), ("undo_charge", 0)]


def test_a_step_completed_in_a_loop_is_compensated_per_iteration_latest_first(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    set_up(org, provider_stub)
    run_id = start(org, "code-saga", {"url": provider_stub.url, "fail": "fail", "charges": 3})
    drive()
    assert Run.objects.get(pk=run_id).status == "compensated"
    assert undone(provider_stub) == [
        ("undo_charge", 2), ("undo_charge", 1), ("undo_charge", 0), ("undo_reserve", None),
    ]  # fmt: skip
    assert entered(run_id) == [
        ("undo_charge", "charge", 3), ("undo_charge", "charge", 2),
        ("undo_charge", "charge", 1), ("undo_reserve", "reserve", 1),
    ]  # fmt: skip
    # Each refund read the execution it undoes (``compensating``), as a definition's does.
    assert [item["body"]["undoes"] for item in provider_stub.created[:3]] == ["2", "1", "0"]
    # Its own iteration each, hence its own effect key.
    refunds = Step.objects.filter(run_id=run_id, step_id="undo_charge").order_by("iteration")
    assert [(s.iteration, s.status) for s in refunds] == [(1, "done"), (2, "done"), (3, "done")]
    keys = {item["key"] for item in provider_stub.created}
    assert len(keys) == 4


def test_an_uncaught_failed_step_fails_the_run_after_compensating(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    set_up(org, provider_stub)
    run_id = start(org, "code-saga", {"url": provider_stub.url, "fail": "ship", "charges": 2})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error
    assert run.error.startswith("step 'ship' failed: ")
    assert undone(provider_stub) == [("undo_charge", 1), ("undo_charge", 0), ("undo_reserve", None)]
    assert Step.objects.get(run_id=run_id, step_id="ship").status == "failed"


def test_an_exception_of_the_code_compensates(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    set_up(org, provider_stub)
    run_id = start(org, "code-saga", {"url": provider_stub.url, "fail": "raise"})
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("compensated", "workflow_failed: ValueError: boom")
    assert undone(provider_stub) == [("undo_charge", 0), ("undo_reserve", None)]


def test_a_compensation_that_fails_fails_the_run_and_a_retry_goes_on(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    set_up(org, provider_stub)
    provider_stub.fail_next(1, status=400, path_prefix="/items")  # the refund is refused
    run_id = start(org, "code-saga", {"url": provider_stub.url, "fail": "fail"})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"
    assert run.error.startswith("compensation_failed: step 'undo_charge' failed: ")
    assert "compensations left: undo_reserve (reserve #1)" in run.error
    assert run.error.endswith("compensating for: workflow_failed: out_of_stock")
    assert undone(provider_stub) == []

    # An operator's retry goes on with the plan where it stopped, as for a definition.
    turns = Step.objects.filter(run_id=run_id, step_id="decide").count()
    run_act(org=org, run_id=run_id, action="retry", actor="sam")
    drive()
    run.refresh_from_db()
    assert run.status == "compensated", run.error
    assert undone(provider_stub) == [("undo_charge", 0), ("undo_reserve", None)]
    assert provider_stub.count("POST", "/echo/charge") == 1  # nothing of the function again
    assert Step.objects.filter(run_id=run_id, step_id="decide").count() == turns


def test_a_run_whose_code_changed_under_it_compensates_what_its_history_registered(
    org: Organisation,
) -> None:
    FLIPPED["later"] = False
    run_id = start(org, "code-flip-saga", {})
    drive()
    assert Step.objects.get(run_id=run_id, step_id="nap").status == "waiting"
    FLIPPED["later"] = True
    try:
        Timer.objects.filter(run_id=run_id).update(due_at=Now())
        assert fire_due_timers().fired == 1
        drive()
    finally:
        FLIPPED["later"] = False
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated"
    assert run.error.startswith("nondeterministic_workflow: ")
    unbook = Step.objects.get(run_id=run_id, step_id="unbook")
    assert (unbook.status, unbook.output) == ("done", "unbooked")


def test_compensate_with_must_follow_a_completed_step(org: Organisation) -> None:
    run_id = start(org, "code-early-compensation", {})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"
    assert run.error.startswith("invalid_code_step: compensate_with('undo') follows no step")


# --- catching a failed step -------------------------------------------------------------------


def test_a_refused_http_step_is_caught_by_the_code_which_goes_on(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    set_up(org, provider_stub)
    run_id = start(org, "code-catch", {"url": provider_stub.url})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", run.error
    output: dict[str, Any] = run.output or {}
    caught = output["caught"]
    assert (caught["step"], caught["iteration"]) == ("ship", 1)
    ship = Step.objects.get(run_id=run_id, step_id="ship")
    assert ship.status == "failed" and caught["error"] == ship.error
    assert "refused the request (404)" in caught["error"]
    assert caught["code"] == "step_failed"  # the provider's refusal begins with no code
    assert provider_stub.count("POST", "/ship") == 1  # a 404 is not retried
    # Every later replay raised the same StepFailed at the same call: what the turn after
    # the failure recorded is what the last turn saw.
    assert output["seen"] == {"caught": caught}
    assert [s.step_id for s in Step.objects.filter(run_id=run_id).order_by("id")] == [
        "decide", "ship", "decide", "after", "decide"]  # fmt: skip


# --- retries of ctx.run -----------------------------------------------------------------------


def test_a_ctx_run_function_that_raises_is_retried_after_backoff_then_succeeds(
    org: Organisation,
) -> None:
    run_input = {"name": "twice", "fails": 2, "max_attempts": 3}
    run_id = start(org, "code-retry", run_input)
    drive()  # its retries' backoff made due at once (drive's fast_forward)
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", {"answer": "twice ok"})
    assert CALLS["twice"] == 3
    retries = events(run_id, "step.retry_scheduled")
    assert [(e.step_id, e.attempt) for e in retries] == [("decide", 1), ("decide", 2)]
    assert all(0 <= (e.detail or {})["delay_seconds"] <= 60 for e in retries)
    assert "step 'fetch' attempt 1 of 3: ConnectionError: twice unavailable (1)" in str(
        (retries[0].detail or {})["error"]
    )
    fetch = Step.objects.get(run_id=run_id, step_id="fetch")
    assert (fetch.status, fetch.output) == ("done", "twice ok")


def test_a_ctx_run_waiting_out_its_backoff_holds_no_worker(
    org: Organisation, settings: Settings
) -> None:
    # A backoff that cannot pass while the test drives (full jitter draws from 0 up to the
    # lane's base: with the default base, a short draw ran the retry at once).
    lanes = {**settings.WAYMARK["LANES"]}
    lanes["io"] = {**lanes["io"], "backoff_base_seconds": 3600.0, "backoff_cap_seconds": 3600.0}
    with override_settings(WAYMARK={**settings.WAYMARK, "LANES": lanes}):
        run_id = start(org, "code-retry", {"name": "slow", "fails": 1, "max_attempts": 2})
        drive(fast_forward=False)
    decide = Step.objects.get(run_id=run_id, step_id="decide")
    assert (decide.status, decide.wait_kind, decide.owner) == ("waiting", "retry", None)
    assert decide.wake_at is not None
    drive()
    assert Run.objects.get(pk=run_id).status == "succeeded"


def test_a_ctx_run_out_of_attempts_raises_step_failed_which_the_code_catches(
    org: Organisation,
) -> None:
    run_id = start(org, "code-retry", {"name": "never", "fails": 99, "max_attempts": 2})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", run.error
    assert run.output == {
        "caught": "ConnectionError: never unavailable (2) (attempt 2 of 2)",
        "code": "ConnectionError",
    }
    assert CALLS["never"] == 2
    fetch = Step.objects.get(run_id=run_id, step_id="fetch")
    assert fetch.status == "failed" and fetch.error == run.output["caught"]


def test_a_bad_retry_policy_fails_the_run_with_invalid_code_step(org: Organisation) -> None:
    run_id = start(org, "code-retry", {"name": "bad", "fails": 0, "max_attempts": 0})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and run.error.startswith("invalid_code_step: step 'fetch'")
    assert "bad" not in CALLS
    assert not events(run_id, "run.compensating")  # nothing registered: failed as before


def never_called() -> None:
    raise AssertionError("called")


def test_attempts_whose_worker_died_in_the_call_count_against_its_retries() -> None:
    """The turn's attempt is the ctx.run's: past its max_attempts (or the lane's usual number,
    when more) the call is recorded as failed without calling the function again; with
    attempts left, a function that raises asks for the engine's retry."""
    lost = Context(run_id=1, history=[], attempts_used=6, lost_claims_allowed=5)
    with pytest.raises(Suspended) as stopped:
        lost.run("fetch", never_called, retry={"max_attempts": 3})
    assert stopped.value.step["failed"] == "attempts exhausted: 5 attempt(s) never settled"
    more = Context(run_id=1, history=[], attempts_used=6, lost_claims_allowed=5)
    with pytest.raises(RetryCall):  # its own policy allows more: the sixth attempt runs
        more.run("fetch", flaky, "six", 99, retry={"max_attempts": 7})
    assert CALLS["six"] == 1


# --- a worker killed while compensating -------------------------------------------------------


@pytest.mark.parametrize("killed_in", [1, 2], ids=["first", "second"])
def test_a_worker_killed_mid_compensation_does_not_repeat_a_refund(
    org: Organisation, provider_stub: ProviderStub, killed_in: int
) -> None:
    """The worker is SIGKILLed while the provider holds the first compensation's call (the
    refund), or the second's (the refund made and settled): each is made exactly once."""
    set_up(org, provider_stub)
    run_id = start(org, "code-saga", {"url": provider_stub.url, "fail": "fail"})
    provider_stub.hold(from_arrival=killed_in)  # only /items (the compensations) is held
    fast = {"WAYMARK_EFFECTS_LEASE_MARGIN_SECONDS": "1", "WAYMARK_EFFECTS_DEFER_SECONDS": "0.2",
            "WAYMARK_WORKER_POLL_SECONDS": "0.1", "WAYMARK_IO_LEASE_SECONDS": "2",
            "WAYMARK_EXTRA_STEP_MODULES": "tests.code_saga_steps"}  # fmt: skip
    a = spawn("worker", "--lane", "io", "--concurrency", "1", "--grace", "5", **fast)
    with running(a):
        assert provider_stub.wait_arrived(killed_in, timeout=60), "no compensation arrived"
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
    assert len(provider_stub.created) == killed_in - 1  # the held one is not made yet
    provider_stub.release()  # the provider makes what its killed client no longer waits for
    wait_for(lambda: len(provider_stub.created) == killed_in,
             what="the held compensation to be made")  # fmt: skip
    assert Run.objects.get(pk=run_id).status == "running"  # compensating, not ended
    b = spawn("worker", "--lane", "io", "--concurrency", "2", "--grace", "5", **fast)
    with running(b):
        wait_for(lambda: Run.objects.get(pk=run_id).status != "running", timeout=60,
                 what="the run to end")  # fmt: skip
        stop(b)
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error
    assert undone(provider_stub) == [("undo_charge", 0), ("undo_reserve", None)]  # once each
    assert provider_stub.count("POST", "/echo/charge") == 1
    assert len(events(run_id, "run.compensating")) == 1
    assert [e.step_id for e in events(run_id, "compensation.entered")] == [
        "undo_charge", "undo_reserve"]  # fmt: skip
    # The killed attempt's step was taken over (a second attempt, the same effect key).
    killed = Step.objects.get(run_id=run_id, step_id=["undo_charge", "undo_reserve"][killed_in - 1])
    assert (killed.iteration, killed.status) == (1, "done") and killed.attempt >= 2
    assert RunEvent.objects.filter(run_id=run_id, kind="run.compensated").count() == 1
