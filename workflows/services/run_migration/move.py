"""One run's move to the plan's version: one transaction, under the run's lock.

The run is locked first, then its live steps (the one lock order), and the plan's rules are
checked again on the rows as they are now: a run that moved on, finished, or has a step a
worker holds is left as it is (``busy`` ones are tried again by the job). Then, together:

- each live step whose id changes takes its new id (and a free iteration of it), and every
  app renames its rows kept for that step execution (its timer, its request, its effects:
  ``engine/renames.py``): a waiting step's wait is carried over as it was made;
- each live step on a removed step, under ``move_to``, is cancelled (its timer with it) and
  the walk enters the rule's step in its place, on the new version: the wait is re-made;
- the run takes the new version, its outputs and entered counts under the new ids;
- the run's history gets ``run.migrated`` (the job, both versions, the mapping, each step's
  move), and the job's count grows by one.

Nothing of it commits unless all of it does. The lock waits of the move are bounded
(``sql.LOCK_TIMEOUT``): another transaction holding a row the move needs is given way to
(``locked``), never waited into a deadlock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from ...engine.definition_cache import definition_for
from ...engine.forks import JOIN_WAIT
from ...engine.places import Entry, Place
from ...engine.renames import StepBusy, StepRename, rename_everywhere
from ...engine.sql import migration as sql
from ...engine.sql.rows import event_row, fetch_dicts, insert_events
from ...engine.walk import CONTINUATION_STEP, RunState, Walk, lock_run
from ...states import RUN_FINISHED
from ..audit import Actor, as_actor, record_audit
from .plan import MigrationPlan

MOVED = "moved"
ALREADY = "already_moved"  # by this job, before it was stopped
BUSY = "busy"  # put off: tried again later in the job
CANNOT = "cannot"  # the plan does not move it (its reason says why)
SKIPPED = "skipped"  # no longer one of the plan's runs (moved on, finished, gone)


@dataclass(frozen=True)
class MoveResult:
    outcome: str
    reason: str | None = None


@dataclass(frozen=True)
class LiveStep:
    """A live step row of the run being moved, and what the plan makes of it."""

    pk: int
    step_id: str
    iteration: int
    status: str
    wait_kind: str
    place: Place
    target: str | None  # its new id (mapped) or the rule's step (move_to)
    how: str | None  # "mapped" | "move_to"
    reason: str | None  # why the run cannot move (for this step), else None


def move_run(
    plan: MigrationPlan, run_id: int, *, migration_id: int | None, actor: Actor | str
) -> MoveResult:
    """Move one run (its own transaction; audited as ``run.migrate``). ``migration_id``: the
    job, recorded in the event and counted (None: no job, a single move)."""
    who = as_actor(actor)
    try:
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql.LOCK_TIMEOUT)
            result = _move_locked(cursor, plan, run_id, migration_id, who.label)
            if result.outcome == MOVED:
                record_audit(
                    org=plan.org, actor=who, action="run.migrate", target_type="run",
                    target_id=run_id, detail={
                        "migration": migration_id, "from_version": plan.from_version.number,
                        "to_version": plan.to_version.number,
                    },
                )  # fmt: skip
            return result
    except StepBusy:
        return MoveResult(BUSY, "locked")
    except Exception as exc:
        if _gave_way(exc):
            return MoveResult(BUSY, "locked")
        raise


# lock_not_available (the move's lock_timeout), deadlock_detected, serialization_failure:
# another transaction had what the move needed; the move rolled back and is tried again.
GAVE_WAY = frozenset({"55P03", "40P01", "40001"})


def _gave_way(exc: BaseException) -> bool:
    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, psycopg.Error) and current.sqlstate in GAVE_WAY:
            return True
        current = current.__cause__
    return False


def _move_locked(
    cursor: Any, plan: MigrationPlan, run_id: int, migration_id: int | None, actor: str
) -> MoveResult:
    try:
        run = lock_run(cursor, run_id)
    except LookupError:
        return MoveResult(SKIPPED, "run_gone")
    if run.version_id != plan.from_version.pk:
        if migration_id is not None and _moved_by(cursor, run_id, migration_id):
            return MoveResult(ALREADY)
        return MoveResult(SKIPPED, "version_changed")
    if run.status in RUN_FINISHED:
        return MoveResult(SKIPPED, "run_finished")
    if run.status not in plan.statuses:
        return MoveResult(SKIPPED, "status_changed")
    cursor.execute(sql.LIVE_STEPS_LOCKED, {"run": run_id})
    steps = [_classified(plan, row) for row in fetch_dicts(cursor)]
    if plan.steps and not any(step.step_id in plan.steps for step in steps):
        return MoveResult(SKIPPED, "step_changed")
    reasons = sorted({s.reason for s in steps if s.reason}, key=_final_first)
    if reasons:
        busy = reasons[0] in sql.BUSY_REASONS
        return MoveResult(BUSY if busy else CANNOT, reasons[0])
    renames = _renames(cursor, run, steps)
    outputs, entered = _renamed_data(run, plan.targets, renames)
    cursor.execute(
        sql.MIGRATE_RUN,
        {"to": plan.to_version.pk, "from": plan.from_version.pk, "id": run.id,
         "outputs": Jsonb(outputs), "entered": Jsonb(entered)},
    )  # fmt: skip
    if cursor.rowcount != 1:
        raise RuntimeError(f"run {run.id} changed under its lock")
    for rename in renames:
        cursor.execute(sql.RENAME_STEP, rename.params())
        if cursor.rowcount != 1:
            raise RuntimeError(f"step {rename.step_pk} changed under its run's lock")
        rename_everywhere(cursor, rename)
    moved_away = [s for s in steps if s.how == "move_to"]
    insert_events(cursor, [_migrated_event(plan, run, steps, renames, migration_id, actor)])
    if moved_away:
        run.version_id, run.outputs, run.entered = plan.to_version.pk, outputs, entered
        _re_enter(cursor, plan, run, moved_away, actor)
    if migration_id is not None:
        cursor.execute(sql.COUNT_MOVED, {"id": migration_id})
    return MoveResult(MOVED)


def _classified(plan: MigrationPlan, row: Mapping[str, Any]) -> LiveStep:
    """The same rules as sql.migration's verdicts, on the row as it is under the lock."""
    step_id = row["step_id"]
    how: str | None = None
    target: str | None = None
    reason: str | None = None
    if step_id in plan.targets:
        how, target = "mapped", plan.targets[step_id]
    elif plan.removed.move_to is not None:
        how, target = "move_to", plan.removed.move_to
    if step_id == CONTINUATION_STEP:
        how, target, reason = None, None, "mid_walk"
    elif row["wait_kind"] == JOIN_WAIT and how != "mapped":
        reason = "join_removed"
    elif row["status"] == "running":
        reason = "step_running"
    elif how is None:
        reason = plan.unmapped.get(step_id, "step_removed")
    return LiveStep(
        pk=row["id"], step_id=step_id, iteration=row["iteration"], status=row["status"],
        wait_kind=row["wait_kind"], place=Place(row["fork_join_id"], row["branch"]),
        target=target, how=how, reason=reason,
    )  # fmt: skip


def _final_first(reason: str) -> tuple[bool, str]:
    return (reason in sql.BUSY_REASONS, reason)


def _renames(cursor: Any, run: RunState, steps: list[LiveStep]) -> list[StepRename]:
    """The live steps whose id changes, each with the iteration it takes: its own, unless a
    row of the new id has it (a step the run entered under that id before), then the next
    free one after every row and count of that id."""
    mapped = [s for s in steps if s.how == "mapped" and s.target != s.step_id]
    if not mapped:
        return []
    targets = sorted({s.target for s in mapped if s.target})
    cursor.execute(sql.TAKEN_ITERATIONS, {"run": run.id, "ids": targets})
    taken: dict[str, set[int]] = {}
    for row in fetch_dicts(cursor):
        taken.setdefault(row["step_id"], set()).add(row["iteration"])
    renames = []
    for step in mapped:
        assert step.target is not None
        used = taken.setdefault(step.target, set())
        iteration = step.iteration
        if iteration in used:
            iteration = max([*used, run.entered.get(step.target, 0)]) + 1
        used.add(iteration)
        renames.append(
            StepRename(
                org_id=run.org_id, run_id=run.id, step_pk=step.pk, step_id=step.step_id,
                iteration=step.iteration, new_step_id=step.target, new_iteration=iteration,
            )
        )  # fmt: skip
    return renames


def _renamed_data(
    run: RunState, targets: Mapping[str, str], renames: list[StepRename]
) -> tuple[dict[str, Any], dict[str, int]]:
    """The run's outputs and entered counts under the new version's ids: a mapped step's under
    its new id (a step the new version calls by the same id keeps its own), the others as
    they were. The new version's templates (``steps.<id>``) and loops read them."""
    outputs = {k: v for k, v in run.outputs.items() if k not in targets}
    entered = {k: v for k, v in run.entered.items() if k not in targets}
    for old_id in sorted(targets, key=lambda old: targets[old] == old):  # identity last: wins
        new_id = targets[old_id]
        if old_id in run.outputs:
            outputs[new_id] = run.outputs[old_id]
        if old_id in run.entered:
            entered[new_id] = max(entered.get(new_id, 0), run.entered[old_id])
    for rename in renames:  # a step renamed onto a later iteration counts it as entered
        entered[rename.new_step_id] = max(entered.get(rename.new_step_id, 0), rename.new_iteration)
    return outputs, entered


def _migrated_event(
    plan: MigrationPlan,
    run: RunState,
    steps: list[LiveStep],
    renames: list[StepRename],
    migration_id: int | None,
    actor: str,
) -> Any:
    renamed = {r.step_pk: r for r in renames}
    moves = []
    for step in steps:
        move: dict[str, Any] = {"step_id": step.step_id, "iteration": step.iteration,
                                "how": step.how, "to": step.target}  # fmt: skip
        if step.pk in renamed:
            move["to_iteration"] = renamed[step.pk].new_iteration
        moves.append(move)
    detail = {
        "migration": migration_id, "by": actor,
        "from_version": plan.from_version.number, "to_version": plan.to_version.number,
        "from_version_id": plan.from_version.pk, "to_version_id": plan.to_version.pk,
        "mapping": plan.targets, "removed": plan.removed.as_json(), "steps": moves,
    }  # fmt: skip
    return event_row(run.org_id, run.id, "run.migrated", worker=actor, detail=detail)


def _re_enter(
    cursor: Any, plan: MigrationPlan, run: RunState, moved_away: list[LiveStep], actor: str
) -> None:
    """The removed steps' waits end, and the rule's step is entered where each was (once per
    place: two removed steps of one branch go on as one), on the new version."""
    cursor.execute(sql.CANCEL_MOVED_STEPS, {"run": run.id, "ids": [s.pk for s in moved_away]})
    cancelled = fetch_dicts(cursor)
    if len(cancelled) != len(moved_away):
        raise RuntimeError(f"run {run.id}: a step changed under its run's lock")
    detail = {"reason": "migrated", "move_to": plan.removed.move_to, "by": actor}
    insert_events(cursor, [
        event_row(run.org_id, run.id, "step.cancelled", row["step_id"],
                  iteration=row["iteration"], attempt=row["attempt"], worker=actor, detail=detail)
        for row in cancelled
    ])  # fmt: skip
    assert plan.removed.move_to is not None
    places = dict.fromkeys(s.place for s in moved_away)  # in order, once each
    walk = Walk(cursor, run, definition_for(plan.to_version.pk), worker=actor)
    walk.enter_entries(Entry(plan.removed.move_to, place) for place in places)
    walk.flush()


def _moved_by(cursor: Any, run_id: int, migration_id: int) -> bool:
    cursor.execute(sql.MOVED_BY, {"run": run_id, "migration": migration_id})
    return cursor.fetchone() is not None
