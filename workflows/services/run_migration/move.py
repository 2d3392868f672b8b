"""One run's move to the plan's version: one transaction, under the run's lock.

The run is locked first, then its live steps (the one lock order), and the plan's rules are
checked again on the rows as they are now. A job first asks the run's history whether it
moved the run already (``already_moved``, whatever version the run is on now: another job
may have moved it back) or whether another migration moved it since the job was made
(skipped, ``moved_by_another_migration``, recorded as ``run.migration_skipped``). A run that
moved on, finished, is compensating (its saga being undone: ``compensating``), or has a step
a worker holds is left as it is (``busy`` ones are tried again by the job). Then, together:

- every row of a step whose id changes takes its new id, the finished ones too (so what
  reads completed steps by id, a saga's compensation, the run's graph, finds them under the
  new version's ids), each with an iteration no row of that id keeps (its own when free),
  and every app renames its rows kept for that step execution (its timer, its request, its
  effects: ``engine/renames.py``): a waiting step's wait is carried over as it was made;
- a code run (``plan.decided``) keeps its live step, the one its code asked for, once the new
  version's code is checked against its history: a dry replay up to its first new work,
  calling no ctx.run function and entering nothing. A history it does not fit leaves the run
  where it is (``nondeterministic_workflow``, or the code's own failure), the refusal noted
  in the run's history (``run.migration_refused``);
- each live step on a removed step, under ``move_to``, is cancelled (its timer with it) and
  the walk enters the rule's step in its place, on the new version: the wait is re-made;
- the run takes the new version, its outputs under the new ids, and its loop counts (entered)
  carried to the new ids: a new id's count is the largest of its own, those of the ids
  renamed onto it and the iterations its rows now have, so its next entry never takes an
  iteration already used;
- the run's history gets ``run.migrated`` (the job, both versions, the mapping, each live
  step's move, the finished rows renamed, the failed steps it had), and the job's count
  grows by one.

Nothing of it commits unless all of it does. The lock waits of the move are bounded
(``sql.LOCK_TIMEOUT``): another transaction holding a row the move needs is given way to
(``locked``), never waited into a deadlock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from ...engine.decided import deciding_step
from ...engine.definition_cache import definition_for
from ...engine.forks import JOIN_WAIT
from ...engine.places import Entry, Place
from ...engine.renames import StepBusy, StepRename, rename_everywhere
from ...engine.sql import migration as sql
from ...engine.sql.rows import event_row, fetch_dicts, insert_events
from ...engine.walk import CONTINUATION_STEP, RunState, Walk, lock_run
from ...states import RUN_FINISHED, STEP_LIVE
from ..audit import Actor, as_actor, record_audit
from ..replays import replays_of
from .plan import MigrationPlan

MOVED = "moved"
ALREADY = "already_moved"  # by this job, before it was stopped (even if moved back since)
BUSY = "busy"  # put off: tried again later in the job
CANNOT = "cannot"  # the plan does not move it (its reason says why)
SKIPPED = "skipped"  # no longer one of the plan's runs (moved on, finished, gone)
MOVED_BY_ANOTHER = "moved_by_another_migration"  # a SKIPPED reason
# A row's id between two renames of one move (rows trading ids: a -> b while b -> a): no step
# id has this character (definitions/fields.py), and no such id outlives the transaction.
TEMPORARY_ID = "~{pk}"


@dataclass(frozen=True)
class MoveResult:
    outcome: str
    reason: str | None = None
    misfit: bool = False  # a code run whose history the new code does not fit (CANNOT)


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
    if migration_id is not None:
        done = _moved_by_jobs(cursor, run, migration_id, actor)
        if done is not None:
            return done
    if run.version_id != plan.from_version.pk:
        return MoveResult(SKIPPED, "version_changed")
    if run.status in RUN_FINISHED:
        return MoveResult(SKIPPED, "run_finished")
    if run.status not in plan.statuses:
        return MoveResult(SKIPPED, "status_changed")
    cursor.execute(sql.LIVE_STEPS_LOCKED, {"run": run_id})
    steps = [_classified(plan, row) for row in fetch_dicts(cursor)]
    if plan.steps and not any(step.step_id in plan.steps for step in steps):
        return MoveResult(SKIPPED, "step_changed")
    if _compensating(cursor, run_id):
        return MoveResult(CANNOT, sql.COMPENSATING)
    reasons = sorted({s.reason for s in steps if s.reason}, key=_final_first)
    if reasons:
        busy = reasons[0] in sql.BUSY_REASONS
        return MoveResult(BUSY if busy else CANNOT, reasons[0])
    if plan.decided:
        refused = _misfit(cursor, plan, run, migration_id, actor)
        if refused is not None:
            return refused
    renames, entered = _renames(cursor, plan, run)
    outputs = _renamed_outputs(run, plan.targets)
    cursor.execute(sql.FAILED_STEP_IDS, {"run": run.id})
    failed_before = [row["id"] for row in fetch_dicts(cursor)]
    cursor.execute(
        sql.MIGRATE_RUN,
        {"to": plan.to_version.pk, "from": plan.from_version.pk, "id": run.id,
         "outputs": Jsonb(outputs), "entered": Jsonb(entered)},
    )  # fmt: skip
    if cursor.rowcount != 1:
        raise RuntimeError(f"run {run.id} changed under its lock")
    _rename_rows(cursor, renames)
    decider = deciding_step(plan.to_version.definition) if plan.decided else None
    if decider is not None:
        cursor.execute(sql.WAKE_DEFERRED_DECIDER, {"run": run.id, "decider_type": decider["type"]})
    moved_away = [s for s in steps if s.how == "move_to"]
    event = _migrated_event(plan, run, steps, renames, migration_id, actor, failed_before)
    insert_events(cursor, [event])
    if moved_away:
        run.version_id, run.outputs, run.entered = plan.to_version.pk, outputs, entered
        _re_enter(cursor, plan, run, moved_away, actor)
    if migration_id is not None:
        cursor.execute(sql.COUNT_MOVED, {"id": migration_id})
    return MoveResult(MOVED)


def _moved_by_jobs(cursor: Any, run: RunState, migration_id: int, actor: str) -> MoveResult | None:
    """Before any filter: this job moved the run already (``already_moved``, wherever it is
    now), or another migration moved it since this job was made (skipped; recorded once in
    the run's history as ``run.migration_skipped``, with the job and the reason)."""
    cursor.execute(sql.MOVES_SINCE_JOB, {"run": run.id, "migration": migration_id})
    seen = fetch_dicts(cursor)
    mine = str(migration_id)
    if any(e["kind"] == "run.migrated" and e["migration"] == mine for e in seen):
        return MoveResult(ALREADY)
    if not any(e["kind"] == "run.migrated" for e in seen):
        return None
    if not any(e["kind"] == "run.migration_skipped" and e["migration"] == mine for e in seen):
        detail = {"migration": migration_id, "reason": MOVED_BY_ANOTHER, "by": actor}
        insert_events(cursor, [event_row(run.org_id, run.id, "run.migration_skipped",
                                         worker=actor, detail=detail)])  # fmt: skip
    return MoveResult(SKIPPED, MOVED_BY_ANOTHER)


def _misfit(
    cursor: Any, plan: MigrationPlan, run: RunState, migration_id: int | None, actor: str
) -> MoveResult | None:
    """A code run whose history the new version's code does not fit stays (CANNOT, with the
    refusal's code), the refusal recorded in its history for its run page."""
    definition = definition_for(plan.to_version.pk)
    decided = replays_of(definition)
    assert decided is not None  # the plan checked both versions (plan._decided)
    misfit = decided[1].misfit(run, definition)
    if misfit is None:
        return None
    code = misfit.partition(":")[0]
    detail = {
        "migration": migration_id,
        "by": actor,
        "code": code,
        "detail": misfit,
        "from_version": plan.from_version.number,
        "to_version": plan.to_version.number,
    }
    insert_events(cursor, [event_row(run.org_id, run.id, "run.migration_refused", worker=actor,
                                     detail=detail)])  # fmt: skip
    return MoveResult(CANNOT, code, misfit=True)


def _compensating(cursor: Any, run_id: int) -> bool:
    cursor.execute(sql.RUN_COMPENSATING, {"run": run_id})
    return cursor.fetchone() is not None


def _classified(plan: MigrationPlan, row: Mapping[str, Any]) -> LiveStep:
    """The same rules as sql.migration's verdicts, on the row as it is under the lock."""
    step_id = row["step_id"]
    how: str | None = None
    target: str | None = None
    reason: str | None = None
    if step_id in plan.targets:
        how, target = "mapped", plan.targets[step_id]
    elif plan.decided:  # the step the run's code asked for: its id in the new code too
        how, target = "mapped", step_id
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


@dataclass(frozen=True)
class Renames:
    """The step rows a move renames (live and finished), in the order they are renamed."""

    rows: list[StepRename]
    finished: int  # of them, rows of finished step executions
    trading: bool  # some row takes an (id, iteration) another renamed row leaves


def _renames(cursor: Any, plan: MigrationPlan, run: RunState) -> tuple[Renames, dict[str, int]]:
    """Every row of the run whose step id changes (live or finished; no step runs), each with
    the iteration it takes: its own, unless a row keeping that id (or one renamed onto it
    before) has it, then the next after every row and count of that id. And the run's loop
    counts under the new ids: a new id's is the largest of its own (when it keeps it), those
    of the ids renamed onto it, and the iterations its rows now have."""
    renamed = {old: new for old, new in plan.targets.items() if old != new}
    entered = {k: v for k, v in run.entered.items() if k not in renamed}
    for old_id in sorted(renamed):
        if old_id in run.entered:
            new_id = renamed[old_id]
            entered[new_id] = max(entered.get(new_id, 0), run.entered[old_id])
    if not renamed:
        return Renames([], 0, trading=False), entered
    ids = sorted(set(renamed) | set(renamed.values()))
    cursor.execute(sql.STEP_ROWS, {"run": run.id, "ids": ids})
    rows = fetch_dicts(cursor)
    used: dict[str, set[int]] = {}
    for row in rows:
        if row["step_id"] not in renamed:  # keeps its id (and its iteration)
            used.setdefault(row["step_id"], set()).add(row["iteration"])
    leaving = {(r["step_id"], r["iteration"]) for r in rows if r["step_id"] in renamed}
    result: list[StepRename] = []
    finished = 0
    for row in rows:
        if row["step_id"] not in renamed:
            continue
        target = renamed[row["step_id"]]
        taken = used.setdefault(target, set())
        iteration = row["iteration"]
        if iteration in taken:
            iteration = max([*taken, entered.get(target, 0)]) + 1
        taken.add(iteration)
        entered[target] = max(entered.get(target, 0), iteration)
        finished += row["status"] not in STEP_LIVE
        result.append(
            StepRename(
                org_id=run.org_id, run_id=run.id, step_pk=row["id"], step_id=row["step_id"],
                iteration=row["iteration"], new_step_id=target, new_iteration=iteration,
            )
        )  # fmt: skip
    trading = any((r.new_step_id, r.new_iteration) in leaving for r in result)
    return Renames(result, finished, trading), entered


def _rename_rows(cursor: Any, renames: Renames) -> None:
    """Each row and what the apps keep for it take the new id; rows trading ids pass through
    a temporary id each first, so no two rows share an (id, iteration) at any statement."""
    steps = renames.rows
    if renames.trading:
        parked = [replace(r, new_step_id=TEMPORARY_ID.format(pk=r.step_pk)) for r in steps]
        for rename in parked:
            _rename_one(cursor, replace(rename, new_iteration=rename.iteration))
        steps = [replace(r, step_id=p.new_step_id) for r, p in zip(steps, parked, strict=True)]
    for rename in steps:
        _rename_one(cursor, rename)


def _rename_one(cursor: Any, rename: StepRename) -> None:
    cursor.execute(sql.RENAME_STEP, rename.params())
    if cursor.rowcount != 1:
        raise RuntimeError(f"step {rename.step_pk} changed under its run's lock")
    rename_everywhere(cursor, rename)


def _renamed_outputs(run: RunState, targets: Mapping[str, str]) -> dict[str, Any]:
    """The run's outputs under the new version's ids: a mapped step's under its new id (a step
    the new version calls by the same id keeps its own), the others as they were. The new
    version's templates (``steps.<id>``) read them."""
    outputs = {k: v for k, v in run.outputs.items() if k not in targets}
    for old_id in sorted(targets, key=lambda old: targets[old] == old):  # identity last: wins
        if old_id in run.outputs:
            outputs[targets[old_id]] = run.outputs[old_id]
    return outputs


def _migrated_event(
    plan: MigrationPlan,
    run: RunState,
    steps: list[LiveStep],
    renames: Renames,
    migration_id: int | None,
    actor: str,
    failed_before: list[int],
) -> Any:
    renamed = {r.step_pk: r for r in renames.rows}
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
        "finished_renamed": renames.finished, "failed_before": failed_before,
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
