"""The due sweep with real sweeper processes: killed mid-batch, two at once, a lost wake,
and the fast path."""

from __future__ import annotations

import pytest

from timers.models import Timer
from workflows.models import Run, RunEvent, SweepLease

from .processes import running, spawn, stop, wait_for
from .test_timers import make_due, start, waits

pytestmark = pytest.mark.django_db(transaction=True)


def sweeper(**env: str):
    return spawn("sweep", **{"WAYMARK_SWEEP_SECONDS": "0.3", **env})


def all_fired(run_ids: list[int]) -> bool:
    return not Timer.objects.filter(run_id__in=run_ids, fired_at__isnull=True).exists()


def fired_events(run_ids: list[int]) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id__in=run_ids, kind="step.timer_fired"))


def many(org, n: int) -> list[int]:
    definition = waits({"type": "wait", "duration": "1h"})
    runs = [start(org, definition, key=f"r{i}") for i in range(n)]
    make_due(run_id__in=runs)
    return runs


@pytest.mark.parametrize("crash_at", ["timers.after_claim", "timers.before_batch_commit"])
def test_a_sweeper_killed_mid_batch_fires_nothing_and_the_next_fires_each_once(org, crash_at):
    runs = many(org, 300)
    doomed = sweeper(WAYMARK_CRASH_AT=crash_at)
    with running(doomed):
        assert doomed.wait(timeout=60) == 137
    # Its batch had claimed its timers (and, before the commit, woken steps and walked runs
    # on), then died: all undone.
    assert not all_fired(runs) and not fired_events(runs)
    assert Run.objects.filter(pk__in=runs, status="running").count() == 300
    heir = sweeper()
    with running(heir):  # takes the lease once the dead one's lapses (3 ticks)
        wait_for(lambda: all_fired(runs), timeout=60, what="every timer to fire")
        stop(heir)
    events = fired_events(runs)
    assert sorted(e.run_id for e in events) == sorted(runs)  # each exactly once
    assert Run.objects.filter(pk__in=runs, status="succeeded").count() == 300


def test_two_sweepers_fire_each_timer_once_and_one_leads(org):
    a, b = sweeper(), sweeper()
    with running(a, b):
        wait_for(lambda: SweepLease.objects.filter(name="sweep").first(), what="a leader")
        runs = many(org, 400)
        wait_for(lambda: all_fired(runs), timeout=60, what="every timer to fire")
        stop(a), stop(b)
    events = fired_events(runs)
    assert sorted(e.run_id for e in events) == sorted(runs)
    assert len({e.worker for e in events}) == 1  # the leader did the work


def test_a_lost_wake_costs_at_most_one_look(org, settings):
    """The sweeper does not listen (every wake is lost): a timer written due in a moment
    still fires, at the sweeper's next look."""
    lazy = sweeper(WAYMARK_TIMERS_FAST_PATH="0", WAYMARK_SWEEP_SECONDS="2")
    with running(lazy):
        wait_for(lambda: SweepLease.objects.filter(name="sweep").first(), what="a leader")
        run_id = start(org, waits({"type": "wait", "duration": "1s"}))
        wait_for(lambda: all_fired([run_id]), timeout=30, what="the timer to fire")
        stop(lazy)
    assert Run.objects.get(pk=run_id).status == "succeeded"


def test_the_fast_path_fires_a_timer_long_before_the_next_look(org, settings):
    """Looks every 60 s; a 1 s timer written meanwhile fires long before that: the writer
    told the sleeping sweeper (NOTIFY) and it slept until the timer's instant."""
    settings.WAYMARK = {**settings.WAYMARK, "SWEEP_SECONDS": 60.0}  # the writer's horizon
    patient = sweeper(WAYMARK_SWEEP_SECONDS="60")
    with running(patient):
        wait_for(lambda: SweepLease.objects.filter(name="sweep").first(), what="a leader")
        run_id = start(org, waits({"type": "wait", "duration": "1s"}))
        wait_for(lambda: all_fired([run_id]), timeout=30, what="the timer to fire early")
        stop(patient)
    timer = Timer.objects.get(run_id=run_id)
    assert timer.fired_at is not None and timer.fired_at >= timer.due_at
