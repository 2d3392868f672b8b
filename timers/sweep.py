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
- **One lock order, and no lost timer.** A batch wakes its timers in run id order, so it
  takes their runs' locks in the engine's one order; a sweeper's firing threads split the
  timers by run, so two of them never meet on one run. A transient database error
  (deadlock, serialization failure, lock or statement timeout, lost connection:
  ``workflows.engine.transient``) rolls the batch back and the batch is fired again; it is
  never recorded as a timer's error (a timer marked fired with it left its step waiting
  forever).
- **On time.** The sweeper sleeps until the earliest pending timer (read from the database,
  so no clock skew), at most one tick. A timer written due before that tick tells it at
  commit (NOTIFY ``waymark_timers``, the fast path); a lost notification delays a timer by
  at most one tick (the backstop).
- **Nothing else on the firing path.** A batch that fires reads the next instant in its own
  transaction; a full one is followed at once by the next. The engine's own housekeeping
  (``workflows.engine.sweep``: passed deadlines, due retries, late signals; retention and
  other apps' tasks once a minute; due scheduled starts) runs once a tick on a thread of
  its own, so it never delays a timer.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.db import connection, transaction

from workflows.plugins import SWEEP_TASKS
from workflows.plugins.engine import (
    Statement,
    Wake,
    crash_point,
    engine_setting,
    fetch_dict,
    is_transient,
    listen,
    lost_connection,
    purge_finished_runs,
    query_prepared,
    run_batch,
    sweep_once,
    wake_step,
)

from . import sql
from .recompute import move, recomputed

logger = logging.getLogger(__name__)

LEASE_NAME = "sweep"
CHANNEL = "waymark_timers"
BATCH = 500  # timers per batch (one transaction)
ORGS_PER_BATCH = 50  # organisations served per batch
ORG_SCAN = 10_000  # organisations with pending timers looked at per batch
RETENTION_EVERY_SECONDS = 60.0
BATCH_TRIES = 5  # a batch that meets a transient database error is fired again, this often


@dataclass(frozen=True)
class Batch:
    fired: int
    orgs: int
    late_seconds: list[float]
    # When the earliest timer still pending is due, on this process's monotonic clock (in
    # the past: one is due already; None: none pending, or nothing fired). Read inside the
    # batch's transaction, from the database's clock, so its own timers are not counted.
    next_due_at: float | None = None


class _FiringFailed(Exception):
    """One timer of an optimistic batch raised: the batch is rolled back and fired again,
    each timer under a savepoint of its own."""


def fire_due_timers(
    *, by: str = "sweep", batch: int = BATCH, part: int = 0, parts: int = 1
) -> Batch:
    """Fire one fair batch of due timers in one transaction; what it fired.

    Optimistic: the batch's wakes share its transaction with no savepoint between them (a
    savepoint is two round trips, the most of a timer's cost). Should one raise, the whole
    transaction is rolled back and the batch is fired again with a savepoint per timer, so
    one that fails fails alone, recorded on the timer, and the rest fire.

    A transient database error (a deadlock, a lost connection) is nobody's timer's fault:
    the batch is rolled back and fired again, up to BATCH_TRIES times, then it is raised
    (the firing thread looks again at its next look). It is never recorded on a timer.

    ``part`` of ``parts``: only the timers of that part (sql.NEXT_DUE); a sweeper's firing
    threads each serve one."""
    where = {"part": part, "parts": parts}
    for attempt in range(1, BATCH_TRIES):
        try:
            return _fire_optimistically(by=by, batch=batch, where=where)
        except Exception as exc:
            if not is_transient(exc):
                raise
            _before_trying_again(exc, attempt)
    return _fire_optimistically(by=by, batch=batch, where=where)


def _fire_optimistically(*, by: str, batch: int, where: dict[str, int]) -> Batch:
    try:
        return _fire_batch(by=by, batch=batch, where=where, alone=False)
    except _FiringFailed:
        logger.info("a timer of the batch failed to fire: firing them one by one")
    return _fire_batch(by=by, batch=batch, where=where, alone=True)


def _before_trying_again(exc: Exception, attempt: int) -> None:
    """A batch met a transient error (rolled back): a fresh connection when it was lost, and
    a short random pause, so two batches that deadlocked do not meet again in step."""
    logger.warning("a batch of timers met a transient database error (try %s), firing it "
                   "again: %s", attempt, exc)  # fmt: skip
    if lost_connection(exc):
        connection.close()
    time.sleep(random.uniform(0, 0.05 * attempt))  # noqa: S311 (jitter, not a secret)


def _fire_batch(*, by: str, batch: int, where: dict[str, int], alone: bool) -> Batch:
    # Its statements are server-side prepared (planning the due query cost more than
    # running it). The due query also reads when to look next; the closing writes go with
    # the last wake's own writes: a batch of one timer is five round trips, BEGIN and COMMIT
    # included (it was six).
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        params = {"scan": ORG_SCAN, "orgs": ORGS_PER_BATCH, "batch": batch, **where}
        due = cast(list[sql.DueTimerRow], query_prepared(cursor, sql.DUE_BATCH, params))
        if not due:
            return Batch(0, 0, [])
        next_due_at = _due_at(due[0]["next_seconds"])
        # A timer whose zone comes from the run's data, and that data changed: moved, not
        # fired at the old zone's time (recompute.py); its new instant may come first.
        moved = {t["id"] for t in due if _moved(cursor, t, by)}
        due = [t for t in due if t["id"] not in moved]
        orgs = sorted({t["org_id"] for t in due})
        if alone:
            run_batch(cursor, _closing(due, [_fire_alone(t, by) for t in due], orgs))
        else:
            closing = _closing(due, [""] * len(due), orgs)
            if not _fire_together(due, by, closing):
                run_batch(cursor, closing)
        if moved:
            next_due_at = _due_at(seconds_until_next_due(**where))
        crash_point("timers.before_batch_commit")
    late = [t["late_seconds"] for t in due]
    return Batch(len(due), len(orgs), late, next_due_at)


def _closing(due: list[sql.DueTimerRow], errors: list[str], orgs: list[int]) -> list[Statement]:
    """The batch's closing writes: its timers marked fired (with their errors, '' when
    fired) and its organisations marked served."""
    return [
        (sql.MARK_FIRED, {"ids": [t["id"] for t in due], "errors": errors}),
        (sql.MARK_SERVED, {"orgs": orgs}),
    ]


def _fire_together(due: list[sql.DueTimerRow], by: str, closing: list[Statement]) -> bool:
    """Wake every timer's step; the closing writes go with the last wake's when it woke
    one (True), else the caller sends them."""
    closed = False
    for timer in due:
        last = timer is due[-1]
        try:
            closed = _wake(timer, by, also=closing if last else ())
        except Exception as exc:
            if is_transient(exc):
                raise  # not this timer's doing: the whole batch is fired again
            raise _FiringFailed from exc
    return closed


def _fire_alone(timer: sql.DueTimerRow, by: str) -> str:
    """Fire one timer under a savepoint; its error ('' when it fired). A transient database
    error is raised instead: it is not the timer's, and the batch is fired again."""
    try:
        with transaction.atomic():  # a savepoint
            _wake(timer, by)
    except Exception as exc:
        if is_transient(exc):
            raise
        logger.exception("firing timer %s failed", timer["id"])
        return f"{type(exc).__name__}: {exc}"[:2000]
    return ""


def _wake(timer: sql.DueTimerRow, by: str, also: Sequence[Statement] = ()) -> bool:
    """Wake the timer's step: its run walks on. The step no longer waiting (cancelled, its
    run ended) is no error: the timer is spent. True: it woke, and ``also`` was sent with
    the walk's writes."""
    if timer["step_pk"] is None:
        return False  # the run ended before its step was written (a failed walk)
    wake = Wake(outcome="fired", output={"due_at": timer["due_at"].isoformat()},
                reason="timer_fired", by=by)  # fmt: skip
    return wake_step(step_pk=timer["step_pk"], wake=wake, run_id=timer["run_id"], also=also)


def _due_at(seconds: float | None) -> float | None:
    """An instant `seconds` from now (as just read from the database) on the monotonic clock."""
    return None if seconds is None else time.monotonic() + float(seconds)


def _moved(cursor: Any, timer: sql.DueTimerRow, by: str) -> bool:
    if "zone_template" not in timer["intent"]:
        return False
    new = recomputed(cursor, timer)
    if new is None or new.zone == timer["zone"]:
        return False
    return move(cursor, timer, new, why="the run's zone changed", by=by)


def seconds_until_next_due(*, part: int = 0, parts: int = 1) -> float | None:
    with connection.cursor() as cursor:
        cursor.execute(sql.NEXT_DUE, {"part": part, "parts": parts})
        row = fetch_dict(cursor)
    return None if row is None or row["seconds"] is None else float(row["seconds"])


class TellAll(threading.Event):
    """What the fast path's listener sets: every firing thread's own event (each clears its
    own, so one firer's look never swallows another's notification)."""

    def __init__(self, events: list[threading.Event]) -> None:
        super().__init__()
        self.events = events

    def set(self) -> None:
        for event in self.events:
            event.set()


class Sweeper:
    """One sweeper process (``manage.py sweep``; ``runengine`` starts one).

    Its threads, each on its own database connection:
    - the main one holds the lease (renewed every third of a tick);
    - ``firers`` firing threads (``WAYMARK_TIMER_FIRERS``), each serving one part of the
      timers (those of one part of the runs) and doing nothing else, so a timer is never
      late by another's batch, by the lease's renewal or by the housekeeping;
    - one does the housekeeping once a tick;
    - the listener for the fast path."""

    def __init__(
        self, name: str | None = None, *, tick: float | None = None, firers: int | None = None
    ) -> None:
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:sweep"
        self.tick = tick or float(engine_setting("SWEEP_SECONDS"))
        self.firers = max(1, firers or int(engine_setting("TIMER_FIRERS")))
        self.told = [threading.Event() for _ in range(self.firers)]  # per firer: look now
        self.next_purge = 0.0
        self.leader = False
        self.extra: list[Callable[[str], int]] = []  # more work per tick (scheduled starts)

    def run(self, stop: threading.Event) -> None:
        threads = [self._thread(f"sweep-firer-{part}", self._fire_loop, part, stop)
                   for part in range(self.firers)]  # fmt: skip
        threads.append(self._thread("sweep-housekeeping", self._housekeeping_loop, stop))
        if engine_setting("TIMERS_FAST_PATH"):  # a NOTIFY: a timer due soon was written
            self._thread("timers-listener", listen, CHANNEL, TellAll(self.told), stop).start()
        for thread in threads:
            thread.start()
        try:
            while not stop.is_set():
                self._lead()
                stop.wait(self.tick / 3)
        finally:
            self._tell_all()  # stopping cuts a firer's sleep short (it may be a tick long)
            for thread in threads:
                thread.join(timeout=self.tick * 3)
            self._resign()
            connection.close()

    @staticmethod
    def _thread(name: str, target: Callable[..., None], *args: object) -> threading.Thread:
        return threading.Thread(target=target, args=args, name=name, daemon=True)

    def _lead(self) -> None:
        """Take or renew the lease (three ticks long, renewed every third of one)."""
        try:
            leads = self._take_lease()
        except Exception:
            logger.exception("sweep could not take its lease; retrying")
            connection.close()
            leads = False
        took_over = leads and not self.leader
        self.leader = leads
        if took_over:
            self._tell_all()  # begin at once, not at the firers' next look

    def _tell_all(self) -> None:
        for told in self.told:
            told.set()

    def _fire_loop(self, part: int, stop: threading.Event) -> None:
        told = self.told[part]
        try:
            while not stop.is_set():
                told.clear()
                wake_at = self._fire_part(part)
                told.wait(max(0.0, wake_at - time.monotonic()))  # a NOTIFY cuts it short
        finally:
            connection.close()

    def _fire_part(self, part: int) -> float:
        """Fire what is due in one part; when to look again (monotonic clock): at its next
        timer's instant, at most one tick from now."""
        if not self.leader:
            return time.monotonic() + self.tick
        try:
            fired, due_at = self._fire_backlog(part)
            if fired:
                logger.info("sweep: %s timer(s) fired", fired)
        except Exception:
            logger.exception("sweep failed; retrying")
            connection.close()
            return time.monotonic() + self.tick
        latest = time.monotonic() + self.tick
        return latest if due_at is None else min(latest, due_at)

    def _fire_backlog(self, part: int) -> tuple[int, float | None]:
        """Batch after batch (each its own transaction) while timers of the part are due,
        for at most one tick (then the leadership is looked at again). Returns how many fired
        and when the next is due (monotonic clock; None: nothing pending)."""
        fired, until = 0, time.monotonic() + self.tick
        while self.leader:
            batch = fire_due_timers(by=self.name, part=part, parts=self.firers)
            fired += batch.fired
            if not batch.fired:  # nothing was due: ask when something will be
                return fired, _due_at(seconds_until_next_due(part=part, parts=self.firers))
            due_at = batch.next_due_at
            now = time.monotonic()
            if due_at is None or due_at > now or now >= until:
                return fired, due_at
        return fired, None

    def _housekeeping_loop(self, stop: threading.Event) -> None:
        try:
            while not stop.wait(self.tick):
                if not self.leader:
                    continue
                try:
                    self._housekeeping()
                except Exception:
                    logger.exception("sweep housekeeping failed; retrying")
                    connection.close()
        finally:
            connection.close()

    def _housekeeping(self) -> None:
        counts = sweep_once(name=self.name)
        if counts.deadlines or counts.retries or counts.signals:
            logger.info("sweep: %s deadline(s) fired, %s retr(ies) due, %s late signal(s)",
                        counts.deadlines, counts.retries, counts.signals)  # fmt: skip
        for task in self.extra:
            task(self.name)
        now = time.monotonic()
        if now >= self.next_purge:
            self.next_purge = now + RETENTION_EVERY_SECONDS
            purged = purge_finished_runs()
            if purged:
                logger.info("sweep: %s finished run(s) past retention deleted", purged)
            for name, task in SWEEP_TASKS.items():  # other apps' housekeeping
                if done := task(self.name):
                    logger.info("sweep: %s: %s", name, done)

    def _take_lease(self) -> bool:
        params: dict[str, Any] = {"name": LEASE_NAME, "holder": self.name, "lease": 3 * self.tick}
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


def run_sweeper(stop: threading.Event) -> None:
    from .schedules import fire_due_schedules

    sweeper = Sweeper()
    sweeper.extra.append(fire_due_schedules)
    sweeper.run(stop)
