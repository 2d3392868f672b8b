"""The due firing: fires due timers fairly and on time, in the elected sweeper.

- **Election.** It is a service of the engine's sweeper (``workflows.engine.sweeper``): it
  fires only while its sweeper holds the lease. Even two sweepers at once could not fire a
  timer twice: a batch locks its timers FOR UPDATE SKIP LOCKED, and firing marks them in the
  same transaction.
- **Fair batches** (``sql.DUE_BATCH``): the least recently served organisations with due
  timers, an equal share each, read from each one's own index range.
- **Exactly once.** One batch is one transaction: waking each timer's step and walking its
  run on (``waits.wake_steps_together``: every run locked and step woken in one round trip,
  every walk's writes in another; ``waits.wake_step`` one by one when two timers share a
  run) commit together with the timers marked fired. A sweeper killed mid-batch rolls the
  whole batch back; the next one fires it.
- **One lock order, and no lost timer.** A batch wakes its timers in run id order, so it
  takes their runs' locks in the engine's one order; a sweeper's firing threads split the
  timers by run, so two of them never meet on one run. A transient database error
  (deadlock, serialization failure, lock or statement timeout, lost connection:
  ``workflows.engine.transient``) rolls the batch back and the batch is fired again; it is
  never recorded as a timer's error (a timer marked fired with it left its step waiting
  forever).
- **On time.** A firing thread sleeps until the earliest pending timer (read from the database,
  so no clock skew), at most one tick. A timer written due before that tick tells it at
  commit (NOTIFY ``waymark_timers``, the fast path); a lost notification delays a timer by
  at most one tick (the backstop).
- **Nothing else on the firing path.** A batch that fires reads the next instant in its own
  transaction; a full one is followed at once by the next. The sweeper's housekeeping
  (passed deadlines, due retries, late signals, scheduled starts, retention) runs on a
  thread of its own, so it never delays a timer.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.db import connection, transaction

from workflows.plugins import Sweep
from workflows.plugins.engine import (
    Outage,
    Statement,
    Wake,
    crash_point,
    engine_setting,
    fail_waiting_step,
    fetch_dict,
    is_transient,
    listen,
    lost_connection,
    query_prepared,
    run_batch,
    wake_step,
    wake_steps_together,
)

from . import metrics, sql
from .recompute import move, recomputed
from .schedules import MAX_ERROR_CHARS

logger = logging.getLogger(__name__)

CHANNEL = "waymark_timers"
BATCH = 500  # timers per batch (one transaction)
ORGS_PER_BATCH = 50  # organisations served per batch
ORG_SCAN = 10_000  # organisations with pending timers looked at per batch
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
    started = time.perf_counter()
    fired = _fire_trying_again(by=by, batch=batch, where={"part": part, "parts": parts})
    metrics.batch_fired(fired.late_seconds, time.perf_counter() - started)
    return fired


def _fire_trying_again(*, by: str, batch: int, where: dict[str, int]) -> Batch:
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
        crash_point("timers.after_claim")  # the batch's timers locked, none fired yet
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
    one (True), else the caller sends them. The batch's steps of distinct runs wake
    together (waits.wake_steps_together: their runs locked and steps woken in one round
    trip); otherwise each wakes in turn."""
    try:
        # (A timer with no step: its run ended before its step was written, a failed walk.)
        waking = [(t, t["step_pk"]) for t in due if t["step_pk"] is not None]
        last = bool(waking) and waking[-1][0] is due[-1]
        woke = wake_steps_together(
            [(step_pk, t["run_id"], _wake_of(t, by)) for t, step_pk in waking],
            also=closing if last else (),
        )
        if woke is not None:
            return last and woke[-1]
        closed = False
        for timer in due:
            closed = _wake(timer, by, also=closing if timer is due[-1] else ())
        return closed
    except Exception as exc:
        if is_transient(exc):
            raise  # not this timer's doing: the whole batch is fired again
        raise _FiringFailed from exc


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
        error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
        _fail_its_step(timer, by, error)
        return error
    return ""


def _fail_its_step(timer: sql.DueTimerRow, by: str, error: str) -> None:
    """A timer that cannot wake its step fails the step for good (the run follows its
    failure path, where an operator sees why and can retry): the timer is spent, and a step
    left waiting on it would wait for ever. Should that raise too, the step stays waiting
    and doctor lists it (a timer fired with an error)."""
    if timer["step_pk"] is None:
        return
    try:
        with transaction.atomic():  # a savepoint of its own
            fail_waiting_step(step_pk=timer["step_pk"], run_id=timer["run_id"], by=by,
                              error=f"wake_failed: its timer could not fire: {error}")  # fmt: skip
    except Exception as exc:
        if is_transient(exc):
            raise
        logger.exception("failing the step of timer %s, which could not fire, failed",
                         timer["id"])  # fmt: skip


def _wake(timer: sql.DueTimerRow, by: str, also: Sequence[Statement] = ()) -> bool:
    """Wake the timer's step: its run walks on. The step no longer waiting (cancelled, its
    run ended) is no error: the timer is spent. True: it woke, and ``also`` was sent with
    the walk's writes."""
    if timer["step_pk"] is None:
        return False  # the run ended before its step was written (a failed walk)
    return wake_step(step_pk=timer["step_pk"], wake=_wake_of(timer, by), run_id=timer["run_id"],
                     also=also)  # fmt: skip


def _wake_of(timer: sql.DueTimerRow, by: str) -> Wake:
    return Wake(outcome="fired", output={"due_at": timer["due_at"].isoformat()},
                reason="timer_fired", by=by)  # fmt: skip


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


class TimerFiring:
    """The due firing, a service of the engine's sweeper (``workflows.engine.sweeper``, which
    holds the election): ``firers`` firing threads (``WAYMARK_TIMER_FIRERS``), each serving
    one part of the timers (those of one part of the runs) and doing nothing else, so a timer
    is never late by another's batch, by the lease's renewal or by the housekeeping; and the
    listener for the fast path. Each thread has its own database connection."""

    def __init__(self, sweep: Sweep, *, firers: int | None = None) -> None:
        self.sweep = sweep
        self.firers = max(1, firers or int(engine_setting("TIMER_FIRERS")))
        self.told = [threading.Event() for _ in range(self.firers)]  # per firer: look now
        # A database outage: one warning when it goes, one when it is back (all parts share).
        self.outage = Outage("timers", logger)

    @property
    def name(self) -> str:
        return self.sweep.name

    @property
    def tick(self) -> float:
        return self.sweep.tick

    def start(self, stop: threading.Event) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self._fire_loop, args=(part, stop), daemon=True,
                             name=f"sweep-firer-{part}")
            for part in range(self.firers)
        ]  # fmt: skip
        if engine_setting("TIMERS_FAST_PATH"):  # a NOTIFY: a timer due soon was written
            threading.Thread(target=listen, args=(CHANNEL, TellAll(self.told), stop),
                             name="timers-listener", daemon=True).start()  # fmt: skip
        for thread in threads:
            thread.start()
        return threads

    def nudge(self) -> None:
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
        if not self.sweep.leading.is_set():
            return time.monotonic() + self.tick
        try:
            fired, due_at = self._fire_backlog(part)
            if fired:
                logger.info("sweep: %s timer(s) fired", fired)
        except Exception as exc:
            self.outage.failed(exc)  # the next look is the next try
            connection.close()
            return time.monotonic() + self.tick
        self.outage.ok()
        latest = time.monotonic() + self.tick
        return latest if due_at is None else min(latest, due_at)

    def _fire_backlog(self, part: int) -> tuple[int, float | None]:
        """Batch after batch (each its own transaction) while timers of the part are due,
        for at most one tick (then the leadership is looked at again). Returns how many fired
        and when the next is due (monotonic clock; None: nothing pending)."""
        fired, until = 0, time.monotonic() + self.tick
        while self.sweep.leading.is_set():
            batch = fire_due_timers(by=self.name, part=part, parts=self.firers)
            fired += batch.fired
            if not batch.fired:  # nothing was due: ask when something will be
                return fired, _due_at(seconds_until_next_due(part=part, parts=self.firers))
            due_at = batch.next_due_at
            now = time.monotonic()
            if due_at is None or due_at > now or now >= until:
                return fired, due_at
        return fired, None
