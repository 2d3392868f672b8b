"""Timers that race: many timers of one run due together, fired by two firing threads of
two real sweeper processes. Every timer fires once, none records an error, every run moves
on to its end. Nothing here waits for a time: each check waits for the database to show
the event, within a generous bound."""

from __future__ import annotations

import subprocess
from contextlib import suppress

import pytest
from django.db import connection, transaction
from django.db.models import Count
from django.db.models.functions import Now

from timers.models import Timer
from workflows.models import Organisation, Run, RunEvent, SweepLease

from .factories import OrganisationFactory
from .processes import running, spawn, stop, wait_for
from .test_timers import start

pytestmark = pytest.mark.django_db(transaction=True)

FAR = "2100-01-01T00:00:00+00:00"  # brought to now by the test, all in one statement
BRANCHES = 100  # wait_until branches per run: each run's timers all due at one instant
RUNS = 60
SMALL_RUNS = 20  # another organisation's single waits, due at the same instant
BOUND = 600.0  # seconds: generous for a loaded 2-core machine, never reached when it works


def fan_out(branches: int) -> dict:
    """A run that forks ``branches`` wait_until steps and joins them all."""
    waits = [f"w{i}" for i in range(branches)]
    return {
        "start": "fan",
        "steps": [
            {"id": "fan", "type": "parallel", "branches": waits, "next": "join"},
            *(wait_until(w) for w in waits),
            {"id": "join", "type": "join", "wait_for": waits, "next": "done"},
            {"id": "done", "type": "end"},
        ],
    }


def wait_until(step_id: str) -> dict:
    return {"id": step_id, "type": "wait_until", "at": "{{ input.at }}", "next": "join"}


def single_wait() -> dict:
    return {
        "start": "pause",
        "steps": [
            {"id": "pause", "type": "wait_until", "at": "{{ input.at }}", "next": "done"},
            {"id": "done", "type": "end"},
        ],
    }


def sweeper() -> subprocess.Popen[bytes]:
    return spawn("sweep", WAYMARK_SWEEP_SECONDS="0.3", WAYMARK_TIMER_FIRERS="2")


def spent(run_ids: list[int]) -> bool:
    """Every timer fired; fails at once when one recorded an error (a deadlock recorded as
    a timer's result leaves its step waiting forever: no use waiting for the run)."""
    timers = Timer.objects.filter(run_id__in=run_ids)
    errors = list(timers.exclude(error="").values_list("error", flat=True)[:3])
    assert errors == [], errors  # a transient error is retried, never a timer's result
    return not timers.filter(fired_at__isnull=True).exists()


def ended(run_ids: list[int]) -> bool:
    return not Run.objects.filter(pk__in=run_ids, status="running").exists()


def make_due_interleaved(big: list[int], small: list[int]) -> None:
    """Every timer due at one instant (one transaction's now()), its row rewritten in an
    order that interleaves the runs: branch by branch, each branch's timers in run order for
    one half of the timer ids and in the reverse run order for the other. A batch reads
    timers due at the same instant in their rows' order, which in a live database follows
    whatever wrote them last; this is one such order, the one where two firers that split
    the work by timer id take the same runs' locks in opposite orders."""
    rank = {run_id: n for n, run_id in enumerate(big)}
    rows = Timer.objects.filter(run_id__in=big).values_list("id", "run_id", "step_id")

    def key(row: tuple[int, int, str]) -> tuple[int, int]:
        timer_id, run_id, step_id = row
        return int(step_id[1:]), rank[run_id] if timer_id % 2 else -rank[run_id]

    order = [row[0] for row in sorted(rows, key=key)]
    order += list(Timer.objects.filter(run_id__in=small).values_list("id", flat=True))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany("UPDATE timers_timer SET due_at = now() WHERE id = %s",
                           [(timer_id,) for timer_id in order])  # fmt: skip


def test_many_timers_of_one_run_due_together_fire_once_each_and_every_run_ends(org, settings):
    # Each start walks its whole fan-out in its own transaction (no continuation for an io
    # worker to finish later): every timer exists before they are all made due.
    settings.WAYMARK = {**settings.WAYMARK, "WALK_INLINE_STEPS": 1000, "WALK_INLINE_MS": 60_000}
    small_org: Organisation = OrganisationFactory.create()
    big = [start(org, fan_out(BRANCHES), key=f"big{i}", run_input={"at": FAR})
           for i in range(RUNS)]  # fmt: skip
    small = [start(small_org, single_wait(), key=f"small{i}", run_input={"at": FAR})
             for i in range(SMALL_RUNS)]  # fmt: skip
    runs = big + small
    assert Timer.objects.filter(run_id__in=runs).count() == RUNS * BRANCHES + SMALL_RUNS
    a, b = sweeper(), sweeper()
    with running(a, b):
        wait_for(lambda: SweepLease.objects.filter(name="sweep").first(), what="a leader")
        make_due_interleaved(big, small)
        wait_for(lambda: spent(runs), timeout=BOUND, what="every timer to fire")
        wait_for(lambda: ended(runs), timeout=BOUND, what="every run to end")
        stop(a), stop(b)
    statuses = set(Run.objects.filter(pk__in=runs).values_list("status", flat=True))
    assert statuses == {"succeeded"}
    fired = (RunEvent.objects.filter(run_id__in=runs, kind="step.timer_fired")
             .values("run_id").annotate(n=Count("id")))  # fmt: skip
    per_run = {row["run_id"]: row["n"] for row in fired}
    assert per_run == {**dict.fromkeys(big, BRANCHES), **dict.fromkeys(small, 1)}  # each once


def test_a_timer_and_a_cancel_that_race_agree_on_which_won(org):
    """Runs cancelled (by two threads) while a real sweeper with two firing threads fires
    their due timers: each run ends exactly one way, and its timer says the same. Cancelled:
    the timer is cancelled, never fired, and the step never woke. Succeeded: the timer
    fired once. No cancel fails, no timer records an error."""
    import threading

    from tests.factories import timer_sweeper
    from workflows.errors import RunStateConflict
    from workflows.services.control import run_act

    runs = [start(org, single_wait(), key=f"r{i}", run_input={"at": FAR}) for i in range(200)]
    failures: list[BaseException] = []

    def cancel_all(run_ids: list[int]) -> None:
        try:
            for run_id in run_ids:
                with suppress(RunStateConflict):  # its timer won: the run had succeeded
                    run_act(org=org, run_id=run_id, action="cancel", actor="test")
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    stop_sweeper = threading.Event()
    sweeper = timer_sweeper("race-sweeper", tick=0.2, firers=2)
    sweeping = threading.Thread(target=sweeper.run, args=(stop_sweeper,), daemon=True)
    cancellers = [threading.Thread(target=cancel_all, args=(runs[i::2],)) for i in range(2)]
    sweeping.start()
    try:
        wait_for(lambda: sweeper.leader, timeout=60, what="the sweeper to lead")
        Timer.objects.filter(run_id__in=runs).update(due_at=Now())
        for canceller in cancellers:
            canceller.start()
        for canceller in cancellers:
            canceller.join(timeout=BOUND)
        assert failures == []
        settled = Timer.objects.filter(run_id__in=runs, fired_at__isnull=True,
                                       cancelled_at__isnull=True)  # fmt: skip
        wait_for(lambda: not settled.exists(), timeout=BOUND, what="every timer to settle")
    finally:
        stop_sweeper.set()
        sweeping.join(timeout=30)
    assert not sweeping.is_alive()
    outcomes = {run_id: status for run_id, status in Run.objects.filter(pk__in=runs)
                .values_list("id", "status")}  # fmt: skip
    timers = {t.run_id: t for t in Timer.objects.filter(run_id__in=runs)}
    woken = set(RunEvent.objects.filter(run_id__in=runs, kind="step.timer_fired")
                .values_list("run_id", flat=True))  # fmt: skip
    assert set(outcomes.values()) <= {"succeeded", "cancelled"}
    for run_id, status in outcomes.items():
        timer = timers[run_id]
        assert timer.error == ""
        if status == "cancelled":
            assert (timer.fired_at, run_id in woken) == (None, False), run_id
            assert timer.cancelled_at is not None, run_id
        else:
            assert (timer.cancelled_at, run_id in woken) == (None, True), run_id
            assert timer.fired_at is not None, run_id
