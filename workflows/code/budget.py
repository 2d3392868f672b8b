"""The time budget of a code workflow's own code in one ``decide`` turn: the replay from the
top up to the next call with no recorded result (a ``ctx.run`` function's own run is not
counted: it runs after the replay stopped, on a worker only, under the lane's step timeout).

A turn may run inline in a worker's settle, holding the run's lock (engine/walk.py), or on a
worker: either way a function that loops must not hold the run, or the worker's thread, for
good. A turn past ``WAYMARK_CODE_TURN_MS`` is interrupted: one watchdog thread per process
raises ``OverBudget`` in the turn's thread (CPython's asynchronous exception, delivered
between two bytecodes), again every REFIRE_SECONDS while the turn goes on (a workflow that
catches BaseException), and ``within`` turns it into ``TurnOverBudget``. A turn blocked in
a C call (I/O outside ``ctx.run``, which is where I/O belongs) is interrupted once the call
returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from ..engine.lanes import engine_setting

T = TypeVar("T")

REFIRE_SECONDS = 0.05


class OverBudget(BaseException):
    """Raised asynchronously into a turn past its budget. A BaseException, as the replay's
    own stops (context.Stop): a workflow's ``except Exception`` cannot swallow it."""


class TurnOverBudget(Exception):
    """A turn ran past its budget (code ``code_turn_budget_exceeded``)."""

    code = "code_turn_budget_exceeded"

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"{self.code}: the workflow's code ran past {seconds * 1000:.0f} ms between two "
            "steps (WAYMARK_CODE_TURN_MS); do slow work in ctx.run"
        )


def turn_budget_seconds() -> float:
    return float(engine_setting("CODE_TURN_MS")) / 1000


_current = threading.local()  # this thread's guard (_Guard), made at its first turn


def within(seconds: float, turn: Callable[[], T]) -> T:
    """``turn()`` in this thread, for at most ``seconds`` (not counting what runs in
    ``outside_budget``); past them, ``TurnOverBudget``. What ``turn`` raises goes through.

    A function, not a context manager: the interruption may land at any bytecode, and a
    context manager's own frames (its ``__exit__``, before the guard is disarmed) would let it
    out of the turn. Here it lands in ``turn``, or in the finally before the disarming, and
    is caught below. Only a second firing (REFIRE_SECONDS later) landing in the few
    bytecodes between that catch and the disarming would escape."""
    guard = _guard()
    over = False
    try:
        try:
            _WATCHDOG.arm(guard, seconds)
            result = turn()
        finally:
            over = _disarm(guard)
    except OverBudget:
        over = _disarm(guard) or True
    if over:
        raise TurnOverBudget(seconds)
    return result


@contextmanager
def outside_budget() -> Iterator[None]:
    """Within a turn, a block whose time is not the turn's (a ``ctx.run`` function's)."""
    guard: _Guard | None = getattr(_current, "guard", None)
    if guard is None or not guard.armed:
        yield
        return
    left = guard.deadline - time.monotonic()
    if _disarm(guard):
        raise OverBudget  # it was over before the block began
    try:
        yield
    finally:
        _WATCHDOG.arm(guard, max(0.0, left))


def _guard() -> _Guard:
    guard: _Guard | None = getattr(_current, "guard", None)
    if guard is None:
        guard = _current.guard = _WATCHDOG.register(threading.get_ident())
    return guard


def _disarm(guard: _Guard) -> bool:
    """Disarm this thread's guard; whether it fired meanwhile. The exception may land in the
    disarming itself: it is disarmed all the same."""
    fired = False
    while True:
        try:
            return _WATCHDOG.disarm(guard) or fired
        except OverBudget:
            fired = True


@dataclass(eq=False)
class _Guard:
    """A thread's slot: armed while the thread runs a turn, until ``deadline``. Its lock
    orders the watchdog's firing with the thread's disarming, so no exception is raised
    into a thread whose turn has ended."""

    thread: int
    deadline: float = math.inf
    fired: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def armed(self) -> bool:
        return self.deadline != math.inf


@dataclass
class _Watchdog:
    """One thread per process, sleeping until the nearest deadline of the armed guards. A
    turn sets its thread's slot and clears it: no lock shared with the other threads, no
    heap, and no wake-up of the watchdog unless it would sleep past the new deadline.

    Turns are short and many: most scans find nothing armed. Then the watchdog looks again
    one budget later (``linger``) while turns go on, so a turn armed meanwhile, whose
    deadline is later than that, need not wake it; after a budget with no turn at all, it
    sleeps until the next one wakes it."""

    guards: dict[int, _Guard] = field(default_factory=dict)  # by thread id
    # Released to wake the watchdog, which waits by acquiring it: a plain lock, whose
    # release is one C call. An interruption may land in ``arm`` (a turn whose deadline
    # passed meanwhile), and an Event's Python code would be left holding its lock.
    wake: threading.Lock = field(default_factory=threading.Lock)
    waking_at: float = math.inf  # when the watchdog wakes next (inf: when told, or scanning)
    arms: int = 0  # turns armed so far (only whether it moved is read)
    linger: float = 0.0  # the budget of the latest turn armed
    start_lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None

    def register(self, thread: int) -> _Guard:
        guard = _Guard(thread)
        with self.start_lock:
            # A finished thread's id may be reused: its slot (disarmed) is replaced.
            self.guards = {**self.guards, thread: guard}
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="code-budget", daemon=True)
                self.thread.start()
        return guard

    def arm(self, guard: _Guard, seconds: float) -> None:
        self.arms += 1
        self.linger = seconds
        guard.fired = False
        guard.deadline = deadline = time.monotonic() + seconds
        # Read after the deadline is written: either the watchdog's last scan saw it, or
        # the watchdog set waking_at before that scan and this reads it (see _run).
        if deadline < self.waking_at:
            with contextlib.suppress(RuntimeError):  # already released: it wakes anyway
                self.wake.release()

    def disarm(self, guard: _Guard) -> bool:
        """Whether the guard fired (an exception still pending is dropped with the turn)."""
        with guard.lock:
            guard.deadline = math.inf
            if guard.fired:
                _raise_in(guard.thread, None)
            return guard.fired

    def _run(self) -> None:
        self.wake.acquire()  # held: nothing to tell
        seen = self.arms
        while True:
            self.waking_at = math.inf  # scanning: every arm releases ``wake``
            arms = self.arms
            nearest = self._fire_due()
            if nearest == math.inf and arms != seen:  # turns go on: look again a budget later
                nearest = time.monotonic() + self.linger
            seen = arms
            # An arm the scan missed released ``wake`` (it read inf): the wait returns at once.
            self.waking_at = nearest
            timeout = -1 if nearest == math.inf else max(0.0, nearest - time.monotonic())
            self.wake.acquire(timeout=timeout)

    def _fire_due(self) -> float:
        """Raise OverBudget in each thread past its deadline (again every REFIRE_SECONDS
        while it goes on); the nearest deadline left."""
        now, nearest = time.monotonic(), math.inf
        for guard in self.guards.values():
            if guard.deadline <= now:
                with guard.lock:  # not while the thread disarms
                    if guard.deadline <= now:
                        guard.fired = True
                        _raise_in(guard.thread, OverBudget)
                        guard.deadline = now + REFIRE_SECONDS
            nearest = min(nearest, guard.deadline)
        return nearest


def _raise_in(thread: int, exception: type[BaseException] | None) -> None:
    """CPython's PyThreadState_SetAsyncExc: ``exception`` is raised in ``thread`` at its next
    bytecode (None: a pending one is dropped)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread), ctypes.py_object(exception) if exception else None
    )


_WATCHDOG = _Watchdog()
