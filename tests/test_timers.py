"""Timers in process: entering a wait writes its timer in the same transaction, the due sweep
fires it once with its run, fairly across organisations, in people's time zones."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from timers.calendar import spread_offset
from timers.models import Timer
from timers.sweep import fire_due_timers, seconds_until_next_due
from workflows.models import Run, RunEvent, Step
from workflows.plugins.code import Context, publish_code_workflow, workflow
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .effect_setup import drive
from .factories import OrganisationFactory, timer_sweeper

pytestmark = pytest.mark.django_db(transaction=True)


def waits(step: dict, **top: object) -> dict:
    return {
        "start": "pause",
        **top,
        "steps": [
            {"id": "pause", **step, "next": "done"},
            {"id": "done", "type": "end", "output": "{{ steps.pause.output.due_at }}"},
        ],
    }


def start(org, definition: dict, key: str = "k", run_input: dict | None = None) -> int:
    automation_publish_definition(org=org, slug="timer", definition=definition)
    return run_start(org=org, automation_slug="timer", run_input=run_input or {},
                     start_key=key).run_id  # fmt: skip


def before_each_walk(monkeypatch, before) -> None:
    """``before(step_pk, run_id)`` called before each woken step's run walks on, in a batch
    fired together and in one fired timer by timer alike (waits.walk_on_woken): where a
    test makes a wake raise or wait."""
    from workflows.engine import waits

    real = waits.walk_on_woken

    def walk(cursor, run, row, wake):
        before(row["id"], run.id)
        return real(cursor, run, row, wake)

    monkeypatch.setattr(waits, "walk_on_woken", walk)


def batches_seen(monkeypatch) -> list[object]:
    """What each batch's waits.wake_steps_together answered (None: it refused, and the
    batch woke its steps one by one), as the sweep calls it."""
    import timers.sweep as sweep

    seen: list[object] = []
    real = sweep.wake_steps_together

    def spied(*args: object, **kwargs: object) -> object:
        seen.append(result := real(*args, **kwargs))  # type: ignore[arg-type]
        return result

    monkeypatch.setattr(sweep, "wake_steps_together", spied)
    return seen


def make_due(**filters: object) -> None:
    """Bring timers' instants to now (the sweep compares with the database's clock)."""
    Timer.objects.filter(**filters).update(due_at=Now())


def test_a_wait_writes_its_timer_with_its_step_and_fires_once(org):
    run_id = start(org, waits({"type": "wait", "duration": "2h"}))
    step = Step.objects.get(run_id=run_id, step_id="pause")
    timer = Timer.objects.get(run_id=run_id)
    assert (step.status, step.wait_kind, step.wake_at) == ("waiting", "external", None)
    assert step.wait_detail is not None and step.wait_detail["timer"] == timer.pk
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM %s - now())", [timer.due_at])
        left = float(cursor.fetchone()[0])
    assert 7100 < left <= 7200
    assert fire_due_timers().fired == 0  # not due yet
    make_due(pk=timer.pk)
    assert fire_due_timers().fired == 1
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded"
    timer.refresh_from_db()
    assert timer.fired_at is not None and timer.error == ""
    assert fire_due_timers().fired == 0  # fired once
    assert RunEvent.objects.filter(run_id=run_id, kind="step.timer_fired").count() == 1


def test_a_rule_in_a_zone_lands_on_local_time_with_a_stable_spread(org):
    rule = {"type": "wait_until", "rule": {"weekdays": ["mon"], "time": "09:00"},
            "timezone": "{{ input.tz }}"}  # fmt: skip
    run_id = start(org, waits(rule, timer_spread="10m"), run_input={"tz": "Europe/Berlin"})
    timer = Timer.objects.get(run_id=run_id)
    offset = spread_offset(run_id, 600)
    assert timer.offset_seconds == pytest.approx(offset)
    local = (timer.due_at - timedelta(seconds=offset)).astimezone(
        __import__("zoneinfo").ZoneInfo("Europe/Berlin")
    )
    assert (local.weekday(), local.hour, local.minute) == (0, 9, 0), (timer.due_at, offset, local)
    assert timer.zone == "Europe/Berlin"
    assert timer.intent["zone_template"] == "{{ input.tz }}"


def test_an_unknown_zone_in_the_runs_data_fails_the_step_clearly(org):
    rule = {"type": "wait_until", "rule": {"time": "09:00"}, "timezone": "{{ input.tz }}"}
    run_id = start(org, waits(rule), run_input={"tz": "Mars/Olympus"})
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"
    assert "Mars/Olympus" in Step.objects.get(run_id=run_id, step_id="pause").error


def test_one_big_organisation_cannot_delay_fifty_small_ones(org):
    """2,000 due timers of one organisation and 10 each of 50 others: every timer of the
    small ones fires within the first two batches."""
    definition = waits({"type": "wait", "duration": "1h"})
    big = [start(org, definition, key=f"b{i}") for i in range(2000)]
    small_orgs = OrganisationFactory.create_batch(50)
    small = [start(o, definition, key=f"s{i}") for o in small_orgs for i in range(10)]
    make_due()
    first, second = fire_due_timers(), fire_due_timers()
    assert first.fired + second.fired <= 1000
    fired_small = Timer.objects.filter(run_id__in=small, fired_at__isnull=False).count()
    assert fired_small == len(small) == 500
    assert Timer.objects.filter(run_id__in=big, fired_at__isnull=False).count() < 2000


def test_the_sweeper_knows_how_long_to_sleep(org):
    assert seconds_until_next_due() is None
    start(org, waits({"type": "wait", "duration": "30s"}))
    left = seconds_until_next_due()
    assert left is not None and 25 < left <= 30


def test_a_timer_that_fails_to_fire_fails_alone_and_its_batch_goes_on(org, monkeypatch):
    """A batch fires its timers without a savepoint each; one that raises rolls the batch
    back, and the batch is fired again timer by timer: the others fire, the bad one keeps
    its error, and each fired step is woken once. The bad one's step fails for good (its
    run fails, saying why): before, it stayed waiting on a spent timer for ever."""
    runs = [start(org, waits({"type": "wait", "duration": "1h"}), key=f"k{i}") for i in range(5)]
    bad = Step.objects.get(run_id=runs[2], step_id="pause").pk
    calls: list[int] = []

    def before(step_pk: int, run_id: int) -> None:
        calls.append(step_pk)
        if step_pk == bad:
            raise RuntimeError("the walk broke")

    before_each_walk(monkeypatch, before)
    make_due()
    batch = fire_due_timers()
    assert batch.fired == 5 and bad in calls and len(calls) > 5  # fired again, one by one
    fired = {t.run_id: t for t in Timer.objects.filter(run_id__in=runs)}
    assert all(t.fired_at is not None for t in fired.values())
    assert "RuntimeError: the walk broke" in fired[runs[2]].error
    assert [Run.objects.get(pk=r).status for r in runs] == ["succeeded"] * 2 + ["failed"] + [
        "succeeded"
    ] * 2
    failed = Run.objects.get(pk=runs[2])
    assert failed.error == (
        "step 'pause' failed: wake_failed: its timer could not fire: RuntimeError: the walk broke"
    )
    assert Step.objects.get(pk=bad).status == "failed"
    woken = RunEvent.objects.filter(run_id__in=runs, kind="step.timer_fired").count()
    assert woken == 4  # each once: the optimistic pass was rolled back, not kept twice
    assert fire_due_timers().fired == 0


def test_a_step_whose_timer_cannot_fire_takes_its_failure_path_or_can_be_retried(org, monkeypatch):
    """The failed step is an ordinary failure: its declared `on_failure` path runs; without
    one its run fails, and once the bug is fixed an operator's retry runs the step again (a
    new timer), which then fires."""
    from workflows.services.control import run_act

    with_path = {
        "start": "pause",
        "steps": [
            {"id": "pause", "type": "wait", "duration": "1h", "next": "done",
             "on_failure": "tell"},
            {"id": "tell", "type": "set", "values": {"told": "yes"}, "next": "failed"},
            {"id": "failed", "type": "end", "status": "failed"},
            {"id": "done", "type": "end"},
        ],
    }  # fmt: skip
    guarded = start(org, with_path, key="guarded")
    plain = start(org, waits({"type": "wait", "duration": "1h"}), key="plain")
    broken = {"walk": True}  # until the bug is fixed, every wake raises

    def before(step_pk: int, run_id: int) -> None:
        if broken["walk"]:
            raise RuntimeError("the walk broke")

    before_each_walk(monkeypatch, before)
    make_due()
    assert fire_due_timers().fired == 2
    steps = dict(Step.objects.filter(run_id=guarded).values_list("step_id", "status"))
    assert steps == {"pause": "failed", "tell": "done", "failed": "done"}
    assert Run.objects.get(pk=plain).status == "failed"

    broken["walk"] = False
    run_act(org=org, run_id=plain, action="retry", actor="test")
    make_due(fired_at__isnull=True)
    assert fire_due_timers().fired == 1
    assert Run.objects.get(pk=plain).status == "succeeded"


@pytest.mark.parametrize("failing_pass", ["optimistic", "one by one"])
def test_a_transient_database_error_is_retried_never_a_timers_error(org, monkeypatch, failing_pass):
    """A wake that meets a deadlock (raised by the server, as a real one is) is not the
    timer's fault: the batch is rolled back and fired again, each timer fires once and none
    records the error. In the one-by-one pass too (before, it marked the timer fired with
    'deadlock detected', and its step waited forever)."""
    runs = [start(org, waits({"type": "wait", "duration": "1h"}), key=f"k{i}") for i in range(4)]
    bad = Step.objects.get(run_id=runs[1], step_id="pause").pk
    # What each wake of the bad step meets, in turn: a bug first sends the batch one by one.
    meets = ["deadlock"] if failing_pass == "optimistic" else ["bug", "deadlock"]

    def before(step_pk: int, run_id: int) -> None:
        trouble = meets.pop(0) if step_pk == bad and meets else None
        if trouble == "bug":
            raise RuntimeError("a bug: the batch goes one by one")
        if trouble == "deadlock":
            with connection.cursor() as cursor:  # a real server error, SQLSTATE 40P01
                cursor.execute("DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' "
                               "USING ERRCODE = '40P01'; END $$")  # fmt: skip

    before_each_walk(monkeypatch, before)
    make_due()
    assert fire_due_timers().fired == 4
    timers = Timer.objects.filter(run_id__in=runs)
    assert [t.error for t in timers] == [""] * 4
    assert all(t.fired_at is not None for t in timers)
    assert set(Run.objects.filter(pk__in=runs).values_list("status", flat=True)) == {"succeeded"}
    woken = RunEvent.objects.filter(run_id__in=runs, kind="step.timer_fired").count()
    assert woken == 4 and meets == []


def test_a_batch_closes_with_its_last_wake_or_alone_when_that_step_no_longer_waits(org):
    """A batch's closing writes (timers fired, organisation served) travel with its last
    wake's walk writes; when the last timer's step no longer waits (its run was cancelled
    while its timer was held, so the cancel skipped it) they are sent on their own, and
    that timer is recorded as cancelled. Either way every timer of the batch is spent once,
    and the batch knows when the next pending timer is due."""
    from timers.models import OrgSweep
    from workflows.services.control import run_act

    definition = waits({"type": "wait", "duration": "1h"})
    batches = [[start(org, definition, key=f"k{b}-{i}") for i in range(3)] for b in range(2)]
    pending = start(org, definition, key="pending")
    for runs, cancel_last in zip(batches, (False, True), strict=True):
        for ago, run_id in zip((3, 2, 1), runs, strict=True):  # the last is the latest due
            Timer.objects.filter(run_id=run_id).update(due_at=Now() - timedelta(seconds=ago))
        if cancel_last:
            with timer_held(Timer.objects.get(run_id=runs[-1]).pk):
                run_act(org=org, run_id=runs[-1], action="cancel", actor="test")
            assert Timer.objects.get(run_id=runs[-1]).cancelled_at is None  # skipped
        OrgSweep.objects.all().delete()
        batch = fire_due_timers()
        assert (batch.fired, batch.orgs) == (3, 1)
        assert batch.next_due_at is not None  # the timers an hour ahead
        assert 3500 < batch.next_due_at - time.monotonic() <= 3600
        fired = Timer.objects.filter(run_id__in=runs, fired_at__isnull=False).count()
        cancelled = Timer.objects.filter(run_id__in=runs, cancelled_at__isnull=False).count()
        assert (fired, cancelled) == ((2, 1) if cancel_last else (3, 0))
        assert OrgSweep.objects.filter(org_id=org.pk).exists()
        assert fire_due_timers().fired == 0
    assert Timer.objects.get(run_id=pending).fired_at is None
    statuses = [Run.objects.get(pk=r).status for runs in batches for r in runs]
    assert statuses == ["succeeded"] * 5 + ["cancelled"]
    woken = RunEvent.objects.filter(kind="step.timer_fired").count()
    assert woken == 5


@contextmanager
def timer_held(timer_pk: int) -> Iterator[None]:
    """The timer's row locked by another transaction (as a firing batch holds it) while the
    block runs."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Timer.objects.select_for_update().get(pk=timer_pk)
                locked.set()
                release.wait(60)
        finally:
            connection.close()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert locked.wait(30), "the timer was never locked"
        yield
    finally:
        release.set()
        holder.join(timeout=30)


def test_a_firing_thread_busy_with_a_batch_does_not_hold_back_the_other_parts_timers(
    org, monkeypatch
):
    """A sweeper's firing threads each serve one part of the timers (mod(run_id, parts)):
    while one is stuck in a batch, the other part's timers fire. Real threads, a real
    sweeper."""
    runs = [start(org, waits({"type": "wait", "duration": "1h"}), key=f"k{i}") for i in range(6)]
    timers = list(Timer.objects.filter(run_id__in=runs))
    stuck_runs = {t.run_id for t in timers if t.run_id % 2 == 0}
    free_runs = {t.run_id for t in timers if t.run_id % 2 == 1}
    assert stuck_runs and free_runs
    held, release = threading.Event(), threading.Event()

    def before(step_pk: int, run_id: int) -> None:
        if run_id in stuck_runs:
            held.set()
            release.wait(60)

    before_each_walk(monkeypatch, before)
    make_due()
    stop = threading.Event()
    sweeper = timer_sweeper("test-sweeper", tick=0.2, firers=2)
    thread = threading.Thread(target=sweeper.run, args=(stop,), daemon=True)
    thread.start()

    def fired(run_ids: set[int]) -> int:
        return Timer.objects.filter(run_id__in=run_ids, fired_at__isnull=False).count()

    def wait_fired(run_ids: set[int]) -> int:
        deadline = time.monotonic() + 60
        while fired(run_ids) < len(run_ids) and time.monotonic() < deadline:
            time.sleep(0.05)
        return fired(run_ids)

    try:
        assert held.wait(60), "the sweeper never began the stuck part's batch"
        assert wait_fired(free_runs) == len(free_runs)  # while the other thread was stuck
        assert fired(stuck_runs) == 0
        release.set()
        assert wait_fired(stuck_runs) == len(stuck_runs)
    finally:
        release.set()
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert set(Run.objects.filter(pk__in=runs).values_list("status", flat=True)) == {"succeeded"}


def test_a_timer_due_at_a_past_moment_fires_at_the_next_sweep(org):
    past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    run_id = start(org, waits({"type": "wait_until", "at": "{{ input.at }}"}),
                   run_input={"at": past})  # fmt: skip
    assert fire_due_timers().fired == 1
    assert Run.objects.get(pk=run_id).status == "succeeded"


def test_a_changed_zone_moves_the_timer_instead_of_firing_it(org):
    """The zone comes from the run's data and changed before the timer came due: the sweep
    computes the instant again in the new zone (recorded), instead of firing at the old."""
    rule = {"type": "wait_until", "rule": {"time": "09:00"}, "timezone": "{{ vars.tz }}"}
    definition = {
        "start": "zone",
        "steps": [
            {"id": "zone", "type": "set", "values": {"tz": "Europe/Berlin"}, "next": "pause"},
            {"id": "pause", **rule, "next": "done"},
            {"id": "done", "type": "end"},
        ],
    }
    run_id = start(org, definition)
    timer = Timer.objects.get(run_id=run_id)
    assert timer.zone == "Europe/Berlin"
    Run.objects.filter(pk=run_id).update(vars={"tz": "America/New_York"})  # as a branch would
    make_due(pk=timer.pk)
    assert fire_due_timers().fired == 0  # moved, not fired
    timer.refresh_from_db()
    assert timer.fired_at is None and timer.zone == "America/New_York"
    local = timer.due_at.astimezone(__import__("zoneinfo").ZoneInfo("America/New_York"))
    assert (local.hour, local.minute) == (9, 0)
    [moved] = RunEvent.objects.filter(run_id=run_id, kind="timer.recomputed")
    assert moved.detail is not None and moved.detail["zone_to"] == "America/New_York"


def test_recompute_timers_reports_what_moved(org):
    from io import StringIO

    from django.core.management import call_command

    run_id = start(org, waits({"type": "wait_until", "rule": {"time": "09:00"},
                               "timezone": "Europe/Berlin"}))  # fmt: skip
    start(org, waits({"type": "wait", "duration": "1h"}), key="other")
    out = StringIO()
    call_command("recompute_timers", stdout=out)
    assert out.getvalue().strip() == "2 pending timer(s) checked, 0 moved"
    # As if the tz database had moved Berlin's clocks: the stored instant is now wrong.
    Timer.objects.filter(run_id=run_id).update(due_at=Now())
    call_command("recompute_timers", stdout=out)
    assert "2 pending timer(s) checked, 1 moved" in out.getvalue()
    assert RunEvent.objects.filter(run_id=run_id, kind="timer.recomputed").count() == 1


# --- cancelled with their step ------------------------------------------------------------------


def timer_of(run_id: int, step_id: str = "pause") -> Timer:
    return Timer.objects.get(run_id=run_id, step_id=step_id)


def test_a_cancelled_runs_timer_is_cancelled_with_it_and_never_fires(org):
    from workflows.services.control import run_act

    run_id = start(org, waits({"type": "wait", "duration": "1h"}))
    run_act(org=org, run_id=run_id, action="cancel", actor="test")
    timer = timer_of(run_id)
    assert timer.cancelled_at is not None and timer.fired_at is None and timer.error == ""
    make_due(pk=timer.pk)
    assert fire_due_timers().fired == 0  # its time came: nothing to fire
    assert seconds_until_next_due() is None  # nor to wait for
    timer.refresh_from_db()
    assert timer.fired_at is None
    assert not RunEvent.objects.filter(run_id=run_id, kind="step.timer_fired").exists()
    assert Run.objects.get(pk=run_id).status == "cancelled"


def branches(*steps: dict, **join: object) -> dict:
    """A parallel of the given branch steps (each one step long), joined."""
    ids = [step["id"] for step in steps]
    return {
        "start": "fan",
        "steps": [
            {"id": "fan", "type": "parallel", "branches": ids, "next": "join"},
            *({**step, "next": step.get("next", "join")} for step in steps),
            {"id": "join", "type": "join", "wait_for": ids, **join, "next": "done"},
            {"id": "done", "type": "end"},
        ],
    }


def test_a_branch_that_ends_the_run_cancels_the_other_branchs_timer(org):
    """The run ends on one branch (its wait fires, then `end`) while another waits an hour:
    the waiting step is cancelled by the run's end, and its timer with it, in the firing
    batch's own transaction."""
    definition = branches(
        {"id": "slow", "type": "wait", "duration": "1h"},
        {"id": "fast", "type": "wait", "duration": "1h", "next": "stop"},
    )
    definition["steps"].append({"id": "stop", "type": "end"})
    run_id = start(org, definition)
    make_due(run_id=run_id, step_id="fast")
    assert fire_due_timers().fired == 1
    assert Run.objects.get(pk=run_id).status == "succeeded"
    slow = timer_of(run_id, "slow")
    assert slow.cancelled_at is not None and slow.fired_at is None
    make_due(pk=slow.pk)
    assert fire_due_timers().fired == 0


def test_a_branch_that_fails_the_run_cancels_the_other_branchs_timer(org):
    definition = branches(
        {"id": "slow", "type": "wait", "duration": "1h"},
        {"id": "bad", "type": "wait_until", "rule": {"time": "09:00"},
         "timezone": "{{ input.tz }}"},
    )  # fmt: skip
    run_id = start(org, definition, run_input={"tz": "Mars/Olympus"})
    assert Run.objects.get(pk=run_id).status == "failed"
    slow = timer_of(run_id, "slow")
    assert slow.cancelled_at is not None and slow.fired_at is None


def test_a_join_complete_without_a_branch_cancels_its_timer(org):
    definition = branches(
        {"id": "slow", "type": "wait", "duration": "1h"},
        {"id": "fast", "type": "wait", "duration": "1h"},
        complete="first",
    )
    run_id = start(org, definition)
    make_due(run_id=run_id, step_id="fast")
    assert fire_due_timers().fired == 1
    assert Run.objects.get(pk=run_id).status == "succeeded"
    assert timer_of(run_id, "slow").cancelled_at is not None


def test_a_zero_spread_is_accepted_on_a_step_as_on_the_definition(org):
    """`spread: "0s"` on a step, as docs/reference/definitions.md says (and as `timer_spread`): the
    definition publishes, and the run's timer has no offset."""
    rule = {"type": "wait_until", "rule": {"time": "09:00"}, "spread": "0s"}
    run_id = start(org, waits(rule, timer_spread="10m"))  # the step's own spread wins
    timer = timer_of(run_id)
    assert (timer.spread_seconds, timer.offset_seconds) == (0, 0)
    local = timer.due_at.astimezone(UTC)
    assert (local.hour, local.minute, local.second) == (9, 0, 0)


# What users build around a wait: a wait after a write, a worker step after a wait (its lane
# woken), a loop of waits, a branch's wait that completes its join, the one-step wait ending
# the run with an output read from the wake, and a branch's wait ending the run while its
# sibling waits (the live steps ended with it).
AROUND_A_WAIT = {
    "after a write": {
        "start": "note",
        "steps": [
            {"id": "note", "type": "set", "values": {"seen": "{{ input.n }}"}, "next": "pause"},
            {"id": "pause", "type": "wait", "duration": "1h", "next": "work"},
            {"id": "work", "type": "noop", "next": "done"},
            {"id": "done", "type": "end"},
        ],
    },
    "a loop": {
        "start": "pause",
        "steps": [
            {"id": "pause", "type": "wait", "duration": "1h", "next": "count"},
            {"id": "count", "type": "set", "values": {"laps": "{{ vars.laps | default('') }}x"},
             "next": "again"},
            {"id": "again", "type": "branch",
             "when": [{"outcome": "back", "if": "vars.laps | length < 2"}],
             "next": {"back": "pause", "default": "done"}},
            {"id": "done", "type": "end"},
        ],
    },
    "a join": branches(
        {"id": "pause", "type": "wait", "duration": "1h"},
        {"id": "quick", "type": "set", "values": {"quick": True}},
    ),
    "the end": waits({"type": "wait", "duration": "1h"}),
    "an end beside a wait": {
        **branches(
            {"id": "slow", "type": "wait", "duration": "2h"},
            {"id": "pause", "type": "wait", "duration": "1h", "next": "stop"},
        ),
    },
}  # fmt: skip
AROUND_A_WAIT["an end beside a wait"]["steps"].append({"id": "stop", "type": "end"})


def unchanged(n: int) -> int:
    return n


# The same around a code workflow's ctx.sleep: the turn after a wake runs on a worker (a woken
# walk enters the decider for its lane), so these twins go between the worker and the sweep.
@workflow("timers-batch-sleeps", version=1)
def sleeps_between_steps(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    seen = ctx.step("before", "noop", output="{{ input.n }}")
    for _lap in range(2):
        ctx.sleep("pause", "1h")
    return {"seen": seen, "after": ctx.run("after", unchanged, 3)}


@workflow("timers-batch-branches", version=1)
def a_branch_sleeps(ctx: Context, run_input: dict[str, Any]) -> list[Any]:
    return ctx.parallel(
        "both", lambda c: c.sleep("pause", "1h"), lambda c: c.step("quick", "noop", output=1)
    )


CODE_AROUND_A_WAIT = ("timers-batch-sleeps", "timers-batch-branches")


def test_a_batch_fired_together_writes_what_firing_each_alone_writes(org, monkeypatch):
    """Differential: the same runs, as twins, fired by a batch that wakes its steps together
    (waits.wake_steps_together) and by one that wakes them one by one (wake_step) leave the
    same rows: steps, history and run, ids and clocks aside. Definitions' runs and code
    workflows' alike (a code run's sleeps, between its worker's turns)."""
    import timers.sweep as sweep

    for name in CODE_AROUND_A_WAIT:
        publish_code_workflow(org=org, name=name, version=1)

    def started(tag: str) -> dict[str, int]:
        runs: dict[str, int] = {}
        for n, (name, definition) in enumerate(AROUND_A_WAIT.items()):
            automation_publish_definition(org=org, slug=f"w-{n}", definition=definition)
            runs[name] = run_start(org=org, automation_slug=f"w-{n}", run_input={"n": 7},
                                   start_key=f"{tag}-{name}").run_id  # fmt: skip
        for name in CODE_AROUND_A_WAIT:
            runs[name] = run_start(org=org, automation_slug=name, run_input={"n": 7},
                                   start_key=f"{tag}-{name}").run_id  # fmt: skip
        return runs

    def fire_all(runs: dict[str, int]) -> None:
        while True:  # loops wait again: each lap's timer is made due in turn
            drive(lane="io")  # the code runs' turns, before a sleep and after a wake
            due = Timer.objects.filter(run_id__in=runs.values(), fired_at__isnull=True,
                                       cancelled_at__isnull=True, step_id="pause")  # fmt: skip
            if not due.exists():
                return
            count = due.update(due_at=Now())
            assert fire_due_timers().fired == count

    together, alone = started("together"), started("alone")
    seen = batches_seen(monkeypatch)
    fire_all(together)
    assert seen and all(isinstance(woke, list) and len(woke) > 0 for woke in seen)
    monkeypatch.setattr(sweep, "wake_steps_together", lambda *a, **k: None)  # one by one
    fire_all(alone)
    for name in together:
        assert written(together[name]) == written(alone[name]), name
    statuses = {name: Run.objects.get(pk=r).status for name, r in together.items()}
    assert statuses == dict.fromkeys(together, "succeeded")
    work = Step.objects.get(run_id=together["after a write"], step_id="work")
    assert work.status == "done"  # entered ready by the wake, then run by the io lane's worker
    sleeps = Run.objects.get(pk=together["timers-batch-sleeps"])
    assert sleeps.output == {"seen": "7", "after": 3}  # a template renders text
    fired = RunEvent.objects.filter(run_id=sleeps.pk, kind="step.timer_fired")
    assert list(fired.values_list("step_id", "iteration")) == [("pause", 1), ("pause", 2)]


def written(run_id: int) -> dict[str, object]:
    """A run's rows as a user reads them: ids, clocks and workers' names aside."""
    import json
    import re

    def plain(value: object) -> object:
        text = json.dumps(value, default=str, sort_keys=True)
        text = re.sub(r'("timer": |"join_row": |"timer:)\d+', r"\1<id>", text)  # row ids
        return re.sub(r"\d{4}-\d\d-\d\d[T ][0-9:.+\-]+", "<time>", text)

    run = Run.objects.get(pk=run_id)
    steps = Step.objects.filter(run_id=run_id).order_by("id")
    events = RunEvent.objects.filter(run_id=run_id).order_by("id")
    return {
        "run": plain([run.status, run.vars, run.outputs, run.entered, run.output, run.error,
                      run.steps_executed]),
        "steps": [plain([s.step_id, s.iteration, s.type, s.lane, s.status, s.attempt,
                         s.output, s.error, s.wait_kind, s.branch, s.fork_join_id is None])
                  for s in steps],
        "events": [plain([e.kind, e.step_id, e.iteration, e.attempt, e.detail]) for e in events],
    }  # fmt: skip


def test_two_timers_of_one_run_in_a_batch_fire_one_after_the_other(org, monkeypatch):
    """Two branches of one run wait for the same instant: their steps cannot wake together
    (the second walk must see the first's writes), so the batch wakes them one by one, and
    each fires once; the other runs of the batch fire as well."""

    pair = branches(
        {"id": "left", "type": "wait", "duration": "1h"},
        {"id": "right", "type": "wait", "duration": "1h"},
    )
    both = start(org, pair, key="pair")
    others = [start(org, waits({"type": "wait", "duration": "1h"}), key=f"o{i}") for i in range(2)]
    seen = batches_seen(monkeypatch)
    make_due()
    assert fire_due_timers().fired == 4
    assert seen == [None]  # refused: the batch went one by one
    assert set(Run.objects.filter(pk__in=[both, *others]).values_list("status", flat=True)) == {
        "succeeded"
    }
    fired = RunEvent.objects.filter(run_id=both, kind="step.timer_fired")
    assert sorted(fired.values_list("step_id", flat=True)) == ["left", "right"]
    assert fire_due_timers().fired == 0
