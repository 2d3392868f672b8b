"""The one clock the engine decides by: the database's.

Leases, timers, deadlines, expiries and rate windows are compared and written with the
database's ``now()`` (in the SQL itself wherever it can be); a process reads it here when a
decision must be made in Python. A process's own clock is only for local budgets
(``time.monotonic()``: poll sleeps, heartbeat intervals, grace periods), so a machine whose
clock is minutes off neither takes a lease early nor fires a timer early
(tests/test_clock_skew.py).
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from .sql import DATABASE_NOW
from .sql.rows import fetch_dict


def database_now() -> datetime:
    """The database's ``now()``: the current transaction's start (in autocommit, this
    statement's)."""
    with connection.cursor() as cursor:
        cursor.execute(DATABASE_NOW)
        row = fetch_dict(cursor)
    assert row is not None
    now: datetime = row["now"]
    return now
