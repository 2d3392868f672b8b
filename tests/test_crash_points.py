"""Real processes killed at the crash points of a signal's consumption and of a decision
(docs/explanation/processes-timers-effects.md, "Crash points"): what the dead process began is
undone, or is read again by the process that takes over, and the run moves on exactly once. (The
timer sweep's crash points: tests/test_timer_processes.py; the effect's:
tests/test_effect_crashes.py.)"""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from workflows.engine.waits import fire_due_deadlines
from workflows.models import Run, RunEvent, Signal, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .processes import running, spawn, spawn_worker, stop, wait_for
from .test_approvals_setup import open_request, pass_deadline
from .test_signals import start, waits_for

pytestmark = pytest.mark.django_db(transaction=True)

CRASHED = 137


def events(run_id: int, *kinds: str) -> list[str]:
    rows = RunEvent.objects.filter(run_id=run_id, kind__in=kinds).order_by("id")
    return list(rows.values_list("kind", flat=True))


def ended(run_id: int) -> Run | None:
    return Run.objects.filter(pk=run_id).exclude(status="running").first()


def test_a_worker_killed_as_its_walk_takes_a_pending_signal_leaves_it_for_the_next(org):
    """The signal came first; the walk entering the wait takes it and the worker dies before
    the commit: the signal is still pending and the step not entered, and the worker that
    takes the step over consumes it, once."""
    run_id = start(org, waits_for(before={"id": "prepare", "type": "noop"}))
    Signal.objects.create(org=org, name="order.paid", correlation="o-7", identity="pay-1",
                          payload={"amount": 8})  # fmt: skip
    doomed = spawn_worker(concurrency=1, WAYMARK_CRASH_AT="signal.after_consume",
                          WAYMARK_IO_LEASE_SECONDS="1")  # fmt: skip
    with running(doomed):
        assert doomed.wait(timeout=120) == CRASHED
    signal = Signal.objects.get(identity="pay-1")
    assert (signal.consumed_at, signal.consumed_by) == (None, "")
    assert not Step.objects.filter(run_id=run_id, step_id="wait").exists()
    heir = spawn_worker(concurrency=1, WAYMARK_IO_LEASE_SECONDS="1")
    with running(heir):
        run = wait_for(lambda: ended(run_id), what="the run to end")
        stop(heir)
    signal.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "8")
    assert signal.consumed_by == f"{run_id}/wait/1"
    assert events(run_id, "step.succeeded").count("step.succeeded") == 3  # prepare, wait, paid


def test_a_sweeper_killed_as_it_delivers_a_late_signal_leaves_it_for_the_next(org):
    """A signal stored pending while its wait was already parked (the two committed at the
    same moment): the sweep's late matching consumes it and wakes the step, and dies before
    the commit. Nothing of it stays; the next sweeper delivers it, once."""
    run_id = start(org, waits_for())
    assert Step.objects.get(run_id=run_id, step_id="wait").status == "waiting"
    Signal.objects.create(org=org, name="order.paid", correlation="o-7", identity="pay-1",
                          payload={"amount": 9})  # fmt: skip
    doomed = spawn("sweep", WAYMARK_SWEEP_SECONDS="0.2", WAYMARK_CRASH_AT="signal.after_consume")
    with running(doomed):
        assert doomed.wait(timeout=120) == CRASHED
    assert Signal.objects.get(identity="pay-1").consumed_at is None
    assert Step.objects.get(run_id=run_id, step_id="wait").status == "waiting"
    assert Run.objects.get(pk=run_id).status == "running"
    heir = spawn("sweep", WAYMARK_SWEEP_SECONDS="0.2")  # leads once the dead one's lease lapses
    with running(heir):
        run = wait_for(lambda: ended(run_id), what="the run to end")
        stop(heir)
    assert (run.status, run.output) == ("succeeded", "9")
    assert events(run_id, "step.signal") == ["step.signal"]
    assert Signal.objects.get(identity="pay-1").consumed_by == f"{run_id}/wait/1"


def test_a_worker_killed_after_the_deadline_decided_the_request_settles_it_once(org):
    """The request's deadline passed: the executor expires it (committed) and its worker dies
    before the step settles. The worker that takes over reads the request as expired and
    takes the timed_out path, once."""
    run, approval = open_request(org)
    pass_deadline(approval)
    assert fire_due_deadlines() == 1
    doomed = spawn_worker("human", concurrency=1, WAYMARK_CRASH_AT="approval.after_decision",
                          WAYMARK_HUMAN_LEASE_SECONDS="1")  # fmt: skip
    with running(doomed):
        assert doomed.wait(timeout=120) == CRASHED
    approval.refresh_from_db()
    assert approval.status == "expired"  # decided, and committed
    assert Step.objects.get(pk=approval.step_row_id).status == "running"  # not settled
    heir = spawn_worker("human", concurrency=1, WAYMARK_HUMAN_LEASE_SECONDS="1")
    with running(heir):
        finished = wait_for(lambda: ended(run.pk), what="the run to end")
        stop(heir)
    assert (finished.status, finished.output) == ("succeeded", "late")
    ask = RunEvent.objects.filter(run_id=run.pk, step_id="ask", kind="step.succeeded")
    assert ask.count() == 1
    assert ApprovalRequest.objects.filter(run_id=run.pk).count() == 1


def test_a_worker_killed_after_its_claim_leaves_the_step_to_a_suspects_only_worker(org):
    """The claim committed, the executor never ran: nothing but the claim exists, and once
    its lease lapses the suspects-only worker runs the step (alone), and the run ends."""
    automation_publish_definition(org=org, slug="two", definition={
        "start": "a",
        "steps": [{"id": "a", "type": "noop", "next": "done"}, {"id": "done", "type": "end"}],
    })  # fmt: skip
    run_id = run_start(org=org, automation_slug="two", run_input={}, start_key="k").run_id
    doomed = spawn_worker(concurrency=1, WAYMARK_CRASH_AT="worker.after_claim",
                          WAYMARK_IO_LEASE_SECONDS="1")  # fmt: skip
    with running(doomed):
        assert doomed.wait(timeout=120) == CRASHED
    a = Step.objects.get(run_id=run_id, step_id="a")
    assert (a.status, a.attempt) == ("running", 1)
    assert not events(run_id, "step.succeeded")
    heir = spawn("worker", "--lane", "io", "--suspects-only", WAYMARK_IO_LEASE_SECONDS="1")
    with running(heir):
        run = wait_for(lambda: ended(run_id), what="the run to end")
        stop(heir)
    assert run.status == "succeeded"
    assert Step.objects.get(run_id=run_id, step_id="a").attempt == 2
    assert events(run_id, "step.succeeded") == ["step.succeeded"] * 2  # a, done
