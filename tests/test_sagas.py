"""Sagas: a step that fails for good after steps with compensations completed makes the run
compensate them, latest first, each exactly once at the provider, also when the worker is
killed mid-compensation; then the run ends `compensated`. A failing compensation fails the
run with what is known, and an operator's retry goes on with the rest.

The provider stub: the main steps call /echo/<op> (answered, counted), the step that fails
calls /ship (404: refused, fails for good), the compensations create items at /items (keyed,
so a repeat under the same key creates nothing new)."""

from __future__ import annotations

import io
import signal
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from webhooks.models import Delivery
from webhooks.services import webhook_create
from workflows.definitions.validator import definition_warnings, validate_definition
from workflows.engine.waits import fire_due_deadlines
from workflows.models import Run, RunEvent, Step
from workflows.plugins import Actor
from workflows.services.control import run_act
from workflows.services.signals import signal_send

from .effect_setup import connect, drive, events, start
from .processes import running, spawn, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def call(step_id: str, url: str, **extra: Any) -> dict[str, Any]:
    request = {"method": "POST", "url": url, "body": {"op": step_id, "n": "{{ input.n }}"}}
    return {"id": step_id, "type": "http", "connection": "api", "request": request, **extra}


def saga(url: str) -> dict[str, Any]:
    """reserve -> charge -> ship (fails); reserve and charge declare their compensations."""
    return {
        "start": "reserve",
        "steps": [
            call("reserve", f"{url}/echo/reserve", next="charge", compensate="undo_reserve"),
            call("charge", f"{url}/echo/charge", next="ship", compensate="undo_charge"),
            call("ship", f"{url}/ship", next="done", retry={"max_attempts": 1}),
            {"id": "done", "type": "end"},
            call("undo_charge", f"{url}/items"),
            call("undo_reserve", f"{url}/items"),
        ],
    }


def set_up(org: Any, stub: Any) -> int:
    stub.idempotent = True
    connect(org, base_url=stub.url, options={"idempotency_keys": True}, timeout_seconds=5)
    return start(org, saga(stub.url))


def undone(stub: Any) -> list[str]:
    """The compensations the provider made, in the order it made them."""
    return [item["body"]["op"] for item in stub.created]


def kinds(run_id: int) -> list[str]:
    return list(
        RunEvent.objects.filter(run_id=run_id).order_by("id").values_list("kind", flat=True)
    )


def test_a_failed_third_step_compensates_the_second_then_the_first(org, provider_stub):
    run_id = set_up(org, provider_stub)
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error
    assert "step 'ship' failed" in run.error
    assert undone(provider_stub) == ["undo_charge", "undo_reserve"]
    assert provider_stub.count("POST", "/echo/reserve") == 1
    assert provider_stub.count("POST", "/echo/charge") == 1
    (begun,) = events(run_id, "run.compensating")
    assert begun.step_id == "ship" and begun.detail is not None
    assert [e["step"] for e in begun.detail["plan"]] == ["undo_charge", "undo_reserve"]
    entered = events(run_id, "compensation.entered")
    assert [(e.step_id, (e.detail or {})["compensates"]) for e in entered] == [
        ("undo_charge", "charge"), ("undo_reserve", "reserve")]  # fmt: skip
    history = kinds(run_id)
    assert history.index("run.compensating") < history.index("run.compensated")
    steps = Step.objects.filter(run_id=run_id, step_id__startswith="undo_")
    assert sorted((s.step_id, s.iteration, s.status) for s in steps) == [
        ("undo_charge", 1, "done"), ("undo_reserve", 1, "done")]  # fmt: skip


def test_no_completed_compensation_fails_the_run_as_before(org, provider_stub):
    provider_stub.idempotent = True
    connect(org, base_url=provider_stub.url, options={"idempotency_keys": True})
    definition = saga(provider_stub.url)
    definition["start"] = "ship"  # nothing completed before it fails
    definition["steps"] = [s for s in definition["steps"] if s["id"] not in ("reserve", "charge")]
    definition["steps"][0]["compensate"] = "undo_charge"
    definition["steps"] = [s for s in definition["steps"] if s["id"] != "undo_reserve"]
    run_id = start(org, definition)
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and "step 'ship' failed" in run.error
    assert undone(provider_stub) == [] and not events(run_id, "run.compensating")


@pytest.mark.parametrize("killed_in", [1, 2], ids=["first", "second"])
def test_a_killed_worker_mid_compensation_still_compensates_each_once(
    org, provider_stub, killed_in
):
    """The worker is SIGKILLed while the provider holds the first compensation's call, or
    the second's (the first made and settled): each is made exactly once."""
    run_id = set_up(org, provider_stub)
    # Only /items (the compensations) is held, from the killed_in-th call on: /echo answers.
    provider_stub.hold(from_arrival=killed_in)
    fast = {"WAYMARK_EFFECTS_LEASE_MARGIN_SECONDS": "1", "WAYMARK_EFFECTS_DEFER_SECONDS": "0.2",
            "WAYMARK_WORKER_POLL_SECONDS": "0.1", "WAYMARK_IO_LEASE_SECONDS": "2"}  # fmt: skip
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
    assert undone(provider_stub) == ["undo_charge", "undo_reserve"]  # each exactly once
    assert provider_stub.count("POST", "/echo/reserve") == 1
    assert provider_stub.count("POST", "/echo/charge") == 1
    assert len(events(run_id, "run.compensating")) == 1
    assert [e.step_id for e in events(run_id, "compensation.entered")] == [
        "undo_charge", "undo_reserve"]  # fmt: skip
    # The killed attempt's step was taken over (a second attempt, the same effect key).
    killed = Step.objects.get(run_id=run_id, step_id=["undo_charge", "undo_reserve"][killed_in - 1])
    assert (killed.iteration, killed.status) == (1, "done") and killed.attempt >= 2


def test_a_failing_compensation_fails_the_run_and_a_retry_goes_on(org, provider_stub):
    run_id = set_up(org, provider_stub)
    provider_stub.fail_next(1, status=400, path_prefix="/items")  # undo_charge is refused
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"
    assert run.error.startswith("compensation_failed: step 'undo_charge' failed")
    assert "compensations left: undo_reserve" in run.error
    assert "compensating for: step 'ship' failed" in run.error
    assert undone(provider_stub) == []

    run_act(org=org, run_id=run_id, action="retry", actor="sam")
    drive()
    run.refresh_from_db()
    assert run.status == "compensated", run.error
    assert undone(provider_stub) == ["undo_charge", "undo_reserve"]
    # The step that began the compensation is not run again, nor anything before it.
    assert provider_stub.count("POST", "/ship") == 1
    assert provider_stub.count("POST", "/echo/charge") == 1
    assert Step.objects.get(run_id=run_id, step_id="ship").status == "failed"


def test_a_deadline_ending_failed_compensates(org, provider_stub):
    """A timeout as the trigger: a signal not received in time leads to a failed end."""
    provider_stub.idempotent = True
    connect(org, base_url=provider_stub.url, options={"idempotency_keys": True})
    url = provider_stub.url
    definition = {
        "start": "charge",
        "steps": [
            call("charge", f"{url}/echo/charge", next="paid", compensate="refund"),
            {"id": "paid", "type": "wait_signal", "signal": "order.paid",
             "correlation": "{{ input.n }}", "timeout": "1s",
             "next": {"received": "done", "timed_out": "give_up"}},
            {"id": "done", "type": "end"},
            {"id": "give_up", "type": "end", "status": "failed"},
            call("refund", f"{url}/items"),
        ],
    }  # fmt: skip
    run_id = start(org, definition)
    drive()
    Step.objects.filter(run_id=run_id, step_id="paid").update(wake_at="2000-01-01T00:00:00Z")
    assert fire_due_deadlines() == 1
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error
    assert "ended by step 'give_up'" in run.error
    assert undone(provider_stub) == ["refund"]


# --- the definition ------------------------------------------------------------------------


def codes(definition: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    return [(i.code, i.step, i.field) for i in validate_definition(definition)]


URL = "https://provider.example"


def test_a_saga_definition_is_valid_and_its_compensations_need_no_edge():
    assert codes(saga(URL)) == []


def test_bad_compensations_have_codes():
    unknown = saga(URL)
    unknown["steps"][0]["compensate"] = "undo_nothing"
    assert ("compensation_unknown_step", "reserve", "compensate") in codes(unknown)

    later = saga(URL)
    later["steps"][0]["compensate"] = "ship"  # a later step of the main path
    assert ("compensation_refers_to_later_step", "reserve", "compensate") in codes(later)

    reachable = saga(URL)
    reachable["steps"][1]["compensate"] = "reserve"  # an earlier ordinary step
    assert ("compensation_is_reachable", "charge", "compensate") in codes(reachable)

    chained = saga(URL)
    chained["steps"][4]["next"] = "undo_reserve"
    assert ("invalid_compensation", "undo_charge", "next") in codes(chained)

    ending = saga(URL)
    ending["steps"][1]["compensate"] = "done"
    assert ("invalid_compensation", "done", "type") in codes(ending)

    flag = saga(URL)
    flag["steps"][0]["irreversible"] = "yes"
    assert ("invalid_field", "reserve", "irreversible") in codes(flag)


def test_an_irreversible_step_before_an_uncompensated_risky_step_is_a_warning():
    definition = saga(URL)
    definition["steps"][1]["irreversible"] = True  # charge, then ship can fail: warned
    assert codes(definition) == []  # a warning, not an error
    warnings = definition_warnings(definition)
    assert [(w.code, w.step) for w in warnings] == [("irreversible_not_last", "charge")]
    assert '"ship"' in warnings[0].message

    last = saga(URL)
    last["steps"][2]["irreversible"] = True  # the risky step itself, irreversible, last
    assert definition_warnings(last) == []


def test_the_api_shows_warnings_refuses_bad_compensations_and_filters_compensated(
    api, org, provider_stub
):
    assert api.post("/api/v1/automations", {"slug": "saga"}, format="json").status_code == 201
    risky = saga(URL)
    risky["steps"][1]["irreversible"] = True
    saved = api.post("/api/v1/automations/saga/versions", {"definition": risky}, format="json")
    assert saved.status_code == 201, saved.json()
    assert [w["code"] for w in saved.json()["warnings"]] == ["irreversible_not_last"]
    read = api.get("/api/v1/automations/saga/versions/1").json()
    assert read["warnings"] == saved.json()["warnings"]

    bad = saga(URL)
    bad["steps"][0]["compensate"] = "ship"
    refused = api.post("/api/v1/automations/saga/versions", {"definition": bad}, format="json")
    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid_definition"
    # (undo_reserve is left unreachable, and ship, now a compensation, has a next)
    assert "compensation_refers_to_later_step" in [e["code"] for e in refused.json()["errors"]]
    assert len(api.get("/api/v1/automations/saga/versions").json()["results"]) == 1  # no more

    run_id = set_up(org, provider_stub)
    drive()
    with pytest.raises(CommandError) as caught:
        call_command("runs", "tail", "--org", org.slug, str(run_id), stdout=io.StringIO())
    assert caught.value.returncode == 6
    assert str(caught.value) == f"run_compensated: run {run_id} was compensated"
    listed = api.get("/api/v1/runs?status=compensated").json()["results"]
    assert [run["id"] for run in listed] == [run_id]
    assert listed[0]["status"] == "compensated"


def test_a_compensated_run_is_sent_to_webhook_subscribers(org, provider_stub):
    webhook_create(org=org, url="https://hooks.example/saga", actor=Actor.system("test"),
                   event_types=["run.compensated", "run.failed"])  # fmt: skip
    run_id = set_up(org, provider_stub)
    drive()
    (sent,) = Delivery.objects.filter(org=org)  # compensated, not failed
    assert (sent.event_type, sent.run_id) == ("run.compensated", run_id)
    assert "step 'ship' failed" in sent.payload["detail"]["error"]


def test_the_admin_filters_compensated_runs(org, provider_stub, admin_client):
    run_id = set_up(org, provider_stub)
    drive()
    listed = admin_client.get("/admin/workflows/run/?status__exact=compensated")
    assert listed.status_code == 200
    html = listed.content.decode()
    assert f"/admin/workflows/run/{run_id}/change/" in html
    assert "Compensated" in html  # the status filter offers it
    empty = admin_client.get("/admin/workflows/run/?status__exact=failed").content.decode()
    assert f"/admin/workflows/run/{run_id}/change/" not in empty


def test_a_branch_failing_cancels_the_other_and_each_compensation_runs_once(org, provider_stub):
    """Both branches of a parallel would fail for good: the first failure begins the
    compensation and cancels the other branch (claimed with it, not yet run), which then
    does not run; each completed step is compensated once."""
    provider_stub.idempotent = True
    connect(org, base_url=provider_stub.url, options={"idempotency_keys": True})
    url = provider_stub.url
    definition = {
        "start": "reserve",
        "steps": [
            call("reserve", f"{url}/echo/reserve", next="charge", compensate="undo_reserve"),
            call("charge", f"{url}/echo/charge", next="fan", compensate="undo_charge"),
            {"id": "fan", "type": "parallel", "branches": ["ship_a", "ship_b"], "next": "meet"},
            call("ship_a", f"{url}/ship", next="meet", retry={"max_attempts": 1}),
            call("ship_b", f"{url}/ship", next="meet", retry={"max_attempts": 1}),
            {"id": "meet", "type": "join", "wait_for": ["ship_a", "ship_b"], "next": "done"},
            {"id": "done", "type": "end"},
            call("undo_charge", f"{url}/items"),
            call("undo_reserve", f"{url}/items"),
        ],
    }
    run_id = start(org, definition)
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error
    assert provider_stub.count("POST", "/ship") == 1  # the other branch was cancelled
    ships = Step.objects.filter(run_id=run_id, step_id__startswith="ship_")
    assert sorted(s.status for s in ships) == ["cancelled", "failed"]
    assert undone(provider_stub) == ["undo_charge", "undo_reserve"]
    assert len(events(run_id, "run.compensating")) == 1
    assert Step.objects.filter(run_id=run_id, step_id__startswith="undo_").count() == 2


# --- budgets, outcomes, loops, live branches (issue 30 review) ------------------------------


def test_the_step_budget_does_not_cut_the_compensation_short(org, provider_stub):
    """The forward path uses the whole budget (3 steps); its 2 compensations still run: the
    plan is bounded by what completed, and half an undo is the worst outcome."""
    provider_stub.idempotent = True
    connect(org, base_url=provider_stub.url, options={"idempotency_keys": True})
    definition = {**saga(provider_stub.url), "limits": {"max_steps": 3}}
    run_id = start(org, definition)
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error  # (before: failed, step_budget_exceeded)
    assert undone(provider_stub) == ["undo_charge", "undo_reserve"]
    assert run.steps_executed == 5


def test_a_run_past_its_max_age_mid_compensation_still_compensates(org, provider_stub):
    run_id = set_up(org, provider_stub)
    # The first compensation's first call is asked to come back in a minute: the run is
    # compensating, its first compensation waiting out a backoff.
    provider_stub.rate_limit_next(1, retry_after=60, path_prefix="/items")
    drive(fast_forward=False)
    assert Step.objects.get(run_id=run_id, step_id="undo_charge").wait_kind == "retry"
    Run.objects.filter(pk=run_id).update(deadline_at="2000-01-01T00:00:00Z")  # past max age
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error  # (before: failed, max_age_exceeded)
    assert undone(provider_stub) == ["undo_charge", "undo_reserve"]


def test_a_retry_of_a_run_stopped_mid_compensation_goes_on_with_the_plan(org, provider_stub):
    """However the run stopped while compensating (here as a budget stopped it before: the
    run failed and its live compensation was ended with it), a retry goes on with the plan
    from the compensation it stopped at, never from the step that began it."""
    run_id = set_up(org, provider_stub)
    provider_stub.rate_limit_next(1, retry_after=60, path_prefix="/items")
    drive(fast_forward=False)
    Run.objects.filter(pk=run_id).update(status="failed", error="step_budget_exceeded: ...")
    Step.objects.filter(run_id=run_id, step_id="undo_charge").update(status="cancelled")

    run_act(org=org, run_id=run_id, action="retry", actor="sam")
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error
    assert undone(provider_stub) == ["undo_charge", "undo_reserve"]
    assert provider_stub.count("POST", "/ship") == 1  # (before: the retry ran ship again)
    (retried,) = events(run_id, "run.retried")
    assert retried.detail is not None and retried.detail["steps"] == ["undo_charge"]
    assert retried.detail["compensation_position"] == 1
    undos = Step.objects.filter(run_id=run_id, step_id="undo_charge")
    assert sorted(undos.values_list("iteration", "status")) == [(1, "cancelled"), (2, "done")]


def confirmed_release(url: str) -> dict[str, Any]:
    """reserve -> ship (fails); reserve's compensation waits for the warehouse to confirm the
    release (a signal), for at most a second: timed out is not released."""
    return {
        "start": "reserve",
        "steps": [
            call("reserve", f"{url}/echo/reserve", next="ship", compensate="released"),
            call("ship", f"{url}/ship", next="done", retry={"max_attempts": 1}),
            {"id": "done", "type": "end"},
            {"id": "released", "type": "wait_signal", "signal": "stock.released",
             "correlation": "{{ input.n }}", "timeout": "1s"},
        ],
    }  # fmt: skip


def time_out(run_id: int, step_id: str) -> None:
    Step.objects.filter(run_id=run_id, step_id=step_id, status="waiting").update(
        wake_at="2000-01-01T00:00:00Z"
    )
    assert fire_due_deadlines() == 1


def test_a_compensation_ending_with_an_outcome_that_is_not_a_success_fails_the_run(
    org, provider_stub
):
    connect(org, base_url=provider_stub.url)
    run_id = start(org, confirmed_release(provider_stub.url))
    drive()
    assert Step.objects.get(run_id=run_id, step_id="released").status == "waiting"
    time_out(run_id, "released")
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"  # (before: compensated, though nothing was released)
    assert run.error.startswith(
        "compensation_failed: step 'released' ended with outcome 'timed_out', not a success"
    )
    assert "compensating for: step 'ship' failed" in run.error

    # The operator's retry waits for the confirmation again (a new wait), not ship.
    run_act(org=org, run_id=run_id, action="retry", actor="sam")
    waiting = Step.objects.get(run_id=run_id, step_id="released", status="waiting")
    assert waiting.iteration == 2
    signal_send(org=org, name="stock.released", correlation="1")
    run.refresh_from_db()
    assert run.status == "compensated", run.error
    assert provider_stub.count("POST", "/ship") == 1


def test_every_completed_execution_is_compensated_with_its_own_output(org, provider_stub):
    """charge completes in three loop turns, then ship fails: three refunds, latest first,
    each reading the charge it undoes (compensating.output), each at its own effect key."""
    provider_stub.idempotent = True
    connect(org, base_url=provider_stub.url, options={"idempotency_keys": True})
    url = provider_stub.url
    charge = {"method": "POST", "url": f"{url}/echo/charge", "body": {"turn": "{{ vars.turn }}"}}
    refund = {"method": "POST", "url": f"{url}/items",
              "body": {"op": "refund", "turn": "{{ compensating.output.body.body.turn }}",
                       "of": "{{ compensating.step }} #{{ compensating.iteration }}"}}  # fmt: skip
    definition = {
        "start": "init",
        "limits": {"max_steps": 50},
        "steps": [
            {"id": "init", "type": "set", "values": {"turn": 0}, "next": "count"},
            {"id": "count", "type": "set", "values": {"turn": "{{ (vars.turn | int) + 1 }}"},
             "next": "charge"},
            {"id": "charge", "type": "http", "connection": "api", "request": charge,
             "next": "again", "compensate": "refund"},
            {"id": "again", "type": "branch",
             "when": [{"outcome": "more", "if": "vars.turn | int < 3"}],
             "next": {"more": "count", "default": "ship"}},
            call("ship", f"{url}/ship", next="done", retry={"max_attempts": 1}),
            {"id": "done", "type": "end"},
            {"id": "refund", "type": "http", "connection": "api", "request": refund},
        ],
    }  # fmt: skip
    assert definition_warnings(definition) == []  # it reads compensating: nothing ambiguous
    run_id = start(org, definition)
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error
    assert provider_stub.count("POST", "/echo/charge") == 3
    made = [(item["body"]["turn"], item["body"]["of"]) for item in provider_stub.created]
    assert made == [("3", "charge #3"), ("2", "charge #2"), ("1", "charge #1")]
    assert len({item["key"] for item in provider_stub.created}) == 3  # three effect keys
    refunds = Step.objects.filter(run_id=run_id, step_id="refund").order_by("iteration")
    assert [(s.iteration, s.status) for s in refunds] == [(1, "done"), (2, "done"), (3, "done")]


def test_two_steps_sharing_a_compensation_are_each_compensated(org, provider_stub):
    provider_stub.idempotent = True
    connect(org, base_url=provider_stub.url, options={"idempotency_keys": True})
    url = provider_stub.url
    undo = {"method": "POST", "url": f"{url}/items",
            "body": {"op": "undo", "of": "{{ compensating.step }}"}}  # fmt: skip
    definition = saga(url)
    definition["steps"][0]["compensate"] = definition["steps"][1]["compensate"] = "undo"
    definition["steps"][4:] = [{"id": "undo", "type": "http", "connection": "api",
                                "request": undo}]  # fmt: skip
    run_id = start(org, definition)
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error
    assert [item["body"]["of"] for item in provider_stub.created] == ["charge", "reserve"]
    entered = events(run_id, "compensation.entered")
    assert [(e.step_id, e.iteration, (e.detail or {})["compensates"]) for e in entered] == [
        ("undo", 1, "charge"), ("undo", 2, "reserve")]  # fmt: skip


def test_a_compensation_reading_the_latest_output_of_a_step_it_undoes_often_is_warned():
    looped = {
        "start": "charge",
        "limits": {"max_steps": 20},
        "steps": [
            call("charge", f"{URL}/charge", next="again", compensate="refund"),
            {"id": "again", "type": "branch", "when": [{"outcome": "more", "if": "true"}],
             "next": {"more": "charge", "default": "done"}},
            {"id": "done", "type": "end"},
            {**call("refund", f"{URL}/refunds"),
             "request": {"method": "POST", "url": f"{URL}/refunds",
                         "body": {"charge": "{{ steps.charge.output.body.id }}"}}},
        ],
    }  # fmt: skip
    assert codes(looped) == []
    (warning,) = definition_warnings(looped)
    assert (warning.code, warning.step) == ("ambiguous_compensation", "refund")
    assert "loop" in warning.message and "compensating.output" in warning.message

    shared = saga(URL)
    shared["steps"][0]["compensate"] = shared["steps"][1]["compensate"] = "undo_charge"
    del shared["steps"][5]
    shared["steps"][4]["request"]["body"] = {"id": "{{ steps['charge'].output.body.id }}"}
    assert [(w.code, w.step) for w in definition_warnings(shared)] == [
        ("ambiguous_compensation", "undo_charge")]  # fmt: skip


def parallel_saga(url: str) -> dict[str, Any]:
    """reserve -> [pack | confirm]: pack calls the provider (held by the test); confirm waits
    for a payment signal, and its time out ends the run failed: the run compensates."""
    pack = {"method": "PUT", "url": f"{url}/contacts/pack", "body": {"op": "pack"}}
    return {
        "start": "reserve",
        "steps": [
            call("reserve", f"{url}/echo/reserve", next="fan", compensate="undo_reserve"),
            {"id": "fan", "type": "parallel", "branches": ["pack", "confirm"], "next": "meet"},
            {"id": "pack", "type": "http", "connection": "api", "request": pack,
             "next": "label"},
            call("label", f"{url}/echo/label", next="meet"),
            {"id": "confirm", "type": "wait_signal", "signal": "order.paid",
             "correlation": "{{ input.n }}", "timeout": "1h",
             "next": {"received": "meet", "timed_out": "give_up"}},
            {"id": "give_up", "type": "end", "status": "failed"},
            {"id": "meet", "type": "join", "wait_for": ["pack", "confirm"], "next": "done"},
            {"id": "done", "type": "end"},
            call("undo_reserve", f"{url}/items"),
        ],
    }  # fmt: skip


def test_compensation_cancels_the_live_branches_and_their_late_settle_changes_nothing(
    org, provider_stub
):
    """A branch's call is held at the provider (its worker executing it) when the other
    branch fails the run: compensation begins by cancelling it (step.cancelled, as a cancel
    does), and its settle once the provider answers is fenced out: nothing after it runs."""
    provider_stub.idempotent = True
    connect(org, base_url=provider_stub.url, options={"idempotency_keys": True})
    provider_stub.hold()  # pack's upsert and the compensation's call wait at the provider
    run_id = start(org, parallel_saga(provider_stub.url))
    fast = {"WAYMARK_WORKER_POLL_SECONDS": "0.1", "WAYMARK_IO_LEASE_SECONDS": "2"}
    worker = spawn("worker", "--lane", "io", "--concurrency", "2", "--grace", "5", **fast)
    with running(worker):
        assert provider_stub.wait_arrived(1, timeout=60), "pack never reached the provider"
        time_out(run_id, "confirm")  # the other branch ends the run failed: compensate
        pack = Step.objects.get(run_id=run_id, step_id="pack")
        assert pack.status == "cancelled"  # (before: running on, then done)
        # pack, and the join it would have completed, cancelled as a cancel does
        cancelled = events(run_id, "step.cancelled")
        assert sorted(e.step_id for e in cancelled) == ["meet", "pack"]
        assert all(e.detail == {"reason": "the run compensates"} for e in cancelled)
        history = kinds(run_id)
        assert history.index("run.compensating") < history.index("step.cancelled")
        provider_stub.release()
        wait_for(lambda: Run.objects.get(pk=run_id).status != "running", timeout=60,
                 what="the run to end")  # fmt: skip
        # pack's worker settles late (or learns at a heartbeat); either way, fenced out
        wait_for(lambda: provider_stub.contacts, what="pack's held call to be made")
        stop(worker)
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error
    assert undone(provider_stub) == ["undo_reserve"]
    assert Step.objects.get(run_id=run_id, step_id="pack").status == "cancelled"
    assert not events(run_id, "step.succeeded") or all(
        e.step_id != "pack" for e in events(run_id, "step.succeeded"))  # fmt: skip
    assert "pack" not in run.outputs
    assert not Step.objects.filter(run_id=run_id, step_id="label").exists()
    assert provider_stub.count("POST", "/echo/label") == 0
