"""Run control against real worker and relay processes.

Cancel while a worker executes the step; a late settle of a cancelled step; pause racing
claims and settles of a busy engine. A sentinel run started after the action, and finished
by the same worker, proves the worker has claimed since: tests wait for that event, never
for a wall-clock budget.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from workflows.errors import RunStateConflict
from workflows.models import Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.control import run_act
from workflows.services.runs import run_start

from .processes import running, spawn_relay, spawn_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def probe_flow(**probe: object) -> dict:
    return {
        "start": "work",
        "steps": [{"id": "work", "type": "probe", **probe, "next": "done"},
                  {"id": "done", "type": "end"}],
    }  # fmt: skip


THREE_STEPS = {
    "start": "a",
    "steps": [
        {"id": "a", "type": "probe", "next": "b"},
        {"id": "b", "type": "probe", "next": "c"},
        {"id": "c", "type": "probe", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


def start(org, slug: str, key: str, definition: dict | None = None) -> int:
    if definition is not None:
        automation_publish_definition(org=org, slug=slug, definition=definition)
    return run_start(org=org, automation_slug=slug, run_input={}, start_key=key).run_id


def status(run_id: int) -> str:
    return Run.objects.get(pk=run_id).status


def step_running(run_id: int) -> bool:
    return Step.objects.filter(run_id=run_id, step_id="work", status="running").exists()


def sentinel_finished(org, key: str) -> None:
    """Start a quick io run and wait until a worker has finished it."""
    run_id = start(org, "sentinel", key, probe_flow())
    wait_for(lambda: status(run_id) == "succeeded", timeout=60, what=f"sentinel {key}")


def test_cancel_stops_a_step_a_worker_is_executing_and_frees_its_slot(org, procs) -> None:
    run_id = start(org, "long", "long", probe_flow(sleep_seconds=60))
    worker = spawn_worker(concurrency=1)
    procs.append(worker)
    wait_for(lambda: step_running(run_id), what="the worker to claim the long step")

    run_act(org=org, run_id=run_id, action="cancel", actor="test")

    # One slot: the sentinel can only run once the cancelled step's executor has stopped.
    sentinel_finished(org, "after-cancel")
    assert status(run_id) == "cancelled"
    assert Step.objects.get(run_id=run_id, step_id="work").status == "cancelled"
    kinds = set(RunEvent.objects.filter(run_id=run_id).values_list("kind", flat=True))
    assert "step.succeeded" not in kinds
    assert not Step.objects.filter(run_id=run_id, step_id="done").exists()
    assert worker.poll() is None


def test_a_late_settle_of_a_cancelled_step_changes_nothing(org, procs) -> None:
    run_id = start(org, "late", "late", probe_flow(sleep_seconds=2))
    # Heartbeats paused: the worker never hears of the cancel and settles when it wakes.
    worker = spawn_worker(
        concurrency=1, WAYMARK_PAUSE_HEARTBEATS="forever", WAYMARK_IO_LEASE_SECONDS="60"
    )
    procs.append(worker)
    wait_for(lambda: step_running(run_id), what="the worker to claim the step")

    run_act(org=org, run_id=run_id, action="cancel", actor="test")

    sentinel_finished(org, "after-late-settle")  # the late settle came first (one slot)
    step = Step.objects.get(run_id=run_id, step_id="work")
    assert (step.status, step.output) == ("cancelled", None)
    assert status(run_id) == "cancelled"
    assert not RunEvent.objects.filter(run_id=run_id, kind="step.succeeded").exists()


def test_pause_racing_a_busy_engine_stops_every_claim_until_resume(org, procs) -> None:
    automation_publish_definition(org=org, slug="three", definition=THREE_STEPS)
    with running(spawn_relay(), spawn_worker(concurrency=4)) as _:
        runs: list[int] = []
        paused: list[int] = []

        def pause_as_they_start() -> None:
            try:
                for index in range(40):
                    run_id = start(org, "three", f"r{index}")
                    runs.append(run_id)
                    try:
                        run_act(org=org, run_id=run_id, action="pause", actor="racer")
                        paused.append(run_id)
                    except RunStateConflict:
                        pass  # it finished first
            finally:
                connection.close()  # this thread's own connection

        pauser = threading.Thread(target=pause_as_they_start)
        pauser.start()
        pauser.join(timeout=120)
        assert paused, "no run was paused"

        sentinel_finished(org, "s1")  # steps running at their pause have settled by now
        claims = RunEvent.objects.filter(run_id__in=paused, kind="step.claimed")
        seen = claims.count()
        assert not Step.objects.filter(run_id__in=paused, status="running").exists()
        sentinel_finished(org, "s2")  # the worker claimed again since
        assert claims.count() == seen, "a step of a paused run was claimed"
        assert set(Run.objects.filter(pk__in=paused).values_list("status", flat=True)) <= {
            "paused", "succeeded",  # a run whose last step was running when paused ends
        }  # fmt: skip

        for run_id in paused:
            if status(run_id) == "paused":
                run_act(org=org, run_id=run_id, action="resume", actor="racer")
        wait_for(
            lambda: not Run.objects.filter(pk__in=runs).exclude(status="succeeded").exists(),
            timeout=120,
            what="every run to finish after resume",
        )
    for step_id in ("a", "b", "c"):
        done = RunEvent.objects.filter(run_id__in=runs, kind="step.succeeded", step_id=step_id)
        assert done.count() == len(runs), step_id
    assert RunEvent.objects.filter(run_id__in=runs, kind="run.succeeded").count() == len(runs)
