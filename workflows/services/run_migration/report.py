"""The dry run: what a plan would do, computed in SQL (one statement, nothing locked).

Per current step: how many runs it holds would move where (``to``, ``how``: mapped or
move_to), or why they would not (``cannot``: a reason of the run, which may come from another
of its live steps); per outcome: how many runs, with a bounded sample of their ids. The same
report over the runs a finished job left behind is that job's ``report``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from ...engine.sql import migration as sql
from ...engine.sql.rows import fetch_dict
from .plan import MigrationPlan

# Why the plan does not move a run (now), in words (docs/operations.md, "Changing an
# automation while runs are in flight", lists them too).
REASONS = {
    "step_removed": "parked on a step the new version does not have (the rule says stay)",
    "step_type_changed": "parked on a step whose id names a step of another type in the new "
    "version (the rule says stay)",
    "join_removed": "waiting at a fork's join the new version does not have",
    "step_running": "a step is running (a worker holds it): tried again until it settles",
    "mid_walk": "its walk is between steps (a continuation waits to run): tried again",
    "compensating": "its saga is being undone (its compensations name the old version's "
    "steps): it finishes on the old version",
}


@dataclass(frozen=True)
class DryRun:
    matched: int  # runs the filter matches
    would_move: int
    cannot: dict[str, dict[str, Any]]  # reason -> {"runs", "sample"}
    steps: list[dict[str, Any]]  # {"step_id", "to", "how", "cannot", "runs", "sample"}

    def as_json(self) -> dict[str, Any]:
        return {
            "matched": self.matched, "would_move": self.would_move,
            "cannot": self.cannot, "steps": self.steps,
        }  # fmt: skip


def dry_run(plan: MigrationPlan) -> DryRun:
    """What ``plan`` would do now."""
    with connection.cursor() as cursor:
        cursor.execute(sql.DRY_RUN, plan.sql_params())
        row = fetch_dict(cursor)
    assert row is not None
    outcomes = {o["cannot"]: o for o in row["outcomes"]}
    moving = outcomes.pop(None, {"runs": 0})
    cannot = {
        reason: {"runs": o["runs"], "sample": o["sample"], "why": REASONS.get(reason, reason)}
        for reason, o in outcomes.items()
    }
    return DryRun(
        matched=moving["runs"] + sum(o["runs"] for o in cannot.values()),
        would_move=moving["runs"],
        cannot=cannot,
        steps=list(row["steps"]),
    )
