"""Migrating runs between versions of an automation (docs/how-to/change-an-automation-in-flight.md):
a checked plan (``plan.py``), its dry run in SQL (``report.py``), each run's move under its lock
(``move.py``), and the resumable job that applies a plan run by run (``jobs.py``). The API, the
admin and ``manage.py migrate_runs`` call these and nothing else."""

from .jobs import JobProgress, migration_get, migration_resume, migration_start
from .plan import MAX_STEP_ID, STAY, MigrationPlan, RemovedRule, migration_plan
from .report import REASONS, DryRun, dry_run

__all__ = [
    "MAX_STEP_ID",
    "REASONS",
    "STAY",
    "DryRun",
    "JobProgress",
    "MigrationPlan",
    "RemovedRule",
    "dry_run",
    "migration_get",
    "migration_plan",
    "migration_resume",
    "migration_start",
]
