"""Generic plans that are made again while the tables grow.

A worker's connections plan the engine's statements once (sql.GENERIC_PLANS) and keep them for
hours. A plan fits the tables as they were when it was made: made while they held a few
hundred rows (a new install, a truncated table, a benchmark's first second), it scans the whole
table where a key lookup would do (the claim joined ``workflows_run`` by a sequential scan,
then hashed it: 1.4 ms a claim at 3,000 runs, and growing with every run), and nothing makes
it again until an ANALYZE of the table happens to invalidate it.

So a connection drops its plans (``DISCARD PLANS``: prepared statements stay, and are planned
again at their next execution, PL/pgSQL functions' statements too) after 32 uses, then after
twice as many as the time before, up to every ``MOST_USES_BETWEEN``: the plans follow the
tables' growth while it matters, and a long-lived connection pays for one planning of its
statements every few thousand settles (about 2 ms), which is nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connection

logger = logging.getLogger(__name__)

FIRST_REFRESH = 32
MOST_USES_BETWEEN = 4096
DISCARD_PLANS = "DISCARD PLANS"
_AGE = "waymark_plan_age"  # the PlanAge of a Django connection (see plans_made_now)


class PlanAge:
    """Counts a connection's uses since its plans were made; says when to make them again."""

    def __init__(self) -> None:
        self.uses = 0
        self.refresh_after = FIRST_REFRESH

    def due(self) -> bool:
        """Count one use; True when this connection's plans should be dropped now."""
        self.uses += 1
        if self.uses < self.refresh_after:
            return False
        self.uses = 0
        self.refresh_after = min(2 * self.refresh_after, MOST_USES_BETWEEN)
        return True


def plans_made_now(wrapper: Any) -> None:
    """A Django connection was opened: its plans are new (the connection_created hook of a
    worker's process sets this, steps.plan_claims_generically)."""
    setattr(wrapper, _AGE, PlanAge())


def refresh_plans_when_due() -> None:
    """Before a settle on this thread's Django connection, outside any transaction: drop its
    plans when they are due (PlanAge). A connection not opened yet has nothing to drop. It
    never raises: a connection that cannot take it is closed, and the settle that follows
    opens a fresh one (with fresh plans)."""
    age: PlanAge | None = getattr(connection, _AGE, None)
    if age is None or connection.connection is None or not age.due():
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute(DISCARD_PLANS)
    except Exception:
        logger.warning("could not drop this connection's plans; closing it", exc_info=True)
        connection.close()
