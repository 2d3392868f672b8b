"""Prepared statements' plans are made again while the tables grow.

The engine's statements are server-side prepared on connections that live for hours, and a
worker's connections plan them once (sql.GENERIC_PLANS); elsewhere PostgreSQL settles on a
generic plan after five executions. A plan fits the tables as they were when it was made:
made while they held a few hundred rows (a new install, a truncated table, a benchmark's first
second), it reads a whole table where a key lookup would do, and nothing makes it again until
an ANALYZE of that table happens to invalidate it. The worker's claim, planned when
``workflows_run`` was nearly empty, joined it by a sequential scan: 1.4 ms a claim at 3,000
runs in the side-by-side harness's end to end (auto_explain), and more with every run.

So each connection drops its plans (``DISCARD PLANS``: the prepared statements stay, and are
planned again at their next execution; PL/pgSQL functions' statements too) after 32 prepared
executions, then after twice as many as the time before, up to every ``MOST_USES_BETWEEN``:
the plans follow the tables while they grow fast, and a long-lived connection pays one more
planning of its statements every few thousand executions (a few milliseconds), which is
nothing. It is counted where the engine prepares statements (sql.rows.query_prepared and
its pipeline, steps.PreparedClaims), per psycopg connection.
"""

from __future__ import annotations

import threading
from typing import Any
from weakref import WeakKeyDictionary

FIRST_REFRESH = 32
MOST_USES_BETWEEN = 4096
DISCARD_PLANS = "DISCARD PLANS"


class PlanAge:
    """Counts a connection's prepared executions since its plans were made; says when to
    make them again."""

    def __init__(self) -> None:
        self.uses = 0
        self.refresh_after = FIRST_REFRESH

    def due(self) -> bool:
        """Count one use; True when the connection's plans should be dropped now."""
        self.uses += 1
        if self.uses < self.refresh_after:
            return False
        self.uses = 0
        self.refresh_after = min(2 * self.refresh_after, MOST_USES_BETWEEN)
        return True


_ages: WeakKeyDictionary[Any, PlanAge] = WeakKeyDictionary()  # per psycopg connection
_ages_lock = threading.Lock()


def refresh_plans_when_due(conn: Any) -> None:
    """Before a prepared execution on ``conn`` (a psycopg connection, not in pipeline mode):
    drop its plans when they are due (PlanAge). A failure is the connection's, and is raised
    as the statement's own would have been."""
    age = _ages.get(conn)
    if age is None:
        with _ages_lock:
            age = _ages.setdefault(conn, PlanAge())
    if age.due():
        conn.execute(DISCARD_PLANS)
