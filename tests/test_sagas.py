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


def test_a_killed_worker_mid_compensation_still_compensates_each_once(org, provider_stub):
    run_id = set_up(org, provider_stub)
    provider_stub.hold()  # only /items (the compensations) waits: /echo answers at once
    fast = {"WAYMARK_EFFECTS_LEASE_MARGIN_SECONDS": "1", "WAYMARK_EFFECTS_DEFER_SECONDS": "0.2",
            "WAYMARK_WORKER_POLL_SECONDS": "0.1", "WAYMARK_IO_LEASE_SECONDS": "2"}  # fmt: skip
    a = spawn("worker", "--lane", "io", "--concurrency", "1", "--grace", "5", **fast)
    with running(a):
        assert provider_stub.wait_arrived(1, timeout=60), "no compensation reached the provider"
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
    provider_stub.release()  # the provider makes what its killed client no longer waits for
    wait_for(lambda: provider_stub.created, what="the held compensation to be made")
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


def test_two_branches_failing_compensate_each_completed_step_once(org, provider_stub):
    """Both branches of a parallel fail for good, one after the other: the first failure
    begins the compensation, the second is recorded and changes nothing more (before, it
    planned again and the provider was asked for each compensation twice, at new keys)."""
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
    # The first compensation's first call meets a 503 (tried again after a backoff), so the
    # second branch fails while the run compensates, whichever the worker runs first.
    provider_stub.fail_next(1, status=503, path_prefix="/items")
    run_id = start(org, definition)
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "compensated", run.error
    assert provider_stub.count("POST", "/ship") == 2  # both branches ran and failed
    failed_at = [e.kind for e in RunEvent.objects.filter(run_id=run_id).order_by("id")]
    assert (
        failed_at.index("run.compensating")
        < max(i for i, kind in enumerate(failed_at) if kind == "step.failed")
        < failed_at.index("run.compensated")
    )  # the second failure came mid-compensation
    assert undone(provider_stub) == ["undo_charge", "undo_reserve"]
    assert len(events(run_id, "run.compensating")) == 1
    assert Step.objects.filter(run_id=run_id, step_id__startswith="undo_").count() == 2
