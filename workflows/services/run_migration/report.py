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
from ...engine.sql.rows import fetch_dict, fetch_dicts
from ...models import Run
from ..replays import replays_of
from .plan import SAMPLE, MigrationPlan

# Why the plan does not move a run (now), in words (docs/how-to/change-an-automation-in-flight.md,
# lists them too).
REASONS = {
    "step_removed": "parked on a step the new version does not have (the rule says stay)",
    "step_type_changed": "parked on a step whose id names a step of another type in the new "
    "version (the rule says stay)",
    "join_removed": "waiting at a fork's join the new version does not have",
    "step_running": "a step is running (a worker holds it): tried again until it settles",
    "mid_walk": "its walk is between steps (a continuation waits to run): tried again",
    "compensating": "its saga is being undone (its compensations name the old version's "
    "steps): it finishes on the old version",
    "nondeterministic_workflow": "a code run whose history the new version's code does not "
    "fit (its replay calls another step than the history has): it stays",
    "workflow_failed": "a code run the new version's code fails on, replaying its history: "
    "it stays",
}
# A code run's preview replays at most this many runs the plan would move (the job replays
# each run it moves, whatever their number).
MAX_REPLAYED = 500


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


def dry_run(plan: MigrationPlan, *, misfits: dict[str, list[int]] | None = None) -> DryRun:
    """What ``plan`` would do now. Code runs between versions of their code: each run the
    rules would move is replayed, dry, on the new code (up to MAX_REPLAYED); one whose
    history it does not fit is counted under the refusal's code. ``misfits``: those a job's
    moves found (by reason), instead of replaying."""
    with connection.cursor() as cursor:
        cursor.execute(sql.DRY_RUN, plan.sql_params())
        row = fetch_dict(cursor)
        if plan.decided and misfits is None:
            misfits = _misfits(cursor, plan)
    assert row is not None
    outcomes = {o["cannot"]: o for o in row["outcomes"]}
    moving = outcomes.pop(None, {"runs": 0})
    for reason, runs in sorted((misfits or {}).items()):
        outcomes[reason] = {"runs": len(runs), "sample": sorted(runs)[:SAMPLE]}
        moving = {**moving, "runs": max(0, moving["runs"] - len(runs))}
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


def _misfits(cursor: Any, plan: MigrationPlan) -> dict[str, list[int]]:
    """The runs the rules would move whose history the new version's code does not fit, by
    the refusal's code: a dry replay of each (nothing called, nothing entered)."""
    definition = plan.to_version.definition
    decided = replays_of(definition)
    if decided is None:
        return {}
    cursor.execute(sql.CANDIDATES, {**plan.sql_params(), "n": MAX_REPLAYED})
    movable = [r["run_id"] for r in fetch_dicts(cursor) if r["reason"] is None]
    found: dict[str, list[int]] = {}
    for run in Run.objects.filter(pk__in=movable).only("id", "org_id", "input", "outputs"):
        misfit = decided[1].misfit(run, definition)
        if misfit is not None:
            found.setdefault(misfit.partition(":")[0], []).append(run.pk)
    return found
