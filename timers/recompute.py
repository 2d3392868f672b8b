"""Computing a pending timer's instant again from its intent.

A timer keeps what was asked (a duration, a moment, a weekly rule) and the zone it was read
in. Its instant moves when:

- the tz database changed (a country moved its clocks): ``manage.py recompute_timers``
  after updating tzdata recomputes every pending timer and reports how many moved;
- the run's zone changed before the timer fired (the zone came from the run's data, say
  ``"{{ vars.tz }}"``, and a parallel branch changed it): the due sweep checks such a timer
  when it comes due and moves it instead of firing it at the old zone's time.

Each move is recorded in the run's history (``timer.recomputed``) with both instants and
zones. The spread offset is kept: hash(run id) lands on the same offset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction

from workflows.plugins import StepFailure, render
from workflows.plugins.definitions import build_context
from workflows.plugins.engine import event_row, fetch_dict, fetch_dicts, insert_events

from . import sql
from .calendar import zone_named
from .timing import instant


@dataclass(frozen=True)
class Recomputed:
    due_at: datetime
    zone: str


def recomputed(cursor: Any, timer: Mapping[str, Any]) -> Recomputed | None:
    """The timer's instant and zone computed again now; None when they did not change (or
    cannot be computed: the timer then keeps its instant)."""
    zone = _current_zone(cursor, timer)
    try:
        when = instant(timer["intent"], zone_named(zone or "UTC"), after=timer["created_at"])
    except (StepFailure, ValueError):
        return None
    due_at = when + timedelta(seconds=timer["offset_seconds"])
    if due_at == timer["due_at"] and zone == timer["zone"]:
        return None
    return Recomputed(due_at, zone)


def move(cursor: Any, timer: Mapping[str, Any], new: Recomputed, *, why: str, by: str) -> bool:
    cursor.execute(sql.RECOMPUTED, {"id": timer["id"], "due_at": new.due_at, "zone": new.zone})
    if cursor.fetchone() is None:
        return False
    detail = {"from": timer["due_at"].isoformat(), "to": new.due_at.isoformat(),
              "zone_from": timer["zone"], "zone_to": new.zone, "why": why}  # fmt: skip
    insert_events(cursor, [event_row(timer["org_id"], timer["run_id"], "timer.recomputed",
                                     timer["step_id"], iteration=timer["iteration"], worker=by,
                                     detail=detail)])  # fmt: skip
    return True


def _current_zone(cursor: Any, timer: Mapping[str, Any]) -> str:
    template = timer["intent"].get("zone_template")
    if not template:  # the zone as written: nothing of the run's data to read again
        return str(timer["zone"])
    cursor.execute(sql.RUN_DATA, {"run_id": timer["run_id"]})
    run = fetch_dict(cursor)
    if run is None:
        return str(timer["zone"])
    context = build_context(run_input=run["input"], variables=run["vars"],
                            step_outputs=run["outputs"], run_id=run["id"],
                            started_at=run["created_at"])  # fmt: skip
    try:
        return str(render(template, context)).strip()
    except StepFailure:
        return str(timer["zone"])


@dataclass(frozen=True)
class Tally:
    checked: int
    moved: int


def recompute_pending(*, by: str = "recompute_timers", page: int = 500) -> Tally:
    """Recompute every pending timer, a page per transaction; how many were checked, moved."""
    checked = moved = 0
    after = 0
    while True:
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql.PENDING_PAGE, {"after": after, "n": page})
            timers = fetch_dicts(cursor)
            for timer in timers:
                new = recomputed(cursor, timer)
                if new is not None:
                    moved += move(cursor, timer, new, why="recomputed", by=by)
        checked += len(timers)
        if len(timers) < page:
            return Tally(checked, moved)
        after = timers[-1]["id"]
