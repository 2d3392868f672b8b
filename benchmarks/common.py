"""What the benchmark scripts share: Django on a database of their own, the side-by-side
shape, and the server's commit count. Import it first, then call ``setup``, then import the
project (its modules need Django set up)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# The side-by-side harness's shape (../shared/bench): three no-op io steps.
THREE_IO: dict[str, Any] = {
    "start": "a",
    "steps": [
        {"id": "a", "type": "noop", "next": "b"},
        {"id": "b", "type": "noop", "next": "c"},
        {"id": "c", "type": "noop", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


def setup(database: str, **environment: str) -> None:
    """Django with the project's settings, on ``database`` (WAYMARK_DB_NAME wins), quiet, with
    no statement timeout (benchmarks fill tables), and the migrations applied."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("WAYMARK_DB_NAME", database)
    os.environ.setdefault("WAYMARK_LOG_LEVEL", "WARNING")
    os.environ.setdefault("WAYMARK_DB_STATEMENT_TIMEOUT_MS", "0")
    for name, value in environment.items():
        os.environ.setdefault(name, value)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def commits() -> int:
    """Transactions the server has committed in this database so far (pg_stat_database)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0
