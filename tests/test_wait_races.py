"""A wake and a deadline race for the same waiting step from two processes: one wins.

200 parked steps, all past their deadline. One process wakes them (as signals would), the
other fires their deadlines (as the sweep does), each in its own random order from the same
instant, so many steps are contested. Whoever commits first wins; the other finds no waiting
row. Every step ends once, every run walks on once.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from django.db import connection

from workflows.engine.executors import executor_for
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim, run_context, settle_success, step_context
from workflows.models import Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .processes import ROOT, engine_env

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 200
PARKED = {
    "start": "wait",
    "steps": [
        {"id": "wait", "type": "probe", "park_seconds": 0, "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


def park_all(org) -> list[int]:
    automation_publish_definition(org=org, slug="race", definition=PARKED)
    for index in range(RUNS):
        run_start(org=org, automation_slug="race", run_input={}, start_key=f"k{index}")
    claimed = claim(policy=lane_policy("io"), worker="setup", limit=RUNS)
    assert len(claimed) == RUNS
    for step in claimed:
        step_def, context = run_context(step)
        result = executor_for(step.type)(step_def, context, step_context(step))
        assert settle_success(step, result, worker="setup")
    connection.close()
    return sorted(step.id for step in claimed)


def racer(side: str, go_at: float, ids: list[int]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.wake_racer", side, str(go_at), *map(str, ids)],
        cwd=ROOT, env=engine_env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_a_wake_and_its_deadline_racing_from_two_processes_have_one_winner(org) -> None:
    ids = park_all(org)
    assert Step.objects.filter(pk__in=ids, status="waiting").count() == RUNS

    go_at = time.time() + 2.0  # both interpreters are up by then
    sides = {side: racer(side, go_at, ids) for side in ("wake", "deadline")}
    won = {}
    for side, process in sides.items():
        out, _ = process.communicate(timeout=180)
        assert process.returncode == 0, side
        won[side] = {int(line) for line in out.split()}

    assert won["wake"].isdisjoint(won["deadline"])
    assert won["wake"] | won["deadline"] == set(ids)
    assert Step.objects.filter(pk__in=ids, status="done").count() == RUNS
    runs = Run.objects.filter(steps__pk__in=ids)
    assert set(runs.values_list("status", flat=True)) == {"succeeded"}
    for kind in ("run.succeeded", "step.succeeded"):
        assert RunEvent.objects.filter(run__in=runs, kind=kind).count() == RUNS, kind
    woken = RunEvent.objects.filter(run__in=runs, kind__in=["step.signal", "step.deadline_passed"])
    assert woken.count() == RUNS
    assert Step.objects.filter(run__in=runs, step_id="done").count() == RUNS
    print(f"wake won {len(won['wake'])}, deadline won {len(won['deadline'])}")
