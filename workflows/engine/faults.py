"""Crash points for the crash tests: kill this process at a named line.

``WAYMARK_CRASH_AT=name`` makes ``crash_point(name)`` end the process at once with
``os._exit`` (no cleanup, no atexit, no rollback of anything already committed): the same
effect as SIGKILL at that line. Unset, a crash point costs one dict lookup.
"""

from __future__ import annotations

import os


def crash_point(name: str) -> None:
    if os.environ.get("WAYMARK_CRASH_AT") == name:
        os._exit(137)


def heartbeats_paused() -> bool:
    """``WAYMARK_PAUSE_HEARTBEATS=1``: the worker stops heartbeating, as in a long GC pause or
    a network partition, so the fencing tests can let its leases lapse while it still runs."""
    return os.environ.get("WAYMARK_PAUSE_HEARTBEATS") == "1"
