"""What a replay reads: the run's steps in the order they were entered, in one statement,
each with the outcome it ended with (when its step type has outcomes), less the steps a
re-run from a step set aside.

A re-run from a step (services/rerun.py, ``rerun_code``) keeps the run's rows and notes a
cut among the run's outputs (under ``REPLAY_CUTS``, an id no step can take): the newest row
the run had then, and how many of the steps read so far its replay keeps. Reading the rows
in order, each cut is applied once the rows read pass its row: the steps after the kept
ones are set aside (their rows stay, for the run page and the history), and the rows the
re-run entered follow the kept ones. Cuts add up: a re-run of a re-run reads the same way."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from django.db import connection

from ..engine.sql.rows import fetch_dicts
from .context import DECIDER_ID, Recorded

# Every step of the run but the engine's continuations ("~..."), in the order they were
# entered (a code run enters one step at a time). The run's steps are found by the
# (org_id, run_id, ...) index every step lookup of a run uses. The decider's own rows are
# read for what they recorded of the step before them (ENDED), not replayed.
RUN_HISTORY = """
SELECT id, step_id, iteration, type, status, output::text AS output
  FROM workflows_step
 WHERE org_id = %(org)s AND run_id = %(run)s AND step_id NOT LIKE '~%%'
 ORDER BY id
"""

# The run's newest step row, where a re-run notes its cut.
NEWEST_ROW = """
SELECT max(id) AS newest FROM workflows_step WHERE org_id = %(org)s AND run_id = %(run)s
"""

# Among the run's outputs: the re-runs' cuts, oldest first ({"after_row", "kept"} each).
REPLAY_CUTS = "~replay"

# In a decider turn's output: the outcome of the step that ended before the turn, as the
# engine noted it among the run's outputs (engine/decided.py), recorded by the turn.
ENDED = "ended"


def run_history(
    *, org_id: int, run_id: int, latest: Mapping[str, Any] | None, cuts: Any = None
) -> list[Recorded]:
    """The run's recorded steps. ``latest``: the decider's output among the run's outputs
    now, which notes the outcome of the step that has just ended (not yet recorded).
    ``cuts``: the re-runs' cuts among the run's outputs (``REPLAY_CUTS``)."""
    with connection.cursor() as cursor:
        cursor.execute(RUN_HISTORY, {"org": org_id, "run": run_id})
        rows = fetch_dicts(cursor)
    pending = replay_cuts(cuts)
    history: list[Recorded] = []
    for row in rows:
        while pending and pending[0][0] < row["id"]:
            del history[pending.pop(0)[1] :]
        row.pop("id")
        # As text, decoded here: Django's cursor hands jsonb back undecoded.
        output = None if row["output"] is None else json.loads(row["output"])
        if row["step_id"] == DECIDER_ID:
            if isinstance(output, Mapping) and "call" in output:  # a turn, not the run's end
                _with_outcome(history, output.get(ENDED))
            continue
        history.append(Recorded(**{**row, "output": output}))
    for _, kept in pending:
        del history[kept:]
    if latest is not None:
        _with_outcome(history, ended_before(latest))
    return history


def ended_before(decider_output: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a turn records of the step that ended before it: its id and outcome, as noted
    in the decider's output among the run's outputs."""
    call, outcome = decider_output.get("call"), decider_output.get("outcome")
    if not isinstance(call, Mapping) or not isinstance(outcome, str):
        return None
    return {"step": call.get("id"), "outcome": outcome}


def _with_outcome(history: list[Recorded], ended: Any) -> None:
    """Give the last recorded step the outcome a turn recorded for it (the same step)."""
    if not isinstance(ended, Mapping) or not history:
        return
    last = history[-1]
    if last.step_id == ended.get("step") and isinstance(ended.get("outcome"), str):
        history[-1] = replace(last, outcome=ended["outcome"])


def replay_cuts(cuts: Any) -> list[tuple[int, int]]:
    """The re-runs' cuts as (after_row, kept), in the order they were made."""
    if not isinstance(cuts, list):
        return []
    return [
        (int(cut["after_row"]), int(cut["kept"]))
        for cut in cuts
        if isinstance(cut, Mapping) and {"after_row", "kept"} <= set(cut)
    ]


def newest_row(cursor: Any, *, org_id: int, run_id: int) -> int:
    """The run's newest step row (a re-run's cut is after it)."""
    cursor.execute(NEWEST_ROW, {"org": org_id, "run": run_id})
    row = cursor.fetchone()
    return int(row[0] or 0)
