"""Parallel branches settled by two racing worker processes, 200 runs of each shape.

- Two io branches meeting at a join: whichever settles second completes the join; the step
  after the join is entered exactly once per run.
- One branch ends the run: the other branch's step never executes after that (its claim
  finds it cancelled, or its settle is refused).
Waits are for the runs to finish, in this test's own database.
"""

from __future__ import annotations

import pytest

from workflows.models import Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .processes import running, spawn_relay, spawn_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 200
MEET = {
    "start": "fan",
    "steps": [
        {"id": "fan", "type": "parallel", "branches": ["left", "right"], "next": "meet"},
        {"id": "left", "type": "probe", "next": "meet"},
        {"id": "right", "type": "probe", "next": "meet"},
        {"id": "meet", "type": "join", "wait_for": ["left", "right"], "next": "after"},
        {"id": "after", "type": "probe", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}
ENDS = {
    "start": "fan",
    "steps": [
        {"id": "fan", "type": "parallel", "branches": ["quick", "slow"]},
        {"id": "quick", "type": "probe", "next": "stop"},
        {"id": "stop", "type": "end", "status": "failed"},
        {"id": "slow", "type": "probe", "next": "more"},
        {"id": "more", "type": "probe"},
    ],
}


def start_all(org, slug: str, definition: dict) -> list[int]:
    automation_publish_definition(org=org, slug=slug, definition=definition)
    return [
        run_start(org=org, automation_slug=slug, run_input={}, start_key=f"{slug}{i}").run_id
        for i in range(RUNS)
    ]


def all_finished(run_ids: list[int]) -> bool:
    return not Run.objects.filter(pk__in=run_ids, status="running").exists()


def test_two_workers_settling_both_branches_continue_past_the_join_once(org, procs) -> None:
    run_ids = start_all(org, "meet", MEET)
    with running(spawn_relay(), spawn_worker(concurrency=4), spawn_worker(concurrency=4)):
        wait_for(lambda: all_finished(run_ids), timeout=300, what="every run to finish")

    runs = Run.objects.filter(pk__in=run_ids)
    assert set(runs.values_list("status", flat=True)) == {"succeeded"}
    assert Step.objects.filter(run__in=runs, step_id="after").count() == RUNS
    assert Step.objects.filter(run__in=runs, step_id="meet", status="done").count() == RUNS
    events = RunEvent.objects.filter(run__in=runs)
    assert events.filter(kind="step.succeeded", step_id="meet").count() == RUNS
    assert events.filter(kind="run.succeeded").count() == RUNS
    workers = set(events.filter(kind="step.claimed").values_list("worker", flat=True))
    assert len(workers) == 2, "both workers must have taken part"


def test_a_run_ended_by_one_branch_never_executes_the_others_steps_after(org, procs) -> None:
    run_ids = start_all(org, "ends", ENDS)
    with running(spawn_relay(), spawn_worker(concurrency=4), spawn_worker(concurrency=4)):
        wait_for(lambda: all_finished(run_ids), timeout=300, what="every run to finish")

    assert set(Run.objects.filter(pk__in=run_ids).values_list("status", flat=True)) == {"failed"}
    for run_id in run_ids:
        kinds = list(
            RunEvent.objects.filter(run_id=run_id).order_by("id").values_list("kind", "step_id")
        )
        ended = kinds.index(("run.failed", ""))
        after = [k for k in kinds[ended + 1 :] if k[0] in ("step.claimed", "step.succeeded")]
        assert after == [], (run_id, kinds)
    live = Step.objects.filter(run_id__in=run_ids, status__in=["ready", "running", "waiting"])
    assert not live.exists()
