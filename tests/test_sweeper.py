"""The engine's sweeper (workflows/engine/sweeper.py) runs what apps register through the door:
tasks each tick or about once a minute, and services with threads of their own. Only the
leader works; a task that raises fails alone. Real sweepers on real threads, one real lease
row; each test waits for the event it needs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from django.db import connection
from django.db.models.functions import Now

from workflows import plugins
from workflows.engine import sweeper as sweeper_module
from workflows.engine.sweeper import Sweeper
from workflows.models import SweepLease

from .processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def running(sweeper: Sweeper) -> Iterator[threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=sweeper.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registrations a test makes are undone after it (the apps' own stay out of the way:
    they would touch the database on the sweeper's threads)."""
    monkeypatch.setattr(sweeper_module, "SWEEP_TASKS", {})
    monkeypatch.setattr(sweeper_module, "SWEEP_SERVICES", {})
    monkeypatch.setattr(plugins, "SWEEP_TASKS", sweeper_module.SWEEP_TASKS)
    monkeypatch.setattr(plugins, "SWEEP_SERVICES", sweeper_module.SWEEP_SERVICES)


def recording(calls: list[str], *, done: int = 0) -> Callable[[str], int]:
    """A task that records who called it."""

    def task(by: str) -> int:
        calls.append(by)
        return done

    return task


def test_a_task_that_raises_fails_alone_and_runs_again_at_its_next_turn(registry) -> None:
    broken: list[str] = []
    calls: list[str] = []

    def broken_task(by: str) -> int:
        broken.append(by)
        raise RuntimeError("this task is broken")

    plugins.register_sweep_task("tests.broken", broken_task, each_tick=True)
    plugins.register_sweep_task("tests.counting", recording(calls, done=1), each_tick=True)
    sweeper = Sweeper("test-sweeper", tick=0.1)
    with running(sweeper):
        wait_for(lambda: len(broken) >= 3 and len(calls) >= 3, what="three turns of both tasks")
    assert set(calls) == {"test-sweeper"}


def test_slow_tasks_run_once_a_minute_not_each_tick(registry) -> None:
    slow: list[str] = []
    quick: list[str] = []
    plugins.register_sweep_task("tests.slow", recording(slow))
    plugins.register_sweep_task("tests.quick", recording(quick), each_tick=True)
    with running(Sweeper("test-sweeper", tick=0.05)):
        wait_for(lambda: len(quick) >= 10, what="ten ticks")
    assert len(slow) == 1  # the first tick, then not before a minute has passed


class Recorder:
    """A service that records what its sweeper told it, and runs one thread."""

    def __init__(self, sweep: plugins.Sweep) -> None:
        self.sweep = sweep
        self.nudged = threading.Event()
        self.worked_while_leading = threading.Event()

    def start(self, stop: threading.Event) -> list[threading.Thread]:
        thread = threading.Thread(target=self._loop, args=(stop,), daemon=True)
        thread.start()
        return [thread]

    def nudge(self) -> None:
        self.nudged.set()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(0.01):
            if self.sweep.leading.is_set():
                self.worked_while_leading.set()


def test_a_service_starts_with_the_sweeper_and_is_nudged_when_it_takes_the_lead(registry) -> None:
    plugins.register_sweep_service("tests.recorder", Recorder)
    sweeper = Sweeper("test-sweeper", tick=0.1)
    (service,) = sweeper.services
    assert isinstance(service, Recorder)
    with running(sweeper):
        assert service.nudged.wait(30), "taking the lead did not nudge the service"
        assert service.worked_while_leading.wait(30)


def test_only_the_leader_runs_tasks_and_a_stopping_leader_hands_the_lease_on(registry) -> None:
    by: list[str] = []
    plugins.register_sweep_task("tests.who", recording(by), each_tick=True)
    first, second = Sweeper("first", tick=0.1), Sweeper("second", tick=0.1)
    with running(first):
        wait_for(lambda: "first" in by, what="the first sweeper to work")
        with running(second):
            wait_for(lambda: by.count("first") >= 10, what="ten ticks of the leader")
            assert "second" not in by  # a follower never works
            assert not second.leader
        connection.close()
    # The first, stopped last, handed its lease on (not left to lapse): nobody holds it now.
    assert not SweepLease.objects.filter(name="sweep", lease_until__gt=Now()).exists()
    with running(second):
        wait_for(lambda: "second" in by, what="the second sweeper to take over at once")
