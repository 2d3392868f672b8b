"""What a replay reads: the run's steps in the order they were entered, in one statement,
each with the outcome it ended with (when its step type has outcomes)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from django.db import connection

from ..engine.sql.rows import fetch_dicts
from ..states import StepStatus
from .context import DECIDER_ID, Recorded

# Every step of the run but the engine's continuations ("~..."), in the order they were
# entered (a code run enters one step at a time). The run's steps are found by the
# (org_id, run_id, ...) index every step lookup of a run uses. The decider's own rows are
# read for what they recorded of the step before them (ENDED), not replayed.
RUN_HISTORY = """
SELECT step_id, iteration, type, status, output::text AS output
  FROM workflows_step
 WHERE org_id = %(org)s AND run_id = %(run)s AND step_id NOT LIKE '~%%'
 ORDER BY id
"""

# In a decider turn's output: the outcome of the step that ended before the turn, as the
# engine noted it among the run's outputs (engine/decided.py), recorded by the turn.
ENDED = "ended"


def run_history(*, org_id: int, run_id: int, latest: Mapping[str, Any] | None) -> list[Recorded]:
    """The run's recorded steps. ``latest``: the decider's output among the run's outputs
    now, which notes the outcome of the step that has just ended (not yet recorded)."""
    with connection.cursor() as cursor:
        cursor.execute(RUN_HISTORY, {"org": org_id, "run": run_id})
        rows = fetch_dicts(cursor)
    history: list[Recorded] = []
    for row in rows:
        # As text, decoded here: Django's cursor hands jsonb back undecoded.
        output = None if row["output"] is None else json.loads(row["output"])
        if row["step_id"] == DECIDER_ID:
            if isinstance(output, Mapping) and "call" in output:  # a turn, not the run's end
                _with_outcome(history, output.get(ENDED))
            continue
        history.append(Recorded(**{**row, "output": output}))
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


@dataclass(frozen=True)
class Turn:
    """What a turn knew when it asked for its step (StepResult.carried): the history it
    replayed, and the step it asked for."""

    history: tuple[Recorded, ...]
    asked: Mapping[str, Any]


def history_after(
    turn: Any, *, latest: Mapping[str, Any] | None, outputs: Mapping[str, Any]
) -> list[Recorded] | None:
    """The run's history for the turn after ``turn``, without a query: the history ``turn``
    replayed and the step it asked for, ended with the output the run now holds for it.
    None when ``turn`` is not the run's previous turn (``latest``, the decider's output among
    the run's outputs, asks for another step) or its step has no output yet."""
    if not isinstance(turn, Turn) or latest is None:
        return None
    call, asked = latest.get("call"), turn.asked
    if not isinstance(call, Mapping) or (call.get("id"), call.get("type")) != (
        asked.get("id"), asked.get("type")):  # fmt: skip
        return None
    ended = outputs.get(str(asked["id"]))
    if not isinstance(ended, Mapping) or "output" not in ended:
        return None
    # One live step at a time: the asked step's iteration follows its earlier ones.
    iteration = 1 + sum(1 for r in turn.history if r.step_id == asked["id"])
    history = [*turn.history, Recorded(str(asked["id"]), iteration, str(asked["type"]),
                                       StepStatus.DONE, ended["output"])]  # fmt: skip
    _with_outcome(history, ended_before(latest))
    return history
