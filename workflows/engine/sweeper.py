"""The sweeper: the engine's elected housekeeper (``manage.py sweep``; ``runengine`` starts one).

- **Election.** Any number of sweepers may run; the one holding the ``workflows_sweeplease``
  row (three ticks long, renewed every third of one) leads, and only the leader works. A dead
  holder's lease lapses and another takes over; a stopping one hands it on at once.
- **The engine's own housekeeping**, once a tick on a thread of its own (``sweep.sweep_once``:
  passed deadlines, due retries, late signals), then the tasks apps registered to run each
  tick (timers' scheduled starts), and about once a minute the rest (retention, the apps'
  slower tasks).
- **Services** apps registered (timers' due firing): work that needs threads of its own,
  started with the sweeper, doing work only while it leads (``Sweep.leading``), told to look
  at once when it takes the lead and when it stops.

Apps register both through the door (``workflows.plugins.register_sweep_task`` and
``register_sweep_service``); the engine knows none of them by name. A task that raises is
logged and tried again at its next turn; it never stops the others.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.db import connection

from . import metrics, sql
from .lanes import engine_setting
from .signals import LateMatching
from .sweep import sweep_once
from .transient import Outage, is_transient

logger = logging.getLogger(__name__)

LEASE_NAME = "sweep"
ENGINE_SWEEP = "workflows.sweep"  # the engine's own housekeeping, as its duration is labelled
SLOW_TASKS_EVERY_SECONDS = 60.0


@dataclass(frozen=True)
class SweepTask:
    """``run(by)`` returns how many things it did (for the log). ``each_tick``: every tick
    (a few seconds), else about once a minute."""

    run: Callable[[str], int]
    each_tick: bool = False


@dataclass
class Sweep:
    """What a service sees of the sweeper that runs it."""

    name: str
    tick: float
    leading: threading.Event = field(default_factory=threading.Event)  # set while it leads


class SweepService(Protocol):
    """Work with threads of its own in the elected sweeper (timers' firing threads)."""

    def start(self, stop: threading.Event) -> list[threading.Thread]:
        """Start its threads; the sweeper joins those returned when it stops."""
        ...

    def nudge(self) -> None:
        """Look now: the sweeper has just taken the lead, or is stopping."""
        ...


# What apps registered (workflows.plugins): name -> task, name -> service factory.
SWEEP_TASKS: dict[str, SweepTask] = {}
SWEEP_SERVICES: dict[str, Callable[[Sweep], SweepService]] = {}


class Sweeper:
    """One sweeper process. Its threads, each on its own database connection: the main one
    holds the lease; one does the housekeeping once a tick; the services' own."""

    def __init__(self, name: str | None = None, *, tick: float | None = None) -> None:
        self.sweep = Sweep(
            name=name or f"{socket.gethostname()}:{os.getpid()}:sweep",
            tick=tick or float(engine_setting("SWEEP_SECONDS")),
        )
        self.services = [make(self.sweep) for make in SWEEP_SERVICES.values()]
        self.next_slow = 0.0
        self.late = LateMatching()  # its incremental late matching: a full pass first
        # A database outage: one warning per loop when it goes, one when it is back.
        self.lease_outage = Outage(f"sweeper {self.name}: lease", logger)
        self.housekeeping_outage = Outage(f"sweeper {self.name}: housekeeping", logger)

    @property
    def name(self) -> str:
        return self.sweep.name

    @property
    def leader(self) -> bool:
        return self.sweep.leading.is_set()

    def run(self, stop: threading.Event) -> None:
        housekeeping = threading.Thread(target=self._housekeeping_loop, args=(stop,),
                                        name="sweep-housekeeping", daemon=True)  # fmt: skip
        housekeeping.start()
        threads = [housekeeping]
        for service in self.services:
            threads.extend(service.start(stop))
        try:
            while not stop.is_set():
                self._lead()
                stop.wait(self.sweep.tick / 3)
        finally:
            self._nudge_all()  # stopping cuts a service's sleep short (it may be a tick long)
            for thread in threads:
                thread.join(timeout=self.sweep.tick * 3)
            self._resign()
            connection.close()

    def _lead(self) -> None:
        """Take or renew the lease."""
        try:
            leads = self._take_lease()
            self.lease_outage.ok()
        except Exception as exc:
            # Follows until it holds the lease again (the tick is the pause between tries).
            self.lease_outage.failed(exc)
            connection.close()
            leads = False
        took_over = leads and not self.leader
        if leads:
            self.sweep.leading.set()
        else:
            self.sweep.leading.clear()
        if took_over:
            self._nudge_all()  # begin at once, not at the services' next look

    def _nudge_all(self) -> None:
        for service in self.services:
            service.nudge()

    def _housekeeping_loop(self, stop: threading.Event) -> None:
        try:
            while not stop.wait(self.sweep.tick):
                if self.leader:
                    self._housekeeping()
        finally:
            connection.close()

    def _housekeeping(self) -> None:
        """The engine's sweep, then the apps' tasks: each fails alone, and each is timed
        (metrics.SWEEP_DURATION, by its name)."""
        outage = self.housekeeping_outage
        with metrics.sweep_timed(ENGINE_SWEEP):
            _logged("the engine's sweep", outage, self._engine_sweep)
        slow = time.monotonic() >= self.next_slow
        if slow:
            self.next_slow = time.monotonic() + SLOW_TASKS_EVERY_SECONDS
        for name, task in list(SWEEP_TASKS.items()):
            if task.each_tick or slow:
                with metrics.sweep_timed(name):
                    _logged(name, outage, task.run, self.name)

    def _engine_sweep(self) -> None:
        counts = sweep_once(name=self.name, late=self.late)
        if counts.deadlines or counts.retries or counts.signals:
            logger.info("sweep: %s deadline(s) fired, %s retr(ies) due, %s late signal(s)",
                        counts.deadlines, counts.retries, counts.signals)  # fmt: skip

    def _take_lease(self) -> bool:
        params: dict[str, Any] = {
            "name": LEASE_NAME, "holder": self.name, "lease": 3 * self.sweep.tick,
        }  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute(sql.TAKE_LEASE, params)
            held = cursor.fetchone() is not None
        if held != self.leader:
            logger.info("sweeper %s %s the sweep", self.name, "leads" if held else "follows")
        return held

    def _resign(self) -> None:
        """Stopping: hand the lease on at once instead of letting it lapse."""
        if not self.leader:
            return
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql.RELEASE_LEASE, {"name": LEASE_NAME, "holder": self.name})
        except Exception:
            logger.warning("sweeper %s could not hand its lease on", self.name, exc_info=True)


def _logged(name: str, outage: Outage, task: Callable[..., Any], *args: Any) -> None:
    """Run one piece of housekeeping; a count it returns is logged, an error is logged (a
    database outage once, through ``outage``) and its connection dropped (it may be the
    cause), and the next piece runs regardless."""
    try:
        done = task(*args)
    except Exception as exc:
        if is_transient(exc):
            outage.failed(exc)
        else:
            logger.exception("sweep: %s failed; it runs again at its next turn", name)
        connection.close()
        return
    outage.ok()
    if done:
        logger.info("sweep: %s: %s", name, done)


def run_sweeper(stop: threading.Event) -> None:
    Sweeper().run(stop)
