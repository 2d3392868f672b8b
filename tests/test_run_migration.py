"""Migrating runs between versions, in process: the plan's checks, the dry run, the moves (each
wait carried over with its step, or re-made), the job's resume, and a running step left alone
until it settles. The proof at scale, with real processes, is tests/test_run_migration_processes.py.
"""

from __future__ import annotations

import threading
import time
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from approvals.models import ApprovalRequest
from approvals.services import Actor, decide
from effects.models import Effect
from timers.models import Timer
from timers.sweep import fire_due_timers
from workflows.engine.lanes import lane_policy
from workflows.engine.renames import StepRename, rename_everywhere
from workflows.engine.steps import claim
from workflows.engine.worker import Attempt, Worker
from workflows.errors import WaymarkError
from workflows.models import Run, RunEvent, RunMigration, Step
from workflows.services.automations import (
    automation_publish_definition,
    version_create_draft,
)
from workflows.services.run_migration import (
    dry_run,
    migration_plan,
    migration_resume,
    migration_start,
)
from workflows.services.run_migration.move import move_run
from workflows.services.runs import run_start
from workflows.services.signals import signal_send

from .effect_setup import drive
from .migration_setup import (
    KINDS,
    SIGNAL,
    SLUG,
    definition,
    live_steps,
    make_timers_due,
    migrated_events,
    plan_3_to_4,
    publish,
    run_input,
    version_of,
)
from .processes import wait_for

# Transactions as the engine has them: executors run outside any, and each move commits.
pytestmark = pytest.mark.django_db(transaction=True)


def start_runs(org: Any, per_kind: int = 2) -> dict[str, list[int]]:
    """``per_kind`` runs of version 3 parked at each kind of wait (approvals asked)."""
    publish(org, 3)
    runs: dict[str, list[int]] = {kind: [] for kind in KINDS}
    for n in range(per_kind * len(KINDS)):
        kind = KINDS[n % len(KINDS)]
        started = run_start(org=org, automation_slug=SLUG, run_input=run_input(kind, n),
                            start_key=f"r{n}")  # fmt: skip
        runs[kind].append(started.run_id)
    drive(lane="human")  # the approvals' executors ask and park
    publish(org, 4)
    return runs


def approve_all(run_ids: list[int]) -> None:
    for request in ApprovalRequest.objects.filter(run_id__in=run_ids, status="pending"):
        actor = Actor(via="api", name="t", org_id=request.org_id)
        decide(request.pk, decision="approve", actor=actor)


def given(value: Any) -> Any:
    """A JSON column's value, which these rows always have."""
    assert value is not None
    return value


def outputs(run_ids: list[int]) -> set[tuple[str, Any]]:
    return set(Run.objects.filter(pk__in=run_ids).values_list("status", "output"))


# --- the dry run --------------------------------------------------------------------------------


def test_the_dry_run_says_per_step_where_runs_would_go_and_why_others_would_not(org) -> None:
    runs = start_runs(org)

    report = dry_run(plan_3_to_4(org))

    assert (report.matched, report.would_move) == (8, 6)
    assert report.cannot["step_removed"]["runs"] == 2
    assert report.cannot["step_removed"]["sample"] == sorted(runs["hold"])
    lines = {(s["step_id"], s["to"], s["how"], s["cannot"]): s["runs"] for s in report.steps}
    assert lines == {
        ("cool", "cooldown", "mapped", None): 2,
        ("hold", None, None, "step_removed"): 2,
        ("paid", "payment", "mapped", None): 2,
        ("review", "review", "mapped", None): 2,
    }
    assert Run.objects.filter(version__number=4).count() == 0  # a dry run moves nothing
    assert not RunMigration.objects.exists()


def test_the_dry_run_filters_by_current_step_and_names_move_to(org) -> None:
    start_runs(org)

    report = dry_run(plan_3_to_4(org, steps=["hold", "paid"], removed="move_to:cooldown"))

    lines = {(s["step_id"], s["to"], s["how"], s["cannot"]): s["runs"] for s in report.steps}
    assert lines == {
        ("hold", "cooldown", "move_to", None): 2,
        ("paid", "payment", "mapped", None): 2,
    }
    assert (report.matched, report.would_move, report.cannot) == (4, 4, {})


# --- applying it ------------------------------------------------------------------------------


def test_runs_move_once_with_their_waits_and_finish_on_the_new_version(org) -> None:
    runs = start_runs(org)
    plan = plan_3_to_4(org)
    planned = dry_run(plan)

    progress = migration_start(plan=plan, actor="test:ops")

    job = progress.job
    assert (job.status, job.moved, progress.moved_now, progress.more) == ("finished", 6, 6, False)
    assert given(job.planned)["would_move"] == planned.would_move == job.moved
    assert given(job.report)["cannot"] == planned.as_json()["cannot"]  # what it left, and why
    moved = runs["cool"] + runs["paid"] + runs["review"]
    assert {version_of(r) for r in moved} == {4}
    assert {version_of(r) for r in runs["hold"]} == {3}
    for run_id in moved:
        (event,) = migrated_events(run_id)
        detail = given(event.detail)
        assert (detail["migration"], detail["from_version"], detail["to_version"]) == (job.pk, 3, 4)
        assert detail["mapping"]["cool"] == "cooldown" and detail["mapping"]["review"] == "review"
    # Each wait carried over, renamed with its step: the timer, the signal wait, the request.
    for run_id in runs["cool"]:
        assert live_steps(run_id) == [("cooldown", 1, "waiting")]
        timer = Timer.objects.get(run_id=run_id)
        assert (timer.step_id, timer.iteration, timer.fired_at) == ("cooldown", 1, None)
    for run_id in runs["paid"]:
        step = Step.objects.get(run_id=run_id, status="waiting")
        assert step.step_id == "payment" and given(step.wait_detail)["signal"] == SIGNAL
    for run_id in runs["review"]:
        assert ApprovalRequest.objects.get(run_id=run_id).step_id == "review"
    run = Run.objects.get(pk=runs["cool"][0])
    assert run.entered["cooldown"] == 1 and "cool" not in run.entered
    shown = StringIO()
    call_command("runs", "show", "--org", org.slug, str(run.pk), stdout=shown)
    assert f"moved from v3 to v4 (migration {job.pk}): cool#1 -> cooldown#1" in shown.getvalue()

    # Woken, the moved runs walk version 4 (its `after` sets "v4"); the others, version 3.
    make_timers_due(runs["cool"] + runs["hold"])
    assert fire_due_timers().fired == 4
    for step in Step.objects.filter(run_id__in=runs["paid"], status="waiting"):
        signal_send(org=org, name=SIGNAL, correlation=given(step.wait_detail)["correlation"])
    approve_all(runs["review"])
    assert outputs(moved) == {("succeeded", "v4")}
    assert outputs(runs["hold"]) == {("succeeded", "v3")}


def test_move_to_cancels_the_old_wait_and_enters_the_named_step(org) -> None:
    runs = start_runs(org)
    held = runs["hold"][0]
    old_timer = Timer.objects.get(run_id=held)

    progress = migration_start(
        plan=plan_3_to_4(org, removed={"move_to": "cooldown"}, steps=["hold"]), actor="test:ops"
    )

    assert progress.job.moved == 2
    old_timer.refresh_from_db()
    assert old_timer.cancelled_at is not None and old_timer.fired_at is None
    assert live_steps(held) == [("cooldown", 1, "waiting")]  # a new wait, made by version 4
    assert Timer.objects.get(run_id=held, cancelled_at__isnull=True).step_id == "cooldown"
    cancelled = RunEvent.objects.get(run_id=held, kind="step.cancelled")
    assert cancelled.step_id == "hold" and given(cancelled.detail)["reason"] == "migrated"
    (event,) = migrated_events(held)
    assert given(event.detail)["steps"] == [
        {"step_id": "hold", "iteration": 1, "how": "move_to", "to": "cooldown"}
    ]
    make_timers_due([held])
    assert fire_due_timers().fired == 1
    assert outputs([held]) == {("succeeded", "v4")}


def test_a_job_stopped_at_its_limit_is_resumed_and_moves_no_run_twice(org) -> None:
    runs = start_runs(org, per_kind=3)
    plan = plan_3_to_4(org)

    first = migration_start(plan=plan, actor="test:ops", limit=4)
    assert (first.more, first.job.status, first.job.moved) == (True, "running", 4)

    second = migration_resume(org=org, automation_slug=SLUG, migration_id=first.job.pk,
                              actor="test:ops")  # fmt: skip
    assert (second.more, second.job.status, second.job.moved, second.moved_now) == (
        False, "finished", 9, 5,
    )  # fmt: skip
    again = migration_resume(org=org, automation_slug=SLUG, migration_id=first.job.pk,
                             actor="test:ops")  # fmt: skip
    assert (again.moved_now, again.job.moved) == (0, 9)
    for run_id in runs["cool"] + runs["paid"] + runs["review"]:
        assert len(migrated_events(run_id)) == 1


def test_a_step_renamed_onto_an_id_the_run_already_entered_takes_the_next_iteration(org) -> None:
    two_waits = {"start": "b", "steps": [
        {"id": "b", "type": "wait", "duration": "1h", "next": "a"},
        {"id": "a", "type": "wait", "duration": "1h", "next": "done"},
        {"id": "done", "type": "end", "output": "v1"},
    ]}  # fmt: skip
    automation_publish_definition(org=org, slug="twice", definition=two_waits)
    run_id = run_start(org=org, automation_slug="twice", run_input={}, start_key="t").run_id
    make_timers_due([run_id])
    assert fire_due_timers().fired == 1  # b#1 done; the run waits at a#1
    one_wait = {"start": "b", "steps": [
        {"id": "b", "type": "wait", "duration": "1h", "next": "done"},
        {"id": "done", "type": "end", "output": "v2"},
    ]}  # fmt: skip
    automation_publish_definition(org=org, slug="twice", definition=one_wait)
    plan = migration_plan(org=org, automation_slug="twice", from_version=1, to_version=2,
                          mapping={"a": "b"})  # fmt: skip

    assert migration_start(plan=plan, actor="test:ops").job.moved == 1

    assert live_steps(run_id) == [("b", 2, "waiting")]
    assert Timer.objects.get(run_id=run_id, fired_at__isnull=True).iteration == 2
    assert Run.objects.get(pk=run_id).entered["b"] == 2
    make_timers_due([run_id])
    assert fire_due_timers().fired == 1
    assert outputs([run_id]) == {("succeeded", "v2")}


def test_an_effects_ledger_rows_follow_their_step_and_only_theirs(org) -> None:
    publish(org, 3)
    run_id = run_start(org=org, automation_slug=SLUG, run_input=run_input("cool", 0)).run_id
    keys = [f"{run_id}/cool/1", f"{run_id}/cool/1/series-1", f"{run_id}/cool/10",
            f"{run_id}/cool_x/1"]  # fmt: skip
    for key in keys:
        step_id, iteration = key.split("/")[1], int(key.split("/")[2])
        Effect.objects.create(org=org, run_id=run_id, step_id=step_id, iteration=iteration,
                              key=key, provider="http", state="settled")  # fmt: skip
    step = Step.objects.get(run_id=run_id, step_id="cool")
    rename = StepRename(org_id=org.pk, run_id=run_id, step_pk=step.pk, step_id="cool",
                        iteration=1, new_step_id="cooldown", new_iteration=3)  # fmt: skip

    with connection.cursor() as cursor:
        rename_everywhere(cursor, rename)

    assert sorted(Effect.objects.values_list("key", "step_id", "iteration")) == sorted([
        (f"{run_id}/cool/10", "cool", 10), (f"{run_id}/cool_x/1", "cool_x", 1),
        (f"{run_id}/cooldown/3", "cooldown", 3), (f"{run_id}/cooldown/3/series-1", "cooldown", 3),
    ])  # fmt: skip
    assert Timer.objects.get(run_id=run_id).step_id == "cooldown"


# --- never mid-step -----------------------------------------------------------------------------


def test_a_running_step_is_left_alone_and_moved_once_it_parks(org) -> None:
    """A worker holds one run's approval step (claimed, executing) while the job runs: the job
    moves the others, tries that run again after them, and moves it once its step parked."""
    publish(org, 3)
    held = run_start(org=org, automation_slug=SLUG, run_input=run_input("review", 0)).run_id
    others = [run_start(org=org, automation_slug=SLUG, run_input=run_input("cool", n)).run_id
              for n in range(1, 4)]  # fmt: skip
    worker = Worker(lane_policy("human"), concurrency=1, name="test-worker")
    (claimed,) = claim(policy=worker.policy, worker=worker.name, limit=1)
    publish(org, 4)
    assert dry_run(plan_3_to_4(org)).cannot["step_running"]["sample"] == [held]
    done: list[Any] = []

    def migrate() -> None:
        try:
            done.append(migration_start(plan=plan_3_to_4(org), actor="test:ops"))
        finally:
            connection.close()

    job = threading.Thread(target=migrate)
    job.start()
    try:
        wait_for(lambda: all(version_of(r) == 4 for r in others), what="the others moved")
        assert version_of(held) == 3 and live_steps(held) == [("review", 1, "running")]
        now = time.monotonic()
        attempt: Attempt | None = Attempt(claimed, deadline=now + 60, extended=now)
        while attempt is not None:  # the executor asks and parks: no longer mid-step
            attempt = worker._execute(attempt)
    finally:
        job.join(timeout=60)
    (progress,) = done
    assert (progress.job.status, progress.job.moved, progress.job.report["cannot"]) == (
        "finished", 4, {},
    )  # fmt: skip
    assert version_of(held) == 4 and len(migrated_events(held)) == 1
    approve_all([held])
    assert outputs([held]) == {("succeeded", "v4")}


def test_a_move_gives_way_to_a_transaction_holding_a_row_it_must_rename(org) -> None:
    """A timer batch holds the run's timer (and wants the run next): the move does not wait
    into a deadlock; it rolls back at once, changing nothing, and moves the run later."""
    publish(org, 3)
    run_id = run_start(org=org, automation_slug=SLUG, run_input=run_input("cool", 0)).run_id
    publish(org, 4)
    plan = plan_3_to_4(org)
    locked, release = threading.Event(), threading.Event()

    def hold_the_timer() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT id FROM timers_timer WHERE run_id = %s FOR UPDATE",
                               [run_id])  # fmt: skip
                locked.set()
                release.wait(timeout=60)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_timer)
    holder.start()
    try:
        assert locked.wait(timeout=30)
        began = time.monotonic()
        result = move_run(plan, run_id, migration_id=None, actor="test:ops")
        assert (result.outcome, result.reason) == ("busy", "locked")
        assert time.monotonic() - began < 10
        assert version_of(run_id) == 3 and live_steps(run_id) == [("cool", 1, "waiting")]
        assert not migrated_events(run_id)
    finally:
        release.set()
        holder.join(timeout=60)

    assert move_run(plan, run_id, migration_id=None, actor="test:ops").outcome == "moved"
    assert Timer.objects.get(run_id=run_id).step_id == "cooldown"


# --- bad input: a clear code, nothing done -------------------------------------------------------


BAD_PLANS = [
    ({"mapping": {"nope": "cooldown"}}, "unknown_step", {"step": "nope", "version": 3}),
    ({"mapping": {"cool": "nope"}}, "unknown_step", {"step": "nope", "version": 4}),
    ({"removed": "move_to:hold"}, "unknown_step", {"step": "hold", "version": 4}),
    ({"steps": ["payment"]}, "unknown_step", {"step": "payment", "version": 3}),
    ({"mapping": {"paid": "cooldown"}}, "incompatible_step_type",
     {"step": "paid", "target": "cooldown"}),
    ({"mapping": {"review": "cooldown"}}, "incompatible_step_type",
     {"step": "review", "target": "cooldown"}),
    ({"statuses": ["running", "succeeded"]}, "run_finished", {}),
    ({"statuses": ["done"]}, "invalid_input", {}),
    ({"to_version": 3}, "same_version", {}),
    ({"to_version": 9}, "unknown_version", {}),
    ({"to_version": 5}, "version_not_published", {}),
    ({"from_version": 5}, "version_not_published", {}),
    ({"to_automation": "other", "to_version": 1}, "version_of_another_automation", {}),
    ({"removed": "move:cooldown"}, "invalid_input", {}),
    ({"removed": {"move_to": ""}}, "invalid_input", {}),
    ({"mapping": {"cool": 4}}, "invalid_input", {}),
    ({"steps": "hold"}, "invalid_input", {}),
    ({"automation_slug": "nope"}, "unknown_automation", {}),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "code", "named"), BAD_PLANS)
def test_a_bad_plan_is_refused_with_its_code_and_nothing_moves(
    org, changes: dict[str, Any], code: str, named: dict[str, Any]
) -> None:
    runs = start_runs(org, per_kind=1)
    version_create_draft(automation=Run.objects.get(pk=runs["cool"][0]).automation,
                         definition=definition(4))  # v5, a draft  # fmt: skip
    automation_publish_definition(org=org, slug="other", definition=definition(4))
    before = list(Run.objects.order_by("pk").values_list("pk", "version_id", "status"))

    with pytest.raises(WaymarkError) as refused:
        progress = migration_start(plan=plan_3_to_4(org, **changes), actor="test:ops")
        pytest.fail(f"not refused: {progress}")

    assert refused.value.code == code
    assert {k: refused.value.as_dict()[k] for k in named} == named
    assert list(Run.objects.order_by("pk").values_list("pk", "version_id", "status")) == before
    assert not RunMigration.objects.exists()
    assert not RunEvent.objects.filter(kind="run.migrated").exists()


def test_resuming_an_unknown_or_another_organisations_job_is_unknown_migration(
    org, other_org
) -> None:
    start_runs(org, per_kind=1)
    job = migration_start(plan=plan_3_to_4(org), actor="test:ops", limit=0).job
    publish(other_org, 4)

    for who, number in ((org, 99_999), (other_org, job.pk)):
        with pytest.raises(WaymarkError) as refused:
            migration_resume(org=who, automation_slug=SLUG, migration_id=number, actor="t")
        assert refused.value.code == "unknown_migration"
    assert RunMigration.objects.get().moved == 0
