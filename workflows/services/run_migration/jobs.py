"""Migration jobs: made from a checked plan, applied run by run, resumable by their id.

A job reads the runs to try from the plan's verdicts (``sql.CANDIDATES``: on the old version,
matching the filter, movable or only put off for now), in run id order, and moves each in a
transaction of its own (``move.py``). Nothing of the job's progress lives in a process: the
runs it moved are on the new version with a ``run.migrated`` event naming it (so the
candidates no longer list them, and a move that finds one says ``already_moved``), and its
``moved`` count grew with each move. A job stopped at any line (its process killed, a call's
``limit`` reached) is resumed by calling it again with its id: it goes on with the runs still
to move and never moves one twice.

Runs put off (a step running, a walk between steps, a row someone else held) are tried again
after the others, a few times with a growing pause; those still put off are reported. When
no run is left to try, the job is ``finished`` and its ``report`` is the dry run of what it
left on the old version: which runs, at which steps, and why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models.functions import Now

from ...engine.sql import migration as sql
from ...engine.sql.rows import fetch_dicts
from ...errors import UnknownMigration
from ...models import MigrationStatus, Organisation, RunMigration
from ...selectors import automation_get
from ..audit import Actor, as_actor, record_audit
from .move import BUSY, MOVED, move_run
from .plan import MigrationPlan, plan_from_job
from .report import dry_run

BATCH = 500  # candidates read at once
# Pauses before each new try of the runs put off (seconds): about 4 s in all, enough for a
# step to settle or a timer batch to commit, short enough for a request to wait for.
BUSY_PAUSES = (0.1, 0.25, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class JobProgress:
    job: RunMigration
    moved_now: int  # runs this call moved
    more: bool  # this call stopped at its limit: call again with the job's id


def migration_start(
    *,
    plan: MigrationPlan,
    actor: Actor | str,
    limit: int | None = None,
    started: Callable[[RunMigration], None] | None = None,
) -> JobProgress:
    """Make the job (with the dry run it starts from; audited as ``run_migration.start``) and
    apply it, trying at most ``limit`` runs in this call (None: all). ``started``: told the
    job once it exists, before any run moves (a command prints its id, to resume it by)."""
    who = as_actor(actor)
    planned = dry_run(plan)
    with transaction.atomic():
        job = RunMigration.objects.create(
            org=plan.org, automation=plan.automation, from_version=plan.from_version,
            to_version=plan.to_version, plan=plan.as_json(), planned=planned.as_json(),
            created_by=who.label[:150],
        )  # fmt: skip
        record_audit(
            org=plan.org, actor=who, action="run_migration.start", target_type="run_migration",
            target_id=job.pk, detail={**plan.audited(), "would_move": planned.would_move},
        )  # fmt: skip
    if started is not None:
        started(job)
    return _apply(job, plan, who, limit)


def migration_resume(
    *, org: Organisation, automation_slug: str, migration_id: int, actor: Actor | str,
    limit: int | None = None,
) -> JobProgress:  # fmt: skip
    """Go on with a job that was stopped (audited as ``run_migration.resume``); a finished one
    is answered as it is."""
    who = as_actor(actor)
    job = migration_get(org=org, automation_slug=automation_slug, migration_id=migration_id)
    if job.status == MigrationStatus.FINISHED:
        return JobProgress(job, 0, more=False)
    plan = plan_from_job(job)
    with transaction.atomic():
        record_audit(org=org, actor=who, action="run_migration.resume",
                     target_type="run_migration", target_id=job.pk,
                     detail={"moved_before": job.moved})  # fmt: skip
    return _apply(job, plan, who, limit)


def migration_get(*, org: Organisation, automation_slug: str, migration_id: int) -> RunMigration:
    automation = automation_get(org=org, slug=automation_slug)
    job = (
        RunMigration.objects.select_related("org", "automation", "from_version", "to_version")
        .filter(org=org, automation=automation, pk=migration_id)
        .first()
    )
    if job is None:
        raise UnknownMigration(migration_id=migration_id)
    return job


def _apply(job: RunMigration, plan: MigrationPlan, actor: Actor, limit: int | None) -> JobProgress:
    moved = 0
    tried = 0
    put_off: list[int] = []
    misfits: dict[str, list[int]] = {}  # code runs the new code does not fit, by reason
    after = 0
    while batch := _candidates(plan, after):
        for run_id in batch:
            if limit is not None and tried >= limit:
                job.refresh_from_db()
                return JobProgress(job, moved, more=True)
            tried += 1
            result = move_run(plan, run_id, migration_id=job.pk, actor=actor)
            moved += result.outcome == MOVED
            if result.outcome == BUSY:
                put_off.append(run_id)
            if result.misfit:
                misfits.setdefault(str(result.reason), []).append(run_id)
        after = batch[-1]
    for pause in BUSY_PAUSES:
        if not put_off:
            break
        time.sleep(pause)  # a step settling, a batch committing: no event to wait for here
        still = []
        for run_id in put_off:
            result = move_run(plan, run_id, migration_id=job.pk, actor=actor)
            moved += result.outcome == MOVED
            if result.outcome == BUSY:
                still.append(run_id)
            if result.misfit:
                misfits.setdefault(str(result.reason), []).append(run_id)
        put_off = still
    _finish(job, plan, misfits)
    return JobProgress(job, moved, more=False)


def _candidates(plan: MigrationPlan, after: int) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(sql.CANDIDATES, {**plan.sql_params(after=after), "n": BATCH})
        return [row["run_id"] for row in fetch_dicts(cursor)]


def _finish(job: RunMigration, plan: MigrationPlan, misfits: dict[str, list[int]]) -> None:
    # The runs its moves refused on a dry replay, as the report says (they are not replayed
    # again for it).
    report = dry_run(plan, misfits=misfits).as_json()
    RunMigration.objects.filter(pk=job.pk).update(
        status=MigrationStatus.FINISHED, report=report, finished_at=Now(), updated_at=Now()
    )
    job.refresh_from_db()
