"""What a replay reads: the run's steps in the order they were entered, in one statement."""

from __future__ import annotations

import json

from django.db import connection

from ..engine.sql.rows import fetch_dicts
from .context import DECIDER_ID, Recorded

# Every step of the run but the decider's own rows and the engine's continuations ("~..."),
# in the order they were entered (a code run enters one step at a time). The run's steps
# are found by the (org_id, run_id, ...) index every step lookup of a run uses.
RUN_HISTORY = """
SELECT step_id, iteration, type, status, output::text AS output
  FROM workflows_step
 WHERE org_id = %(org)s AND run_id = %(run)s
   AND step_id <> %(decider)s AND step_id NOT LIKE '~%%'
 ORDER BY id
"""


def run_history(*, org_id: int, run_id: int) -> list[Recorded]:
    with connection.cursor() as cursor:
        cursor.execute(RUN_HISTORY, {"org": org_id, "run": run_id, "decider": DECIDER_ID})
        rows = fetch_dicts(cursor)
    # As text, decoded here: Django's cursor hands jsonb back undecoded.
    return [
        Recorded(**{**row, "output": None if row["output"] is None else json.loads(row["output"])})
        for row in rows
    ]
