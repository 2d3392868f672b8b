"""Migrating runs between versions, and what the run did before the move: a saga being undone
is not moved; the rows of completed steps (and the loop counts) follow the mapping, so a
later compensation, a loop's next turn and an operator's retry read them under the new ids;
and a job never moves a run twice, even when another job moved it back."""

from __future__ import annotations

from typing import Any

import pytest

from timers.models import Timer
from timers.sweep import fire_due_timers
from workflows.models import Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.control import run_act
from workflows.services.run_migration import (
    dry_run,
    migration_plan,
    migration_resume,
    migration_start,
)
from workflows.services.run_migration.move import move_run
from workflows.services.runs import run_start

from .effect_setup import drive
from .migration_setup import (
    SLUG,
    make_timers_due,
    migrated_events,
    plan_3_to_4,
    publish,
    run_input,
    version_of,
)

pytestmark = pytest.mark.django_db(transaction=True)


def start(org: Any, slug: str, key: str) -> int:
    return run_start(org=org, automation_slug=slug, run_input={}, start_key=key).run_id


def fire(run_ids: list[int]) -> int:
    make_timers_due(run_ids)
    return fire_due_timers().fired


def rows(run_id: int) -> list[tuple[str, int, str]]:
    return sorted(Step.objects.filter(run_id=run_id).values_list("step_id", "iteration", "status"))


def status(run_id: int) -> tuple[str, Any]:
    run = Run.objects.get(pk=run_id)
    return run.status, run.output


# --- 1. a saga being undone stays ------------------------------------------------------------


def saga(first: str, undo_wait: str = "1h") -> dict[str, Any]:
    """``first`` (it has a compensation), a wait, then an end that fails the run: the run
    compensates ``first`` by waiting (``undo``), then ends compensated."""
    return {"start": first, "steps": [
        {"id": first, "type": "set", "values": {"booked": True}, "next": "hold",
         "compensate": "undo"},
        {"id": "hold", "type": "wait", "duration": "1h", "next": "boom"},
        {"id": "boom", "type": "end", "status": "failed"},
        {"id": "undo", "type": "wait", "duration": undo_wait},
    ]}  # fmt: skip


def test_a_run_being_compensated_is_not_moved_and_the_dry_run_says_why(org) -> None:
    automation_publish_definition(org=org, slug="saga", definition=saga("book"))
    undoing, waiting = start(org, "saga", "undoing"), start(org, "saga", "waiting")
    assert fire([undoing]) == 1  # hold done, boom fails the run: it compensates `book`
    assert RunEvent.objects.filter(run_id=undoing, kind="run.compensating").exists()
    assert (Run.objects.get(pk=undoing).status, rows(undoing)[-1]) == (
        "running", ("undo", 1, "waiting"),
    )  # fmt: skip
    automation_publish_definition(org=org, slug="saga", definition=saga("book", "2h"))  # v2
    plan = migration_plan(org=org, automation_slug="saga", from_version=1, to_version=2)

    report = dry_run(plan)
    assert (report.matched, report.would_move) == (2, 1)
    assert report.cannot["compensating"]["sample"] == [undoing]
    assert "saga is being undone" in report.cannot["compensating"]["why"]
    assert move_run(plan, undoing, migration_id=None, actor="t").reason == "compensating"

    job = migration_start(plan=plan, actor="test:ops").job
    assert job.moved == 1 and job.report is not None
    assert job.report["cannot"]["compensating"]["sample"] == [undoing]
    assert (version_of(undoing), version_of(waiting)) == (1, 2)
    assert not migrated_events(undoing)
    assert fire([undoing]) == 1  # its compensation ends on the version it began on
    assert status(undoing) == ("compensated", None)


# --- 2. completed steps follow the mapping ------------------------------------------------------


def test_a_step_completed_before_the_move_is_compensated_under_its_new_id(org) -> None:
    undo_now = saga("reserve")
    undo_now["steps"][-1] = {"id": "undo", "type": "set", "values": {"undone": True}}
    automation_publish_definition(org=org, slug="saga", definition=undo_now)
    run_id = start(org, "saga", "r")
    renamed = saga("book")
    renamed["steps"][-1] = undo_now["steps"][-1]
    automation_publish_definition(org=org, slug="saga", definition=renamed)
    plan = migration_plan(org=org, automation_slug="saga", from_version=1, to_version=2,
                          mapping={"reserve": "book"})  # fmt: skip

    assert migration_start(plan=plan, actor="test:ops").job.moved == 1

    assert rows(run_id) == [("book", 1, "done"), ("hold", 1, "waiting")]
    assert Run.objects.get(pk=run_id).entered == {"book": 1, "hold": 1}
    (event,) = migrated_events(run_id)
    assert event.detail is not None and event.detail["finished_renamed"] == 1
    assert fire([run_id]) == 1  # boom fails the run: its completed `book` is compensated
    assert status(run_id) == ("compensated", None)
    (begun,) = RunEvent.objects.filter(run_id=run_id, kind="run.compensating")
    assert begun.detail is not None
    assert begun.detail["plan"] == [{"step": "undo", "compensates": "book", "iteration": 1}]
    assert Run.objects.get(pk=run_id).vars.get("undone") is True


def test_rows_trading_ids_pass_through_a_temporary_id_and_keep_their_timers(org) -> None:
    """v1 waits at `ping`, then `pong`; v2 calls them the other way round. A run at pong#1
    (ping#1 done, its timer fired) moves: each row and its timer take the other's id."""

    def two(first: str, second: str) -> dict[str, Any]:
        return {"start": first, "steps": [
            {"id": first, "type": "wait", "duration": "1h", "next": second},
            {"id": second, "type": "wait", "duration": "2h", "next": "done"},
            {"id": "done", "type": "end", "output": "{{ 'ended' }}"},
        ]}  # fmt: skip

    automation_publish_definition(org=org, slug="swap", definition=two("ping", "pong"))
    run_id = start(org, "swap", "s")
    assert fire([run_id]) == 1
    automation_publish_definition(org=org, slug="swap", definition=two("pong", "ping"))
    plan = migration_plan(org=org, automation_slug="swap", from_version=1, to_version=2,
                          mapping={"ping": "pong", "pong": "ping"})  # fmt: skip

    assert migration_start(plan=plan, actor="test:ops").job.moved == 1

    assert rows(run_id) == [("ping", 1, "waiting"), ("pong", 1, "done")]
    timers = {(t.step_id, t.iteration, t.fired_at is not None) for t in Timer.objects.all()}
    assert timers == {("pong", 1, True), ("ping", 1, False)}
    assert Run.objects.get(pk=run_id).entered == {"ping": 1, "pong": 1}
    assert fire([run_id]) == 1
    assert status(run_id) == ("succeeded", "ended")


# --- 3. loop counts follow the mapping -----------------------------------------------------------


def loop(waiting: str, after: str | None) -> dict[str, Any]:
    """A loop of three turns through the wait ``waiting``; then ``after`` (a wait) if any."""
    last = after or "done"
    steps: list[dict[str, Any]] = [
        {"id": waiting, "type": "wait", "duration": "1h", "next": "count"},
        {"id": "count", "type": "set", "values": {"trail": "{{ vars.trail | default('') }}x"},
         "next": "again"},
        {"id": "again", "type": "branch", "when": [
            {"outcome": "more", "if": "vars.trail | length < 3"}],
         "next": {"more": waiting, "default": last}},
        {"id": "done", "type": "end", "output": "{{ vars.trail }}"},
    ]  # fmt: skip
    if after:
        steps.append({"id": after, "type": "wait", "duration": "1h", "next": "done"})
    return {"start": waiting, "steps": steps}


def test_a_loop_renamed_mid_way_goes_on_and_the_old_id_can_be_entered_anew(org) -> None:
    """v2 calls the loop's wait `pause` and has a new wait named `tick` after the loop: the
    loop's turns go on under `pause` (iterations 3 and so on), and `tick` starts at 1: no
    iteration is used twice, not by the step rows, not by the timers."""
    automation_publish_definition(org=org, slug="loop", definition=loop("tick", None))
    run_id = start(org, "loop", "l")
    assert fire([run_id]) == 1  # tick#1, count, again: the run waits at tick#2
    automation_publish_definition(org=org, slug="loop", definition=loop("pause", "tick"))
    plan = migration_plan(org=org, automation_slug="loop", from_version=1, to_version=2,
                          mapping={"tick": "pause"})  # fmt: skip

    assert migration_start(plan=plan, actor="test:ops").job.moved == 1

    entered = Run.objects.get(pk=run_id).entered
    assert (entered["pause"], "tick" in entered) == (2, False)
    assert [r for r in rows(run_id) if r[0] in ("pause", "tick")] == [
        ("pause", 1, "done"), ("pause", 2, "waiting"),
    ]  # fmt: skip
    assert fire([run_id]) == 1  # pause#2: the loop's second turn
    assert fire([run_id]) == 1  # pause#3: its third; then the new `tick`
    assert [r for r in rows(run_id) if r[0] in ("pause", "tick")] == [
        ("pause", 1, "done"), ("pause", 2, "done"), ("pause", 3, "done"),
        ("tick", 1, "waiting"),
    ]  # fmt: skip
    assert fire([run_id]) == 1
    assert status(run_id) == ("succeeded", "xxx")
    assert Run.objects.get(pk=run_id).entered["pause"] == 3


# --- 4. an operator's retry after a move --------------------------------------------------------


def flaky(first: str | None, *, on_failure: bool) -> dict[str, Any]:
    """``first`` (a worker's step that fails for good; with ``on_failure`` the run goes on to
    ``hold``), ``hold`` (a wait), ``last`` (fails for good: the run fails), ``done``."""
    failing = {"type": "probe", "fail_attempts": 9, "retry": {"max_attempts": 1}}
    steps: list[dict[str, Any]] = [
        {"id": "hold", "type": "wait", "duration": "1h", "next": "last"},
        {"id": "last", **failing, "next": "done"},
        {"id": "done", "type": "end"},
    ]
    if first is not None:
        extra = {"on_failure": "hold"} if on_failure else {}
        steps.insert(0, {"id": first, **failing, "next": "hold", **extra})
    return {"start": first or "hold", "steps": steps}


@pytest.mark.parametrize(
    ("new_first", "mapping"),
    [("attempt", {"try": "attempt"}), (None, {})],
    ids=["mapped, its on_failure gone", "removed"],
)
def test_a_retry_after_a_move_runs_only_what_failed_the_run(
    org, new_first: str | None, mapping: dict[str, str]
) -> None:
    """`try` failed before the move and the run went on (its on_failure): it is not what
    failed the run, whatever the new version says of it (no on_failure, or no such step).
    `last` failed after the move, on the new version, which has no on_failure for it."""
    automation_publish_definition(org=org, slug="flaky", definition=flaky("try", on_failure=True))
    run_id = start(org, "flaky", "f")
    drive()  # try fails for good; the run waits at hold
    assert ("try", 1, "failed") in rows(run_id)
    new = flaky(new_first, on_failure=False)
    automation_publish_definition(org=org, slug="flaky", definition=new)
    plan = migration_plan(org=org, automation_slug="flaky", from_version=1, to_version=2,
                          mapping=mapping)  # fmt: skip
    assert migration_start(plan=plan, actor="test:ops").job.moved == 1
    old_try = new_first or "try"  # renamed when mapped; under its old id when removed
    (old_row,) = Step.objects.filter(run_id=run_id, step_id=old_try)
    (event,) = migrated_events(run_id)
    assert event.detail is not None and event.detail["failed_before"] == [old_row.pk]
    assert fire([run_id]) == 1
    drive()  # last fails for good: the run fails
    assert Run.objects.get(pk=run_id).status == "failed"

    outcome = run_act(org=org, run_id=run_id, action="retry", actor="test:ops")

    assert (outcome.status, outcome.steps) == ("running", 1)
    (retried,) = RunEvent.objects.filter(run_id=run_id, kind="run.retried")
    assert retried.detail is not None and retried.detail["steps"] == ["last"]
    old_row.refresh_from_db()
    assert old_row.status == "failed"  # left as it was
    drive()  # last fails again (its probe fails every attempt): the run fails as before
    assert Run.objects.get(pk=run_id).status == "failed"
    assert rows(run_id).count((old_try, 1, "failed")) == 1


# --- 6. a job never moves a run twice -----------------------------------------------------------


def plan_4_to_3(org: Any) -> Any:
    return migration_plan(org=org, automation_slug=SLUG, from_version=4, to_version=3,
                          mapping={"cooldown": "cool", "payment": "paid"})  # fmt: skip


def start_cool_runs(org: Any, n: int) -> list[int]:
    publish(org, 3)
    ids = [run_start(org=org, automation_slug=SLUG, run_input=run_input("cool", i),
                     start_key=f"c{i}").run_id for i in range(n)]  # fmt: skip
    publish(org, 4)
    return ids


def test_a_resumed_job_does_not_move_again_a_run_another_job_moved_back(org) -> None:
    first, second = start_cool_runs(org, 2)
    job_a = migration_start(plan=plan_3_to_4(org), actor="test:a", limit=1).job
    assert (job_a.moved, version_of(first), version_of(second)) == (1, 4, 3)
    job_b = migration_start(plan=plan_4_to_3(org), actor="test:b").job
    assert (job_b.moved, version_of(first)) == (1, 3)  # back on version 3

    resumed = migration_resume(org=org, automation_slug=SLUG, migration_id=job_a.pk,
                               actor="test:a")  # fmt: skip

    assert (resumed.job.status, resumed.job.moved, resumed.moved_now) == ("finished", 2, 1)
    assert (version_of(first), version_of(second)) == (3, 4)
    by_job = [given["migration"] for given in
              (e.detail for e in migrated_events(first)) if given is not None]  # fmt: skip
    assert by_job == [job_a.pk, job_b.pk]  # once each
    result = move_run(plan_3_to_4(org), first, migration_id=job_a.pk, actor="test:a")
    assert result.outcome == "already_moved"


def test_a_run_another_job_moved_since_the_job_was_made_is_skipped_with_its_reason(org) -> None:
    first, second = start_cool_runs(org, 2)
    job_a = migration_start(plan=plan_3_to_4(org), actor="test:a", limit=0).job
    assert job_a.planned is not None and job_a.planned["would_move"] == 2
    migration_start(plan=plan_3_to_4(org, steps=["cool"]), actor="test:b", limit=1)
    migration_start(plan=plan_4_to_3(org), actor="test:c")  # first: v3 -> v4 -> v3
    assert version_of(first) == 3 and len(migrated_events(first)) == 2

    result = move_run(plan_3_to_4(org), first, migration_id=job_a.pk, actor="test:a")
    assert (result.outcome, result.reason) == ("skipped", "moved_by_another_migration")
    resumed = migration_resume(org=org, automation_slug=SLUG, migration_id=job_a.pk,
                               actor="test:a")  # fmt: skip

    assert (resumed.job.moved, version_of(first), version_of(second)) == (1, 3, 4)
    (skipped,) = RunEvent.objects.filter(run_id=first, kind="run.migration_skipped")
    assert skipped.detail is not None
    assert (skipped.detail["migration"], skipped.detail["reason"]) == (
        job_a.pk, "moved_by_another_migration",
    )  # fmt: skip
    assert len(migrated_events(first)) == 2
