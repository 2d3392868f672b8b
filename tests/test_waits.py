"""Waiting steps, in process: an executor parks its step; one guarded transition wakes it.

The `probe` parks when it has `park_seconds`: the step then waits with no lease and no slot
until wake_step (what timers, signals and approvals will call) or its deadline (the sweep).
Time is moved by UPDATEs of wake_at, never by mocks.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from workflows.engine.executors import executor_for
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import (
    ClaimedStep,
    claim,
    run_context,
    settle_success,
    step_context,
)
from workflows.engine.sweep import sweep_once
from workflows.engine.waits import Wake, fire_due_deadlines, wake_step
from workflows.models import Organisation, Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.control import run_act
from workflows.services.runs import run_start

pytestmark = pytest.mark.django_db


def parking(**probe: Any) -> dict[str, Any]:
    return {
        "start": "wait",
        "steps": [
            {"id": "wait", "type": "probe", "park_seconds": 60, **probe, "next": "done"},
            {"id": "done", "type": "end", "output": "{{ steps.wait.output.reply | default('-') }}"},
        ],
    }


def start(org: Organisation, definition: dict[str, Any], key: str = "k") -> Run:
    automation_publish_definition(org=org, slug="waits", definition=definition)
    return Run.objects.get(pk=run_start(org=org, automation_slug="waits", run_input={},
                                        start_key=key).run_id)  # fmt: skip


def claim_io() -> list[ClaimedStep]:
    return claim(policy=lane_policy("io"), worker="w", limit=10)


def execute(step: ClaimedStep) -> bool:
    """What a worker does with a claimed step: run its executor, then settle."""
    step_def, context = run_context(step)
    result = executor_for(step.type)(step_def, context, step_context(step))
    return settle_success(step, result, worker="w")


def park(org: Organisation, **probe: Any) -> tuple[Run, Step]:
    run = start(org, parking(**probe))
    (step,) = claim_io()
    assert execute(step)
    return run, Step.objects.get(pk=step.id)


def pass_deadline(step: Step) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workflows_step SET wake_at = now() - interval '1 second' WHERE id = %s",
            [step.pk],
        )


def kinds(run: Run) -> list[str]:
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("kind", flat=True))


def wake(step: Step, wake: Wake) -> bool:
    with transaction.atomic():
        return wake_step(step_pk=step.pk, wake=wake)


def test_a_parked_step_waits_without_a_lease_and_is_not_claimable(org) -> None:
    run, step = park(org, park_outcome="timed_out")

    assert (step.status, step.wait_kind, step.owner, step.lease_until) == (
        "waiting", "external", None, None,
    )  # fmt: skip
    assert step.wake_at is not None
    assert step.wait_detail == {"probe": True, "on_deadline": "timed_out"}
    assert claim_io() == []
    run.refresh_from_db()
    assert run.status == "running"
    assert kinds(run)[-1] == "step.waiting"


def test_a_wake_with_an_outcome_ends_the_step_and_walks_on(org) -> None:
    run, step = park(org)

    assert wake(step, Wake(outcome="received", output={"reply": "yes"}, reason="signal"))

    step.refresh_from_db()
    run.refresh_from_db()
    assert (step.status, step.output, step.wake_at) == ("done", {"reply": "yes"}, None)
    assert (run.status, run.output) == ("succeeded", "yes")
    assert kinds(run)[-3:] == ["step.signal", "step.succeeded", "run.succeeded"]


def test_a_wake_to_ready_runs_the_step_again_with_the_wake_payload(org) -> None:
    run, step = park(org)

    assert wake(step, Wake(payload={"signal": "reply"}))
    (again,) = claim_io()
    assert again.id == step.pk
    assert again.attempt == 2
    assert again.woken_with == {"signal": "reply"}
    assert execute(again)  # woken: the probe does not park again

    run.refresh_from_db()
    assert run.status == "succeeded"


def test_the_deadline_fires_the_declared_outcome(org) -> None:
    run, step = park(org, park_outcome="timed_out")
    assert fire_due_deadlines() == 0  # not due yet

    pass_deadline(step)
    assert sweep_once().deadlines == 1

    step.refresh_from_db()
    run.refresh_from_db()
    assert step.status == "done"
    assert run.status == "succeeded"
    assert "step.deadline_passed" in kinds(run)


def test_a_deadline_that_cannot_fire_fails_its_step_and_a_transient_error_waits(
    org, monkeypatch
) -> None:
    """A deadline whose wake raises a bug fails its step for good (the run fails, saying
    why), instead of being tried and logged at every sweep for ever; one that meets a
    transient error is left due, and fires at the next sweep."""
    import workflows.engine.waits as waits

    run, step = park(org, park_outcome="timed_out")
    pass_deadline(step)
    real_wake = waits.wake_step
    trouble = ["deadlock"]

    def wake_step(**kwargs: Any) -> bool:
        if trouble and trouble.pop() == "deadlock":
            with connection.cursor() as cursor:  # a real server error, SQLSTATE 40P01
                cursor.execute("DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' "
                               "USING ERRCODE = '40P01'; END $$")  # fmt: skip
        return real_wake(**kwargs)

    monkeypatch.setattr(waits, "wake_step", wake_step)
    assert fire_due_deadlines() == 0
    step.refresh_from_db()
    assert step.status == "waiting"  # transient: still due, for the next sweep

    def broken(**kwargs: Any) -> bool:
        raise RuntimeError("the walk broke")

    monkeypatch.setattr(waits, "wake_step", broken)
    assert fire_due_deadlines() == 1
    step.refresh_from_db()
    run.refresh_from_db()
    assert step.status == "failed" and run.status == "failed"
    assert run.error == (
        f"step {step.step_id!r} failed: wake_failed: the deadline could not be fired: "
        "RuntimeError: the walk broke"
    )
    assert fire_due_deadlines() == 0


def test_a_wake_after_the_deadline_fired_changes_nothing(org) -> None:
    run, step = park(org, park_outcome="timed_out")
    pass_deadline(step)
    assert fire_due_deadlines() == 1
    events = kinds(run)

    assert not wake(step, Wake(outcome="received"))
    assert kinds(run) == events
    assert fire_due_deadlines() == 0


def test_the_deadline_after_a_wake_changes_nothing(org) -> None:
    run, step = park(org, park_outcome="timed_out")
    assert wake(step, Wake(outcome="received"))
    pass_deadline(step)  # the row is done: this UPDATE matches it, but it is not waiting

    assert fire_due_deadlines() == 0
    assert kinds(run).count("run.succeeded") == 1


def test_a_deadline_without_an_outcome_makes_the_step_ready_again(org) -> None:
    _run, step = park(org)
    pass_deadline(step)

    assert fire_due_deadlines() == 1
    step.refresh_from_db()
    assert step.status == "ready"


def test_a_cancelled_run_cannot_be_woken(org) -> None:
    run, step = park(org)
    run_act(org=org, run_id=run.pk, action="cancel", actor="test")

    assert not wake(step, Wake(outcome="received"))
    step.refresh_from_db()
    assert step.status == "cancelled"


def test_a_wake_while_paused_stays_parked_until_resume(org) -> None:
    run, step = park(org)
    run_act(org=org, run_id=run.pk, action="pause", actor="test")

    assert wake(step, Wake(payload={"late": True}))
    step.refresh_from_db()
    assert (step.status, step.wait_kind) == ("waiting", "paused")
    assert claim_io() == []

    run_act(org=org, run_id=run.pk, action="resume", actor="test")
    (again,) = claim_io()
    assert again.id == step.pk and again.woken_with == {"late": True}


def test_a_wake_with_an_outcome_while_paused_parks_what_comes_next(org) -> None:
    definition = parking()
    definition["steps"][0]["next"] = "more"
    definition["steps"].insert(1, {"id": "more", "type": "noop", "next": "done"})
    run = start(org, definition)
    (step,) = claim_io()
    assert execute(step)
    run_act(org=org, run_id=run.pk, action="pause", actor="test")

    assert wake(Step.objects.get(pk=step.id), Wake(outcome="received"))

    assert claim_io() == []
    continuation = Step.objects.get(run=run, type="continue")
    assert (continuation.status, continuation.wait_kind) == ("waiting", "paused")
    assert continuation.wait_detail == {"enter": ["more"]}
