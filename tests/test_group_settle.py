"""Group settles: steps finishing together in one worker commit in one transaction, each
settled exactly as alone, and one failing settle cannot take the others down."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from django.db import connection, transaction

from workflows.engine.executors import StepResult
from workflows.engine.group_settle import GroupSettler, _Member
from workflows.engine.hops import plan_hop
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import Settled, claim
from workflows.engine.transport import own_connection
from workflows.engine.walk import TakeNext
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


def members_of(steps: list, outputs: list) -> list[_Member]:
    """Hops planned for these steps' results, as step threads hand them to their settler."""
    members = []
    for step, output in zip(steps, outputs, strict=True):
        planned = plan_hop(step, StepResult(output=output), worker="w", take=None)
        assert planned is not None
        members.append(_Member(step, planned, None))
    return members


def test_a_group_whose_statement_fails_writes_nothing_and_hands_every_member_back(org) -> None:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    for n in range(2):
        run_start(org=org, automation_slug="io", run_input={"n": n}, start_key=f"f{n}")
    good, other = claim(policy=lane_policy("io"), worker="w", limit=2)
    broken = replace(other, run_seen="not a version")  # its hop's statement raises
    members = members_of([good, broken], [1, 2])
    settler = GroupSettler("w")
    settler._settle(members)
    assert [m.outcome for m in members] == [None, None]  # each goes back to its thread
    assert settler.groups == 0
    assert Step.objects.get(pk=good.id).status == "running"  # not written
    # Its thread then settles it alone, as the worker does with what a group hands back.
    assert settler.settle(good, StepResult(output=1), None).ok
    assert Run.objects.get(pk=good.run_id).status == "succeeded"


def run_table_scans() -> int:
    """Sequential scans of workflows_run in this transaction so far."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'workflows_run'"
        )
        return int(cursor.fetchone()[0])


def test_a_group_finds_its_runs_by_key_however_many_runs_there_are(org) -> None:
    """The group's lock reads its runs by primary key: with 3,000 other runs in the table,
    settling a group scans none of them (v1 of the function was planned, at this size, as a
    hash join over a sequential scan of the whole table, for every group)."""
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    ids = [
        run_start(org=org, automation_slug="io", run_input={"n": n}, start_key=f"s{n}").run_id
        for n in range(2)
    ]
    with connection.cursor() as cursor:  # other runs: as many as a busy table holds
        cursor.execute(
            """
            INSERT INTO workflows_run (org_id, automation_id, version_id, start_key,
                start_key_derived, input, input_digest, status, vars, outputs, entered, error,
                steps_executed, max_steps, deadline_at)
            SELECT org_id, automation_id, version_id, 'filler-' || n, false, '{}', '', 'succeeded',
                   '{}', '{}', '{}', '', 0, max_steps, deadline_at
              FROM workflows_run CROSS JOIN generate_series(1, 3000) n WHERE id = %s
            """,
            [ids[0]],
        )
        cursor.execute("ANALYZE workflows_run")
    members = members_of(claim(policy=lane_policy("io"), worker="w", limit=2), [1, 2])
    settler = GroupSettler("w")
    with transaction.atomic():
        before = run_table_scans()
        settler._settle(members)
        scans = run_table_scans() - before
    assert [m.outcome is not None and m.outcome.ok for m in members] == [True, True]
    assert settler.groups == 1
    assert scans == 0


def test_a_group_does_not_wait_for_a_run_another_transaction_holds(org) -> None:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    for n in range(2):
        run_start(org=org, automation_slug="io", run_input={"n": n}, start_key=f"h{n}")
    held, free = claim(policy=lane_policy("io"), worker="w", limit=2)
    members = members_of([held, free], [1, 2])
    locker = own_connection(autocommit=False)
    locker.execute("SELECT 1 FROM workflows_run WHERE id = %s FOR NO KEY UPDATE", [held.run_id])
    settler = GroupSettler("w")

    def settle() -> None:
        try:
            settler._settle(members)
        finally:
            connection.close()

    try:
        thread = threading.Thread(target=settle)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the group waited for the held run's lock"
        assert Step.objects.get(pk=held.id).status == "running"  # skipped, not written
    finally:
        locker.close()
    assert members[0].outcome is None  # back to its thread, which waits for that lock alone
    assert members[1].outcome is not None and members[1].outcome.ok
    assert Run.objects.get(pk=free.run_id).status == "succeeded"


def test_steps_that_cannot_hop_settle_alone_through_the_settler(org) -> None:
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
    answers: list = []

    def settle(step) -> None:  # two step threads finishing together
        try:
            answers.append(settler.settle(step, StepResult(output=step.step_id), None))
        finally:
            connection.close()

    threads = [threading.Thread(target=settle, args=(step,)) for step in (x, y)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert [a.ok for a in answers] == [True, True]
    assert settler.groups == 0  # a join reads the database: no hop, no group
    assert Run.objects.get(pk=run_id).status == "succeeded"


@pytest.mark.parametrize("leaders", [1, 3])
def test_step_threads_finishing_together_each_settle_once(org, leaders: int) -> None:
    """Sixteen step threads hand their results to one settler at the same moment: whoever
    leads settles what waits; every step settles once (none also in a second group while
    its first is in flight), and every thread gets its own answer."""
    ids = start_three_io_runs(org, 16, "t")
    steps = claim(policy=lane_policy("io"), worker="w", limit=16)
    assert len(steps) == 16
    settler = GroupSettler("w", max_group=4, leaders=leaders)
    ready = threading.Barrier(16)
    answers: dict[int, Settled] = {}
    take = TakeNext(worker="w", lane="io", lease_seconds=30)

    def settle(step) -> None:
        try:
            ready.wait(timeout=60)
            answers[step.id] = settler.settle(step, StepResult(output=step.id), take)
        finally:
            connection.close()

    threads = [threading.Thread(target=settle, args=(step,)) for step in steps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(answers) == sorted(step.id for step in steps)
    assert all(answer.ok and answer.next_step is not None for answer in answers.values())
    taken = Step.objects.filter(run_id__in=ids, step_id="b", status="running", owner="w")
    assert taken.count() == 16  # each run's next step, claimed once, for this worker
    succeeded = RunEvent.objects.filter(run_id__in=ids, kind="step.succeeded", step_id="a")
    assert succeeded.count() == 16


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
