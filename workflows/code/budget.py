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

import ctypes
import heapq
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.conf import settings

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
    return float(settings.WAYMARK["CODE_TURN_MS"]) / 1000


_current = threading.local()  # the guard of the turn this thread runs, if any


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Run the block in this thread for at most ``seconds`` (not counting what runs in
    ``outside_budget``); past them, ``TurnOverBudget``."""
    over = False
    try:
        _current.guard = _WATCHDOG.arm(threading.get_ident(), seconds)
        try:
            yield
        finally:
            over = _disarm()
    except OverBudget:
        over = True
    if over:
        raise TurnOverBudget(seconds)


@contextmanager
def outside_budget() -> Iterator[None]:
    """Within a turn, a block whose time is not the turn's (a ``ctx.run`` function's)."""
    guard: _Guard | None = getattr(_current, "guard", None)
    if guard is None:
        yield
        return
    left = guard.deadline - time.monotonic()
    if _disarm():
        raise OverBudget  # it was over before the block began
    try:
        yield
    finally:
        _current.guard = _WATCHDOG.arm(threading.get_ident(), max(0.0, left))


def _disarm() -> bool:
    """Disarm this thread's guard; whether it fired meanwhile. The exception may land in the
    disarming itself: it is disarmed all the same."""
    guard: _Guard | None = getattr(_current, "guard", None)
    fired = False
    while guard is not None:
        try:
            _WATCHDOG.disarm(guard)
            _current.guard = None
            return fired or guard.fired
        except OverBudget:
            fired = True
    return fired


@dataclass(eq=False)
class _Guard:
    thread: int
    deadline: float
    armed: bool = True
    fired: bool = False


@dataclass
class _Watchdog:
    """One thread, sleeping until the nearest deadline of the armed guards (none: until one
    is armed), so a turn costs a heap push and no thread switch."""

    lock: threading.Condition = field(default_factory=threading.Condition)
    heap: list[tuple[float, int, _Guard]] = field(default_factory=list)
    order: Iterator[int] = field(default_factory=itertools.count)
    thread: threading.Thread | None = None
    waking_at: float | None = None  # when the thread wakes next (None: when told)

    def arm(self, thread: int, seconds: float) -> _Guard:
        guard = _Guard(thread, time.monotonic() + seconds)
        with self.lock:
            heapq.heappush(self.heap, (guard.deadline, next(self.order), guard))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="code-budget", daemon=True)
                self.thread.start()
            elif self.waking_at is None or guard.deadline < self.waking_at:
                self.lock.notify()
        return guard

    def disarm(self, guard: _Guard) -> None:
        with self.lock:
            guard.armed = False
            if guard.fired:  # an exception still pending is dropped with the turn
                _raise_in(guard.thread, None)

    def _run(self) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                while self.heap and (not self.heap[0][2].armed or self.heap[0][0] <= now):
                    deadline, _, guard = heapq.heappop(self.heap)
                    if guard.armed and deadline == guard.deadline:
                        guard.fired = True
                        _raise_in(guard.thread, OverBudget)
                        guard.deadline = now + REFIRE_SECONDS
                        heapq.heappush(self.heap, (guard.deadline, next(self.order), guard))
                        break  # re-read the clock before the next one
                self.waking_at = self.heap[0][0] if self.heap else None
                timeout = None if self.waking_at is None else max(0.0, self.waking_at - now)
                self.lock.wait(timeout)


def _raise_in(thread: int, exception: type[BaseException] | None) -> None:
    """CPython's PyThreadState_SetAsyncExc: ``exception`` is raised in ``thread`` at its next
    bytecode (None: a pending one is dropped)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread), ctypes.py_object(exception) if exception else None
    )


_WATCHDOG = _Watchdog()
