"""The due sweep: fires due timers fairly, on time, by one elected sweeper.

- **Election.** Any number of sweepers may run; the one holding the ``timers_sweeplease``
  row (renewed every tick, ``lease = 3 ticks``) does the work. A dead holder's lease lapses
  and another takes over. Even two at once could not fire a timer twice: a batch locks its
  timers FOR UPDATE SKIP LOCKED, and firing marks them in the same transaction.
- **Fair batches** (``sql.DUE_BATCH``): the least recently served organisations with due
  timers, an equal share each, read from each one's own index range.
- **Exactly once.** One batch is one transaction: waking each timer's step and walking its
  run on (``waits.wake_step``) commit together with the timers marked fired. A sweeper
  killed mid-batch rolls the whole batch back; the next one fires it.
- **On time.** The sweeper sleeps until the earliest pending timer (read from the database,
  so no clock skew), at most one tick. A timer written due before that tick tells it at
  commit (NOTIFY ``waymark_timers``, the fast path); a lost notification delays a timer by
  at most one tick (the backstop).
- Each tick also runs the engine's own housekeeping (``workflows.engine.sweep``): passed
  deadlines, due retries, and retention once a minute; and due scheduled starts.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from workflows.engine.faults import crash_point
from workflows.engine.lanes import engine_setting
from workflows.engine.retention import purge_finished_runs
from workflows.engine.sql.rows import fetch_dict, fetch_dicts
from workflows.engine.sweep import sweep_once
from workflows.engine.transport import listen
from workflows.engine.waits import Wake, wake_step
from workflows.plugins import SWEEP_TASKS

from . import sql
from .recompute import move, recomputed

logger = logging.getLogger(__name__)

LEASE_NAME = "sweep"
CHANNEL = "waymark_timers"
BATCH = 500  # timers per batch (one transaction)
ORGS_PER_BATCH = 50  # organisations served per batch
ORG_SCAN = 10_000  # organisations with pending timers looked at per batch
RETENTION_EVERY_SECONDS = 60.0


@dataclass(frozen=True)
class Batch:
    fired: int
    orgs: int
    late_seconds: list[float]


def fire_due_timers(*, by: str = "sweep", batch: int = BATCH) -> Batch:
    """Fire one fair batch of due timers in one transaction; what it fired."""
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        params = {"scan": ORG_SCAN, "orgs": ORGS_PER_BATCH, "batch": batch}
        cursor.execute(sql.DUE_BATCH, params)
        due = fetch_dicts(cursor)
        if not due:
            return Batch(0, 0, [])
        # A timer whose zone comes from the run's data, and that data changed: moved, not
        # fired at the old zone's time (recompute.py).
        moved = {t["id"] for t in due if _moved(cursor, t, by)}
        due = [t for t in due if t["id"] not in moved]
        errors = [_fire(cursor, timer, by) for timer in due]
        crash_point("timers.before_batch_commit")
        cursor.execute(sql.MARK_FIRED, {"ids": [t["id"] for t in due], "errors": errors})
        orgs = sorted({t["org_id"] for t in due})
        cursor.execute(sql.MARK_SERVED, {"orgs": orgs})
    return Batch(len(due), len(orgs), [t["late_seconds"] for t in due])


def _moved(cursor: Any, timer: dict[str, Any], by: str) -> bool:
    if "zone_template" not in timer["intent"]:
        return False
    new = recomputed(cursor, timer)
    if new is None or new.zone == timer["zone"]:
        return False
    return move(cursor, timer, new, why="the run's zone changed", by=by)


def _fire(cursor: Any, timer: dict[str, Any], by: str) -> str:
    """Wake the timer's step (its run walks on), under a savepoint: one timer that fails
    fails alone, recorded on the timer, and the batch goes on. Returns the error, or ''."""
    if timer["step_pk"] is None:
        return ""  # the run ended before its step was written (a failed walk): nothing waits
    wake = Wake(outcome="fired", output={"due_at": timer["due_at"].isoformat()},
                reason="timer_fired", by=by)  # fmt: skip
    try:
        with transaction.atomic():  # a savepoint
            # False: the step no longer waits (cancelled, its run ended): the timer is spent.
            wake_step(step_pk=timer["step_pk"], wake=wake)
    except Exception as exc:
        logger.exception("firing timer %s failed", timer["id"])
        return f"{type(exc).__name__}: {exc}"[:2000]
    return ""


def seconds_until_next_due() -> float | None:
    with connection.cursor() as cursor:
        cursor.execute(sql.NEXT_DUE)
        row = fetch_dict(cursor)
    return None if row is None or row["seconds"] is None else float(row["seconds"])


class Sweeper:
    """One sweeper process's loop (``manage.py sweep``; ``runengine`` starts one)."""

    def __init__(self, name: str | None = None, *, tick: float | None = None) -> None:
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:sweep"
        self.tick = tick or float(engine_setting("SWEEP_SECONDS"))
        self.told = threading.Event()  # a timer due soon was written (NOTIFY)
        self.next_housekeeping = 0.0
        self.next_purge = 0.0
        self.leader = False
        self.renewed_at = 0.0  # monotonic time of the last renewal of the lease
        self.extra: list[Callable[[str], int]] = []  # more work per tick (scheduled starts)

    def run(self, stop: threading.Event) -> None:
        # Stopping cuts a sleep short too (it may be a whole tick long).
        threading.Thread(target=self._wake_on, args=(stop,), daemon=True).start()
        if engine_setting("TIMERS_FAST_PATH"):
            listener = threading.Thread(target=listen, args=(CHANNEL, self.told, stop),
                                        name="timers-listener", daemon=True)  # fmt: skip
            listener.start()
        try:
            while not stop.is_set():
                self.told.clear()
                wait = self._tick()
                self.told.wait(wait)  # a NOTIFY cuts the sleep short
        finally:
            self._resign()
            connection.close()

    def _wake_on(self, stop: threading.Event) -> None:
        stop.wait()
        self.told.set()

    def _tick(self) -> float:
        """One tick; how long to sleep before the next."""
        try:
            self.leader = self._take_lease()
            if not self.leader:
                return self.tick
            fired = self._fire_backlog()
            if fired:
                logger.info("sweep: %s timer(s) fired", fired)
            self._housekeeping()
            due = seconds_until_next_due()
        except Exception:
            logger.exception("sweep failed; retrying")
            connection.close()
            return self.tick
        return self.tick if due is None else max(0.0, min(self.tick, due))

    def _fire_backlog(self) -> int:
        """Batch after batch (each its own transaction) while there is due work, for at most
        one tick: then housekeeping and the lease's renewal come first."""
        fired, until = 0, time.monotonic() + self.tick
        while (batch := fire_due_timers(by=self.name)).fired and time.monotonic() < until:
            fired += batch.fired
        return fired + batch.fired

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now < self.next_housekeeping:
            return
        self.next_housekeeping = now + self.tick
        counts = sweep_once(name=self.name)
        if counts.deadlines or counts.retries or counts.signals:
            logger.info("sweep: %s deadline(s) fired, %s retr(ies) due, %s late signal(s)",
                        counts.deadlines, counts.retries, counts.signals)  # fmt: skip
        for task in self.extra:
            task(self.name)
        if now >= self.next_purge:
            self.next_purge = now + RETENTION_EVERY_SECONDS
            purged = purge_finished_runs()
            if purged:
                logger.info("sweep: %s finished run(s) past retention deleted", purged)
            for name, task in SWEEP_TASKS.items():  # other apps' housekeeping
                if done := task(self.name):
                    logger.info("sweep: %s: %s", name, done)

    def _take_lease(self) -> bool:
        """Take or renew the lease (3 ticks long); a leader renews at most every third of a
        tick, so waking for a timer costs no extra round trip."""
        now = time.monotonic()
        if self.leader and now < self.renewed_at + self.tick / 3:
            return True
        params: dict[str, Any] = {"name": LEASE_NAME, "holder": self.name, "lease": 3 * self.tick}
        with connection.cursor() as cursor:
            cursor.execute(sql.TAKE_LEASE, params)
            held = cursor.fetchone() is not None
        self.renewed_at = now if held else 0.0
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


def run_sweeper(stop: threading.Event) -> None:
    from .schedules import fire_due_schedules

    sweeper = Sweeper()
    sweeper.extra.append(fire_due_schedules)
    sweeper.run(stop)
