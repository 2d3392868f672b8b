"""Crash points for the crash tests: kill this process at a named line.

``WAYMARK_CRASH_AT=name`` makes ``crash_point(name)`` end the process at once with
``os._exit`` (no cleanup, no atexit, no rollback of anything already committed): the same
effect as SIGKILL at that line. The variable is read once, when the process starts (the
tests set it in the environment of the process they start): a crash point then costs one
comparison, not an environment lookup (several a step).
"""

from __future__ import annotations

import os
import time

_CRASH_AT = os.environ.get("WAYMARK_CRASH_AT")


def crash_point(name: str) -> None:
    if name == _CRASH_AT:
        os._exit(137)


_STARTED = time.monotonic()


def heartbeats_paused() -> bool:
    """``WAYMARK_PAUSE_HEARTBEATS=forever`` (or ``=N`` seconds from process start): the worker
    does not heartbeat, as in a long GC pause or a network partition, so the fencing tests
    can let its leases lapse while it still runs."""
    pause = os.environ.get("WAYMARK_PAUSE_HEARTBEATS")
    if not pause:
        return False
    return pause == "forever" or time.monotonic() - _STARTED < float(pause)
