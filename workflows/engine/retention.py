"""Retention: finished runs leave the hot tables after a configurable time.

A run that finished (succeeded, failed, cancelled) more than RETENTION_DAYS ago is deleted
with its steps and history, in batches of one transaction each, oldest first. The claim and
the sweep never read finished rows (their indexes hold live work only), so retention keeps
the tables, their indexes and vacuum small rather than the hot paths fast. 0 keeps runs
forever. The sweep runs it about once a minute; `manage.py purge_runs` runs it on demand.
"""

from __future__ import annotations

from django.db import connection, transaction

from . import sql
from .lanes import engine_setting
from .sql.rows import fetch_dicts


def retention_seconds() -> float:
    return float(engine_setting("RETENTION_DAYS")) * 86_400


def purge_finished_runs(
    *, older_than_seconds: float | None = None, batch: int = 500, max_batches: int = 20
) -> int:
    """Delete up to ``batch * max_batches`` runs that finished long enough ago; return how many
    runs were deleted. Nothing when retention is off (0 days) and no age is given."""
    age = retention_seconds() if older_than_seconds is None else older_than_seconds
    if age <= 0:
        return 0
    purged = 0
    for _ in range(max_batches):
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql.FINISHED_RUNS_BEFORE, {"age": age, "batch": batch})
            ids = [row["id"] for row in fetch_dicts(cursor)]
            if not ids:
                break
            cursor.execute(sql.PURGE_RUN_EVENTS, {"ids": ids})
            cursor.execute(sql.PURGE_RUN_STEPS, {"ids": ids})
            cursor.execute(sql.PURGE_RUNS, {"ids": ids})
            purged += cursor.rowcount
        if len(ids) < batch:
            break
    return purged
