"""Group settles: steps finishing together in one worker commit in one transaction, each
settled exactly as alone, and one failing settle cannot take the others down."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.db import connection

from workflows.engine.executors import StepResult
from workflows.engine.group_settle import GroupSettler, _Request
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim
from workflows.models import Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .factories import IO_DEFINITION
from .processes import running, spawn_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

THREE_IO = {
    "start": "a",
    "steps": [
        {"id": "a", "type": "noop", "next": "b"},
        {"id": "b", "type": "noop", "next": "c"},
        {"id": "c", "type": "noop", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


def settle_transactions(step_ids: list[int]) -> int:
    """How many transactions last wrote these step rows (a row's xmin is its writer's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT xmin::text) FROM workflows_step WHERE id = ANY(%s)", [step_ids]
        )
        return int(cursor.fetchone()[0])


def start_three_io_runs(org, count: int, tag: str) -> list[int]:
    automation_publish_definition(org=org, slug="three", definition=THREE_IO)
    return [
        run_start(org=org, automation_slug="three", run_input={"n": n},
                  start_key=f"{tag}{n}").run_id
        for n in range(count)
    ]  # fmt: skip


def finish_with_a_grouping_worker(ids: list[int]) -> None:
    """A worker with group settles on runs until every one of ``ids`` has finished."""
    worker = spawn_worker(concurrency=16, WAYMARK_GROUP_SETTLES="1")
    with running(worker):
        wait_for(
            lambda: not Run.objects.filter(pk__in=ids, status="running").exists(),
            timeout=300,
            what="every run to finish",
        )


def test_a_busy_worker_commits_steps_in_groups_and_each_settles_once(org) -> None:
    ids = start_three_io_runs(org, 150, "g")
    finish_with_a_grouping_worker(ids)
    assert set(Run.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"succeeded"}
    io_steps = Step.objects.filter(run_id__in=ids, type="noop")
    assert io_steps.count() == 450 and set(io_steps.values_list("attempt", flat=True)) == {1}
    succeeded = RunEvent.objects.filter(run_id__in=ids, kind="step.succeeded", step_id__in="abc")
    assert succeeded.count() == 450  # once each
    # Fewer transactions than steps: some settled together.
    assert settle_transactions(list(io_steps.values_list("pk", flat=True))) < 450


def test_a_failing_settle_in_a_group_leaves_the_others_settled(org) -> None:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    for n in range(2):
        run_start(org=org, automation_slug="io", run_input={"n": n}, start_key=f"f{n}")
    good, other = claim(policy=lane_policy("io"), worker="w", limit=2)
    broken = replace(other, run_id=other.run_id + 10_000)  # its run does not exist: it raises
    settler = GroupSettler("w")
    requests = [_Request(good, StepResult(output=1), None), _Request(broken, StepResult(), None)]
    settler._settle(requests)
    assert requests[0].outcome is not None and requests[0].outcome.ok
    assert isinstance(requests[1].error, LookupError)
    assert all(r.done.is_set() for r in requests)
    assert Run.objects.get(pk=good.run_id).status == "succeeded"
    assert Step.objects.get(pk=other.id).status == "running"  # untouched: its lease will lapse


def test_steps_of_one_run_can_share_a_group(org) -> None:
    definition = {
        "start": "fork",
        "steps": [
            {"id": "fork", "type": "parallel", "branches": ["x", "y"], "next": "meet"},
            {"id": "x", "type": "noop", "next": "meet"},
            {"id": "y", "type": "noop", "next": "meet"},
            {"id": "meet", "type": "join", "wait_for": ["x", "y"], "next": "done"},
            {"id": "done", "type": "end"},
        ],
    }
    automation_publish_definition(org=org, slug="fork", definition=definition)
    run_id = run_start(org=org, automation_slug="fork", run_input={}, start_key="p").run_id
    x, y = claim(policy=lane_policy("io"), worker="w", limit=2)
    settler = GroupSettler("w")
    requests = [
        _Request(x, StepResult(output="x"), None),
        _Request(y, StepResult(output="y"), None),
    ]
    settler._settle(requests)
    assert [r.error for r in requests] == [None, None]
    assert settler.groups == 1
    assert Run.objects.get(pk=run_id).status == "succeeded"


def test_a_worker_killed_mid_group_loses_no_step_and_settles_none_twice(org) -> None:
    ids = start_three_io_runs(org, 120, "k")
    first = spawn_worker(concurrency=16, WAYMARK_GROUP_SETTLES="1")
    with running(first):
        wait_for(
            lambda: Run.objects.filter(pk__in=ids, status="succeeded").count() >= 20,
            timeout=300,
            what="some runs to finish",
        )
        first.kill()  # SIGKILL, mid-drain: groups in flight are lost or committed, never half
        first.wait(timeout=30)
    finish_with_a_grouping_worker(ids)  # another worker, after the first one's leases lapse
    assert set(Run.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"succeeded"}
    for step_id in "abc":
        settled = RunEvent.objects.filter(run_id__in=ids, kind="step.succeeded", step_id=step_id)
        assert settled.count() == 120  # once per run: a lost group re-runs, a committed one not
