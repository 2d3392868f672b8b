"""Writing a wait's timer, inside the walk's transaction that enters its step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import connection

from workflows.plugins import Park, StepContext, StepResult
from workflows.plugins.engine import (
    database_now,
    definition_for,
    engine_setting,
    fetch_dict,
    json_or_null,
)

from . import sql
from .timing import Planned, plan


def enter_wait(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext) -> StepResult:
    """Plan the step's timer, write it in this transaction, and park the step on it (no
    deadline of its own: the due sweep fires the timer, and the timer wakes the step)."""
    assert connection.in_atomic_block, "a wait is entered in the walk's transaction"
    planned = plan(step, context, run_id=ctx.run_id, now=database_now(),
                   default_spread=definition_spread(ctx.run_id))  # fmt: skip
    timer_id = write_timer(ctx, planned)
    detail = {"timer": timer_id, "due_at": planned.due_at.isoformat(), "zone": planned.zone,
              "parked_on": f"timer:{timer_id}"}  # fmt: skip
    return StepResult(park=Park(deadline_seconds=None, detail=detail))


def definition_spread(run_id: int) -> str | None:
    """The definition's `timer_spread` (the default spread of its rule timers), if any."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT version_id FROM workflows_run WHERE id = %s", [run_id])
        row = fetch_dict(cursor)
    if row is None:
        return None
    spread = definition_for(row["version_id"]).get("timer_spread")
    return str(spread) if spread is not None else None


def write_timer(ctx: StepContext, planned: Planned) -> int:
    params: dict[str, Any] = {
        "org_id": ctx.org_id, "run_id": ctx.run_id, "step_id": ctx.step_id,
        "iteration": ctx.iteration, "kind": planned.kind, "intent": json_or_null(planned.intent),
        "zone": planned.zone, "spread": planned.spread_seconds, "offset": planned.offset_seconds,
        "due_at": planned.due_at, "soon": float(engine_setting("SWEEP_SECONDS")),
    }  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(sql.INSERT_TIMER, params)
        row = fetch_dict(cursor)
    assert row is not None
    return int(row["id"])
