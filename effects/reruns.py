"""Effects and a re-run from a step (docs/reference/api-runs.md, "Re-run from a step").

The re-run (workflows, through the door's ``register_settled_effects``) reads the run's
settled effects here, shows them before it is confirmed and, unless told to repeat them,
writes into the run which new entry of a step takes which old effect's answer. The ledger
takes it (``reused_effect``): when a step's effect key has no row yet and the run names an
old settled effect for that step and iteration, the step takes its stored answer, nothing
is called, and the history says so (``effect.reused``, with both keys). No row is written
under the new key: the reuse is decided by the run's row, the same on every attempt.
"""

from __future__ import annotations

import json
from typing import Any

from workflows.plugins import SettledEffect, StepContext
from workflows.plugins.engine import (
    branch_paths,
    event_row,
    fetch_dict,
    fetch_dicts,
    insert_events,
)

from . import sql


def settled_effects(cursor: Any, org_id: int, run_id: int) -> list[SettledEffect]:
    cursor.execute(sql.SETTLED_EFFECTS_OF_RUN, {"org": org_id, "run": run_id})
    return [SettledEffect(row["step_id"], row["iteration"], row["key"], row["provider"])
            for row in fetch_dicts(cursor)]  # fmt: skip


def reused_effect(cursor: Any, ctx: StepContext) -> dict[str, Any] | None:
    """The settled effect this step execution takes instead of calling (recorded in the
    run's history), or None. A first iteration never has one: only a re-run's new entries,
    which follow an older one, are looked up (no cost on the usual path)."""
    if ctx.iteration <= 1:
        return None
    cursor.execute(sql.REUSABLE_EFFECT, {"run_id": ctx.run_id, "step_id": ctx.step_id,
                                         "iteration": str(ctx.iteration)})  # fmt: skip
    found = fetch_dict(cursor)
    if found is not None and found["places"] is not None:
        found = _reused_at_place(cursor, ctx, found["places"], int(found["floor"] or 0))
    if found is None or found["key"] is None:
        return None
    detail = {"key": ctx.effect_key, "reused": found["key"],
              "why": "the run was re-run without repeating settled effects"}  # fmt: skip
    insert_events(cursor, [event_row(
        ctx.org_id, ctx.run_id, "effect.reused", ctx.step_id, iteration=ctx.iteration,
        attempt=ctx.attempt, worker=ctx.lane, detail=detail,
    )])  # fmt: skip
    return found


def _reused_at_place(
    cursor: Any, ctx: StepContext, places: Any, floor: int
) -> dict[str, Any] | None:
    """The settled effect a code run's new entry of a step takes when the step's effects
    were made in ``ctx.parallel`` branches: the k-th new entry at a place (its branch path)
    takes the k-th effect made at that place, whichever branch entered first this time (an
    entry cancelled and entered again by a retry counted once);
    None when that one is made again, or there is none. The rows decide, the same on every
    attempt."""
    if isinstance(places, str):
        places = json.loads(places)
    cursor.execute(sql.STEP_ENTRIES_SINCE, {"run_id": ctx.run_id, "step_id": ctx.step_id,
                                            "floor": floor})  # fmt: skip
    entries = fetch_dicts(cursor)
    path = branch_paths(cursor, ctx.run_id)
    at = {row["id"]: path(row["fork_join_id"], row["branch"]) for row in entries}
    mine = next((row for row in entries if row["iteration"] == ctx.iteration), None)
    if mine is None:
        return None
    here = at[mine["id"]]
    # An entry cancelled before it (the run failed on another branch) is the same execution
    # as the one a retry entered again in its place: it is not counted twice.
    before = [row for row in entries if row["id"] < mine["id"] and at[row["id"]] == here]
    rank = 1 + sum(1 for row in before if row["status"] != "cancelled")
    offered = [key for place, key in places if place == here]
    if rank > len(offered) or offered[rank - 1] is None:
        return None
    cursor.execute(sql.SETTLED_RESULT, {"org_id": ctx.org_id, "key": offered[rank - 1]})
    return fetch_dict(cursor)
