"""Signals: stored once per identity, delivered to the waiting step or kept until one waits,
consumed with the run's advance in one transaction; racing deadlines; through the API and
inbound email; and with real processes."""

from __future__ import annotations

import pytest
from django.db.models.functions import Now

from workflows.engine.signals import deliver, drop_old
from workflows.engine.sweep import sweep_once
from workflows.models import Run, RunEvent, Signal, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .processes import exit_code, running, spawn, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def waits_for(signal: str = "order.paid", correlation: str = "{{ input.order }}",
              timeout: str | None = "1d", before: dict | None = None) -> dict:  # fmt: skip
    wait: dict = {"id": "wait", "type": "wait_signal", "signal": signal,
                  "correlation": correlation,
                  "next": {"received": "paid", "timed_out": "late"}}  # fmt: skip
    if timeout:
        wait["timeout"] = timeout
    paid = {"id": "paid", "type": "end", "output": "{{ steps.wait.output.payload.amount }}"}
    steps = [wait, paid, {"id": "late", "type": "end", "status": "failed"}]
    if before:
        steps.insert(0, {**before, "next": "wait"})
    return {"start": steps[0]["id"], "steps": steps}


def start(org, definition: dict, key: str = "k", run_input: dict | None = None) -> int:
    automation_publish_definition(org=org, slug="signal", definition=definition)
    return run_start(org=org, automation_slug="signal", run_input=run_input or {"order": "o-7"},
                     start_key=key).run_id  # fmt: skip


def run_of(run_id: int) -> Run:
    return Run.objects.get(pk=run_id)


def kinds(run_id: int) -> list[str]:
    return list(RunEvent.objects.filter(run_id=run_id).values_list("kind", flat=True))


def test_a_waiting_step_takes_the_signal_and_the_run_moves_on(org, api):
    run_id = start(org, waits_for())
    step = Step.objects.get(run_id=run_id, step_id="wait")
    assert (step.status, step.lane) == ("waiting", "inline")  # waits without a slot
    answer = api.post("/api/v1/signals", {"name": "order.paid", "correlation": "o-7",
                                          "id": "pay-1", "payload": {"amount": 42}},
                      format="json")  # fmt: skip
    assert answer.status_code == 201, answer.json()
    assert answer.json()["status"] == "consumed"
    assert answer.json()["consumed_by"] == f"{run_id}/wait/1"
    run = run_of(run_id)
    assert (run.status, run.output) == ("succeeded", "42")


def test_the_answer_and_the_list_name_the_run_that_took_the_signal(org, api):
    run_id = start(org, waits_for())
    body = {"name": "order.paid", "correlation": "o-7", "id": "pay-1"}
    taken = api.post("/api/v1/signals", body, format="json")
    again = api.post("/api/v1/signals", body, format="json")  # the same signal: the same run
    for answer in (taken, again):
        assert answer.json()["status"] == "consumed"
        assert answer.json()["run"] == run_id
        assert answer.json()["links"]["self"] == f"/api/v1/runs/{run_id}"
        assert "run_created" not in answer.json()  # only signal-with-start starts one
    # Nobody waits for this one: no run yet. The run that later takes it is named in the list.
    kept = api.post("/api/v1/signals", {"name": "order.paid", "correlation": "o-8"},
                    format="json").json()  # fmt: skip
    assert (kept["status"], kept["run"]) == ("pending", None) and "links" not in kept
    assert api.get("/api/v1/signals?correlation=o-8").json()["results"][0]["run"] is None
    later = start(org, waits_for(), key="k2", run_input={"order": "o-8"})
    listed = {s["correlation"]: s["run"] for s in api.get("/api/v1/signals").json()["results"]}
    assert listed == {"o-7": run_id, "o-8": later}


def test_a_signal_sent_twice_is_applied_once(org, api):
    run_id = start(org, waits_for())
    body = {"name": "order.paid", "correlation": "o-7", "id": "pay-1", "payload": {"amount": 1}}
    first = api.post("/api/v1/signals", body, format="json")
    second = api.post("/api/v1/signals", body, format="json")
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["duplicate"] is True and second.json()["id"] == first.json()["id"]
    # A second run waiting on the same correlation is not given the duplicate.
    other = start(org, waits_for(), key="k2")
    assert Step.objects.get(run_id=other, step_id="wait").status == "waiting"
    assert kinds(run_id).count("step.signal") == 1
    assert Signal.objects.count() == 1


def test_a_signal_that_came_first_is_kept_until_the_run_waits(org):
    sent = deliver(org_id=org.pk, name="order.paid", correlation="o-7", payload={"amount": 9})
    assert sent.consumed_by == ""
    run_id = start(org, waits_for())
    run = run_of(run_id)
    assert (run.status, run.output) == ("succeeded", "9")
    signal = Signal.objects.get()
    assert signal.consumed_at is not None and signal.consumed_by == f"{run_id}/wait/1"


def test_the_deadline_takes_the_timed_out_path_and_a_late_signal_is_kept(org):
    run_id = start(org, waits_for(timeout="1h"))
    Step.objects.filter(run_id=run_id, step_id="wait").update(wake_at=Now())
    assert sweep_once().deadlines == 1
    assert run_of(run_id).status == "failed"
    assert "step.deadline_passed" in kinds(run_id)
    late = deliver(org_id=org.pk, name="order.paid", correlation="o-7")
    assert late.consumed_by == ""  # nobody waits: kept (and shown as pending)
    assert Signal.objects.get().consumed_at is None


def test_every_wait_has_a_deadline(org, settings):
    run_id = start(org, waits_for(timeout=None))
    step = Step.objects.get(run_id=run_id, step_id="wait")
    assert step.wake_at is not None  # the default timeout (30 days)
    assert step.wait_detail is not None and step.wait_detail["on_deadline"] == "timed_out"


def test_signal_with_start_starts_the_run_once_and_delivers(org, api):
    automation_publish_definition(org=org, slug="signal", definition=waits_for(correlation=""))
    begin = {"automation": "signal", "start_key": "order-7", "input": {"order": "x"}}
    body = {"name": "order.paid", "id": "s1", "payload": {"amount": 5}, "start": begin}
    answer = api.post("/api/v1/signals", body, format="json")
    assert answer.status_code == 201, answer.json()
    run_id = answer.json()["run"]
    assert answer.json()["run_created"] is True and answer.json()["status"] == "consumed"
    assert run_of(run_id).output == "5"
    again = api.post("/api/v1/signals", {**body, "id": "s2"}, format="json")
    assert again.json()["run"] == run_id and again.json()["run_created"] is False
    assert again.json()["status"] == "pending"  # the run no longer waits: kept


def test_a_reply_to_a_runs_email_is_delivered_by_its_in_reply_to(org, api):
    definition = waits_for(signal="email.reply", correlation="{{ input.sent }}")
    definition["steps"][1]["output"] = "{{ steps.wait.output.payload.text }}"
    run_id = start(org, definition, run_input={"sent": "<a.b@waymark.invalid>"})
    body = {"message_id": "<reply-1@mail.example>", "in_reply_to": "<other@x>",
            "references": ["<a.b@waymark.invalid>", "<other@x>"], "text": "Yes please"}  # fmt: skip
    answer = api.post("/api/v1/inbound-email", body, format="json")
    assert answer.status_code == 201, answer.json()
    assert run_of(run_id).output == "Yes please"
    assert api.post("/api/v1/inbound-email", body, format="json").json()["duplicate"] is True


def test_unmatched_signals_are_listed_with_their_age_then_dropped_with_a_record(org, api, settings):
    deliver(org_id=org.pk, name="nobody.waits", correlation="x", payload={"secret": "s"})
    listed = api.get("/api/v1/signals?status=pending").json()["results"]
    assert [s["name"] for s in listed] == ["nobody.waits"] and listed[0]["status"] == "pending"
    settings.WAYMARK = {**settings.WAYMARK, "SIGNAL_RETENTION_DAYS": 1}
    assert drop_old() == 0  # not old enough
    Signal.objects.update(received_at=Now() - __import__("datetime").timedelta(days=2))
    assert drop_old() == 1
    signal = Signal.objects.get()
    assert signal.dropped_at is not None and signal.payload is None  # the row is the record
    assert api.get("/api/v1/signals?status=pending").json()["results"] == []


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"name": "9bad"}, 400, "invalid_input"),
        ({"name": "ok", "payload": {"a": "\u0000"}}, 400, "invalid_input"),
        ({"name": "ok", "payload": {"a": "x" * 70_000}}, 413, "payload_too_large"),
        (
            {"name": "ok", "start": {"automation": "nope", "start_key": "k"}},
            404,
            "unknown_automation",
        ),
        ({"correlation": "x"}, 400, "invalid_input"),
    ],
)
def test_bad_signals_are_refused_clearly(org, api, body, status, code):
    answer = api.post("/api/v1/signals", body, format="json")
    assert answer.status_code == status, answer.json()
    assert answer.json()["code"] == code
    assert not Signal.objects.exists()


def test_another_organisations_signal_never_reaches_this_run(org, other_api):
    run_id = start(org, waits_for())
    answer = other_api.post("/api/v1/signals", {"name": "order.paid", "correlation": "o-7"},
                            format="json")  # fmt: skip
    assert answer.json()["status"] == "pending"
    assert Step.objects.get(run_id=run_id, step_id="wait").status == "waiting"


# --- with real processes --------------------------------------------------------------------


def send_from_a_process(name: str, correlation: str, identity: str):
    code = (
        "from workflows.engine.signals import deliver; from workflows.models import Organisation;"
        f"o = Organisation.objects.order_by('id').first();"
        f"deliver(org_id=o.pk, name={name!r}, correlation={correlation!r}, identity={identity!r},"
        " payload={'amount': 3})"
    )
    return spawn("shell", "-c", code)


def test_a_signal_sent_twice_at_once_by_two_processes_advances_the_run_once(org):
    runs = [start(org, waits_for(), key=f"r{i}", run_input={"order": f"o-{i}"}) for i in range(10)]
    senders = [send_from_a_process("order.paid", f"o-{i}", f"pay-{i}")
               for i in range(10) for _ in range(2)]  # fmt: skip
    with running(*senders):
        for sender in senders:
            assert exit_code(sender) == 0
    for run_id in runs:
        assert run_of(run_id).status == "succeeded"
        assert kinds(run_id).count("step.signal") == 1
    assert Signal.objects.count() == 10


def test_a_signal_before_the_wait_is_taken_when_a_worker_brings_the_run_there(org):
    before = {"id": "prepare", "type": "noop"}
    run_id = start(org, waits_for(before=before))
    deliver(org_id=org.pk, name="order.paid", correlation="o-7", payload={"amount": 8})
    worker = spawn("worker", "--lane", "io", "--concurrency", "2")
    with running(worker):
        run = wait_for(lambda: Run.objects.filter(pk=run_id).exclude(status="running").first(),
                       what="the run to end")  # fmt: skip
    assert (run.status, run.output) == ("succeeded", "8")


def test_a_signal_racing_its_deadline_advances_each_run_exactly_once(org):
    """Twenty runs whose waits time out in a second, a sweeper process firing deadlines,
    and a signal sent to each at about that second: one of the two wins each run."""
    runs = [start(org, waits_for(timeout="1s"), key=f"r{i}", run_input={"order": f"o-{i}"})
            for i in range(20)]  # fmt: skip
    sweeper = spawn("sweep", WAYMARK_SWEEP_SECONDS="0.05")
    senders = [send_from_a_process("order.paid", f"o-{i}", f"pay-{i}") for i in range(20)]
    with running(sweeper, *senders):
        for sender in senders:
            assert exit_code(sender) == 0
        wait_for(lambda: not Run.objects.filter(pk__in=runs, status="running").exists(),
                 what="every run to end")  # fmt: skip
    for run_id in runs:
        events = kinds(run_id)
        assert events.count("step.signal") + events.count("step.deadline_passed") == 1, events
        assert events.count("run.succeeded") + events.count("run.failed") == 1


def test_clients_cannot_take_a_scheduled_occurrences_start_key(org, api):
    automation_publish_definition(org=org, slug="signal", definition=waits_for())
    taken = api.post("/api/v1/runs", {"automation": "signal", "start_key": "schedule:1:2030"},
                     format="json")  # fmt: skip
    assert taken.status_code == 400 and "reserved" in str(taken.json())
    assert not Run.objects.exists()


# --- found in review: each used to lose or refuse a signal ------------------------------------


def test_signal_with_start_goes_to_the_existing_run_whatever_input_came_with_it(org, api):
    automation_publish_definition(org=org, slug="signal", definition=waits_for(correlation=""))
    begin = {"automation": "signal", "start_key": "order-7", "input": {"order": "x"}}
    first = api.post("/api/v1/signals", {"name": "other.thing", "id": "a", "start": begin},
                     format="json")  # fmt: skip
    run_id = first.json()["run"]
    org.quota_running_runs = 1  # full: no new run could start now
    org.save()
    other_input = {**begin, "input": {"order": "y"}}
    answer = api.post("/api/v1/signals", {"name": "order.paid", "id": "b", "start": other_input,
                                          "payload": {"amount": 4}}, format="json")  # fmt: skip
    assert answer.status_code == 201, answer.json()
    assert (answer.json()["run"], answer.json()["run_created"]) == (run_id, False)
    assert run_of(run_id).output == "4"


def test_signal_with_start_refuses_a_start_key_of_another_automation(org, api):
    """As a start with that key is refused (409 start_key_conflict): the signal was delivered
    to the other automation's run."""
    automation_publish_definition(org=org, slug="signal", definition=waits_for(correlation=""))
    automation_publish_definition(org=org, slug="other", definition=waits_for(correlation=""))
    begin = {"automation": "signal", "start_key": "order-7", "input": {"order": "x"}}
    first = api.post("/api/v1/signals", {"name": "other.thing", "id": "a", "start": begin},
                     format="json")  # fmt: skip
    assert first.status_code == 201, first.json()
    elsewhere = {**begin, "automation": "other"}
    answer = api.post("/api/v1/signals", {"name": "order.paid", "id": "b", "start": elsewhere,
                                          "payload": {"amount": 4}}, format="json")  # fmt: skip
    assert answer.status_code == 409, answer.json()
    assert (answer.json()["code"], answer.json()["run_id"]) == ("start_key_conflict",
                                                                first.json()["run"])  # fmt: skip
    assert not Signal.objects.filter(name="order.paid").exists()  # nothing kept of it
    assert run_of(first.json()["run"]).status == "running"


def test_an_early_reply_meets_a_step_waiting_on_any_message_id_of_its_thread(org, api):
    thread = ["<a.b@waymark.invalid>", "<colleague@mail.example>"]
    body = {"message_id": "<reply-2@mail.example>", "in_reply_to": "<colleague@mail.example>",
            "references": thread, "text": "Yes"}  # fmt: skip
    assert api.post("/api/v1/inbound-email", body, format="json").json()["status"] == "pending"
    definition = waits_for(signal="email.reply", correlation="{{ input.sent }}")
    definition["steps"][1]["output"] = "{{ steps.wait.output.payload.text }}"
    run_id = start(org, definition, run_input={"sent": "<a.b@waymark.invalid>"})
    assert run_of(run_id).output == "Yes"


def test_the_same_content_later_is_a_new_signal_for_a_new_wait(org, settings):
    settings.WAYMARK = {**settings.WAYMARK, "SIGNAL_DEDUP_SECONDS": 0}
    first = start(org, waits_for(), key="k1")
    deliver(org_id=org.pk, name="order.paid", correlation="o-7", payload={"amount": 5})
    assert run_of(first).status == "succeeded"
    second = start(org, waits_for(), key="k2")
    again = deliver(org_id=org.pk, name="order.paid", correlation="o-7", payload={"amount": 5})
    assert again.duplicate is False and again.consumed_by == f"{second}/wait/1"
    # Within the window (the default: an hour) the same content is a duplicate.
    settings.WAYMARK = {**settings.WAYMARK, "SIGNAL_DEDUP_SECONDS": 3600}
    twice = deliver(org_id=org.pk, name="order.paid", correlation="o-7", payload={"amount": 5})
    assert twice.duplicate is True


def test_inbound_email_input_is_checked_like_any_signal(org, api, settings):
    long_id = {"message_id": "<" + "a" * 196 + "@x>", "in_reply_to": "<a@b>", "text": "hi"}
    assert api.post("/api/v1/inbound-email", long_id, format="json").status_code == 201
    big = {"message_id": "<big@x>", "in_reply_to": "<a@b>", "text": "é" * 60_000}
    answer = api.post("/api/v1/inbound-email", big, format="json")
    assert answer.status_code == 413 and answer.json()["code"] == "payload_too_large"
