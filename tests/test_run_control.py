"""Run control in process and through the API and the command: cancel, pause, resume, retry.

Every refusal is checked to have changed nothing but the history line that records it.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from workflows.engine.executors import StepFailure, StepResult
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import (
    ClaimedStep,
    claim,
    claim_suspect,
    heartbeat,
    settle_failure,
    settle_success,
)
from workflows.errors import NothingToRetry, RunStateConflict, UnknownRun
from workflows.models import Organisation, Outbox, Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.control import run_act, runs_act_bulk
from workflows.services.runs import run_start

from .walking import continue_walks

pytestmark = pytest.mark.django_db

TWO_IO: dict[str, Any] = {
    "start": "first",
    "steps": [
        {"id": "first", "type": "noop", "next": "second"},
        {"id": "second", "type": "noop", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}
QUICK_FAIL: dict[str, Any] = {
    "start": "done",
    "steps": [{"id": "done", "type": "end", "status": "failed"}],
}


def start(org: Organisation, definition: dict[str, Any] = TWO_IO, key: str = "k") -> Run:
    automation_publish_definition(org=org, slug="ctl", definition=definition)
    started = run_start(org=org, automation_slug="ctl", run_input={}, start_key=key)
    return Run.objects.get(pk=started.run_id)


def claim_io(worker: str = "w") -> list[ClaimedStep]:
    return claim(policy=lane_policy("io"), worker=worker, limit=10)


def act(org: Organisation, run: Run, action: str) -> Run:
    run_act(org=org, run_id=run.pk, action=action, actor="test:ops")
    run.refresh_from_db()
    return run


def statuses(run: Run) -> dict[str, str]:
    return dict(Step.objects.filter(run=run).values_list("step_id", "status"))


def history(run: Run) -> list[str]:
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("kind", flat=True))


def fail_run(org: Organisation) -> Run:
    run = start(org)
    (step,) = claim_io()
    failure = StepFailure("provider said no", retryable=False)
    assert settle_failure(step, failure, worker="w", policy=lane_policy("io"))
    run.refresh_from_db()
    assert run.status == "failed"
    return run


# --- cancel -----------------------------------------------------------------------------------


def test_cancel_ends_the_run_and_its_ready_step_at_once(org) -> None:
    run = act(org, start(org), "cancel")

    assert (run.status, run.error) == ("cancelled", "cancelled by test:ops")
    assert run.finished_at is not None
    assert statuses(run) == {"first": "cancelled"}
    assert claim_io() == []
    cancelled = RunEvent.objects.get(run=run, kind="run.cancelled")
    assert cancelled.detail is not None
    assert (cancelled.worker, cancelled.detail["by"]) == ("test:ops", "test:ops")


def test_cancel_tells_a_running_step_through_its_heartbeat_and_its_settle_changes_nothing(
    org,
) -> None:
    run = start(org)
    (step,) = claim_io()
    act(org, run, "cancel")

    connection.ensure_connection()  # the test's own transaction: it sees the cancel
    beat = heartbeat(connection.connection, held=[(step.id, step.attempt)], lease_seconds=30)
    assert beat.lost == {(step.id, step.attempt)}
    assert Step.objects.get(pk=step.id).lease_until is None  # a cancelled step gets no lease
    assert settle_success(step, StepResult(output={"late": True}), worker="w") is False
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert statuses(run) == {"first": "cancelled"}
    assert Step.objects.get(pk=step.id).output is None


def test_a_finished_run_cannot_be_cancelled_and_the_refusal_is_recorded(org) -> None:
    run = act(org, start(org), "cancel")
    before = history(run)

    with pytest.raises(RunStateConflict) as refused:
        act(org, run, "cancel")

    assert refused.value.code == "run_state_conflict"
    assert refused.value.status == 409
    assert history(run) == [*before, "run.cancel_refused"]
    refusal = RunEvent.objects.get(run=run, kind="run.cancel_refused")
    assert refusal.detail is not None
    assert refusal.detail["code"] == "run_state_conflict"
    assert refusal.worker == "test:ops"


def test_another_organisations_run_is_unknown(org, other_org) -> None:
    run = start(other_org)
    with pytest.raises(UnknownRun):
        run_act(org=org, run_id=run.pk, action="cancel", actor="test")
    run.refresh_from_db()
    assert run.status == "running"
    assert not RunEvent.objects.filter(run=run, kind__endswith="_refused").exists()


# --- pause and resume -------------------------------------------------------------------------


def test_pause_parks_ready_steps_and_resume_makes_them_ready_and_wakes_the_lane(org) -> None:
    run = act(org, start(org), "pause")
    assert run.status == "paused"
    step = Step.objects.get(run=run)
    assert (step.status, step.wait_kind, step.lease_until) == ("waiting", "paused", None)
    assert claim_io() == []

    wakes = Outbox.objects.count()
    run = act(org, run, "resume")

    assert run.status == "running"
    assert Outbox.objects.count() == wakes + 1
    (claimed,) = claim_io()
    assert claimed.step_id == "first"
    assert history(run)[-3:] == ["run.paused", "run.resumed", "step.claimed"]


def test_a_step_running_when_paused_settles_and_what_it_enters_waits(org) -> None:
    run = start(org)
    (step,) = claim_io()
    act(org, run, "pause")

    assert settle_success(step, StepResult(output="ok"), worker="w")

    run.refresh_from_db()
    assert run.status == "paused"
    assert statuses(run) == {"first": "done", "~continue": "waiting"}
    assert claim_io() == []
    act(org, run, "resume")
    run, continuations = continue_walks(run)
    assert continuations == 1
    assert statuses(run) == {"first": "done", "~continue": "done", "second": "ready"}


def test_the_claim_parks_a_step_of_a_paused_run_whose_lease_lapsed(org) -> None:
    run = start(org)
    (step,) = claim_io("dead-worker")
    act(org, run, "pause")
    with connection.cursor() as cursor:  # the worker died: its lease lapses
        cursor.execute(
            "UPDATE workflows_step SET lease_until = now() - interval '1 second' WHERE id = %s",
            [step.id],
        )

    assert claim_suspect(policy=lane_policy("io"), worker="other") is None

    row = Step.objects.get(pk=step.id)
    assert (row.status, row.wait_kind, row.attempt) == ("waiting", "paused", 1)
    assert history(run)[-1] == "step.parked"
    act(org, run, "resume")
    (again,) = claim_io("other")
    assert again.attempt == 2


def test_pausing_a_paused_run_and_resuming_a_running_one_are_refused(org) -> None:
    run = act(org, start(org), "pause")
    with pytest.raises(RunStateConflict):
        act(org, run, "pause")
    run = act(org, run, "resume")
    with pytest.raises(RunStateConflict):
        act(org, run, "resume")
    assert history(run)[-4:] == [
        "run.paused", "run.pause_refused", "run.resumed", "run.resume_refused",
    ]  # fmt: skip


# --- retry ------------------------------------------------------------------------------------


def test_retry_runs_a_failed_run_again_from_its_failed_step_in_a_new_series(org) -> None:
    run = fail_run(org)

    run = act(org, run, "retry")

    assert (run.status, run.error, run.finished_at) == ("running", "", None)
    step = Step.objects.get(run=run, step_id="first")
    assert (step.status, step.series_offset, step.error) == ("ready", 1, "")
    (claimed,) = claim_io()
    assert (claimed.attempt, claimed.attempts_used) == (2, 1)  # the token keeps growing
    assert settle_success(claimed, StepResult(output="ok"), worker="w")
    assert statuses(run) == {"first": "done", "second": "ready"}
    kinds = history(run)
    assert kinds.index("run.failed") < kinds.index("step.retried") < kinds.index("run.retried")


def test_retry_of_a_run_that_did_not_fail_is_refused(org) -> None:
    run = start(org)
    with pytest.raises(RunStateConflict):
        act(org, run, "retry")
    assert statuses(run) == {"first": "ready"}


def test_retry_of_a_run_failed_by_an_end_step_has_nothing_to_retry(org) -> None:
    run = start(org, QUICK_FAIL)
    assert run.status == "failed"
    with pytest.raises(NothingToRetry) as refused:
        act(org, run, "retry")
    assert refused.value.code == "nothing_to_retry"
    run.refresh_from_db()
    assert run.status == "failed"


# --- bulk -------------------------------------------------------------------------------------


def test_bulk_counts_first_then_acts_on_the_matching_runs(org, other_org) -> None:
    runs = [start(org, key=f"k{i}") for i in range(3)]
    act(org, runs[0], "pause")
    start(other_org, key="theirs")

    counted = runs_act_bulk(org=org, action="cancel", actor="t", status="running")
    assert (counted.matched, counted.changed, counted.dry_run) == (2, 0, True)
    assert Run.objects.filter(org=org, status="running").count() == 2

    done = runs_act_bulk(org=org, action="cancel", actor="t", status="running", dry_run=False)
    assert (done.matched, done.changed, done.skipped, done.more) == (2, 2, 0, False)
    assert Run.objects.filter(org=org, status="cancelled").count() == 2
    assert Run.objects.filter(org=other_org, status="running").count() == 1


def test_bulk_acts_on_at_most_its_limit_and_says_more_match(org) -> None:
    for i in range(3):
        start(org, key=f"k{i}")
    done = runs_act_bulk(org=org, action="pause", actor="t", dry_run=False, limit=2)
    assert (done.changed, done.more) == (2, True)


# --- API ----------------------------------------------------------------------------------------


def test_the_api_acts_on_a_run_and_records_the_key(org, api, key_and_raw) -> None:
    run = start(org)
    response = api.post(f"/api/v1/runs/{run.pk}/pause")
    assert response.status_code == 200, response.json()
    assert response.json() == {"id": run.pk, "action": "pause", "status": "paused",
                               "steps_changed": 1}  # fmt: skip
    paused = RunEvent.objects.get(run=run, kind="run.paused")
    assert paused.worker.startswith("api_key:")


def test_the_api_refuses_a_state_that_does_not_allow_the_action_with_409(org, api) -> None:
    run = act(org, start(org), "cancel")
    response = api.post(f"/api/v1/runs/{run.pk}/resume")
    assert response.status_code == 409
    body = response.json()
    assert (body["code"], body["status"], body["action"]) == (
        "run_state_conflict", "cancelled", "resume",
    )  # fmt: skip


def test_the_api_hides_another_organisations_run(org, other_org, api) -> None:
    run = start(other_org)
    response = api.post(f"/api/v1/runs/{run.pk}/cancel")
    assert (response.status_code, response.json()["code"]) == (404, "unknown_run")
    run.refresh_from_db()
    assert run.status == "running"


def test_an_unknown_action_is_404(org, api) -> None:
    run = start(org)
    assert api.post(f"/api/v1/runs/{run.pk}/explode").status_code == 404


def test_the_bulk_api_dry_runs_unless_told_otherwise(org, api) -> None:
    start(org, key="a")
    start(org, key="b")
    counted = api.post("/api/v1/runs/bulk/cancel", {"status": "running"}, format="json")
    assert counted.json() == {"action": "cancel", "matched": 2, "changed": 0, "skipped": 0,
                              "more": False, "dry_run": True}  # fmt: skip
    acted = api.post("/api/v1/runs/bulk/cancel", {"dry_run": False}, format="json")
    assert (acted.json()["changed"], acted.json()["dry_run"]) == (2, False)
    bad = api.post("/api/v1/runs/bulk/cancel", {"status": "sideways"}, format="json")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_input")


def test_a_bulk_action_on_an_automation_the_organisation_lacks_is_404(org, other_org, api) -> None:
    # A misspelt slug, or another organisation's, must not read as "nothing to act on".
    run = start(org, key="a")
    automation_publish_definition(org=other_org, slug="theirs", definition=TWO_IO)
    for slug in ("misspelt", "theirs"):
        for dry_run in (True, False):
            answer = api.post("/api/v1/runs/bulk/cancel", {"automation": slug, "dry_run": dry_run},
                              format="json")  # fmt: skip
            assert (answer.status_code, answer.json()["code"]) == (404, "unknown_automation")
            assert slug in answer.json()["detail"]
    run.refresh_from_db()
    assert run.status == "running"
    with pytest.raises(CommandError, match="unknown_automation"):
        call_command("run_control", "cancel", "--org", org.slug, "--automation", "misspelt",
                     stdout=StringIO())  # fmt: skip
    known = api.post("/api/v1/runs/bulk/cancel", {"automation": run.automation.slug},
                     format="json")  # fmt: skip
    assert (known.status_code, known.json()["matched"]) == (200, 1)


# --- the command --------------------------------------------------------------------------------


def test_the_command_acts_on_one_run_and_counts_a_filter_first(org) -> None:
    run = start(org, key="one")
    start(org, key="two")
    out = StringIO()
    call_command("run_control", "pause", "--org", org.slug, "--run", str(run.pk), stdout=out)
    assert f"run {run.pk}: paused" in out.getvalue()
    assert RunEvent.objects.get(run=run, kind="run.paused").worker.startswith("command:")

    out = StringIO()
    call_command("run_control", "cancel", "--org", org.slug, "--status", "running", stdout=out)
    assert "1 run(s) would cancel" in out.getvalue()
    call_command("run_control", "cancel", "--org", org.slug, "--status", "running", "--yes",
                 stdout=StringIO())  # fmt: skip
    assert Run.objects.filter(org=org, status="cancelled").count() == 1


def test_the_command_reports_a_refusal_with_its_code(org) -> None:
    run = act(org, start(org), "cancel")
    with pytest.raises(CommandError, match="run_state_conflict"):
        call_command("run_control", "cancel", "--org", org.slug, "--run", str(run.pk))
