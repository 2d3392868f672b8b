"""What Waymark's management commands share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

from ..definitions.storable import UNSTORABLE_REASON, has_unstorable

# The longest span, in days, a command takes (--older-than-days, --expires-in-days): a hundred
# years. Far beyond it a date overflows Python's datetime or PostgreSQL's interval.
MAX_DAYS = 36_500


class MigratedCommand(BaseCommand):
    """A command that reads or writes Waymark's tables. On a database whose migrations are not
    all applied (a fresh checkout before its first `./waymark run`, a deploy that skipped
    `migrate`) it stops at once with ``database_not_migrated`` and what to run, instead of a
    ProgrammingError traceback from its first query. Migrations the database has and this code
    lacks (older code on a newer schema) are not counted: only what this code needs.

    Not for runengine and the processes it supervises: they must start while the database is
    unreachable (the web answers /livez, the others retry), which a check at start cannot."""

    requires_migrations_checks = True

    def execute(self, *args: Any, **options: Any) -> Any:
        # An argument the database cannot hold (bytes that are not UTF-8 arrive as lone
        # surrogates; a NUL) stops here with its option's name, not a UnicodeEncodeError
        # traceback from the first query that carries it.
        for name, value in [*((f"argument {n}", a) for n, a in enumerate(args, 1)),
                            *options.items()]:  # fmt: skip
            for each in value if isinstance(value, list | tuple) else [value]:
                if isinstance(each, str) and has_unstorable(each):
                    raise CommandError(f"invalid_input: {name}: {UNSTORABLE_REASON}")
        return super().execute(*args, **options)

    def check_migrations(self) -> None:
        executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if plan:
            apps = ", ".join(sorted({migration.app_label for migration, _ in plan}))
            raise CommandError(
                f"database_not_migrated: {len(plan)} migration(s) not applied ({apps}); "
                "run `manage.py migrate` first (in Waymark's own checkout `./waymark manage "
                "migrate`, which `./waymark run` does)"
            )


def read_json_file(path: str | Path, code: str) -> Any:
    """The JSON a file holds, read as the API reads a body: NaN and Infinity (which
    PostgreSQL's json refuses) and nesting too deep to read are the file's error, a
    ``CommandError`` starting with ``code``, never a traceback."""
    try:
        with open(path, encoding="utf-8") as given:
            return json.load(given, parse_constant=_not_json)
    except (OSError, ValueError) as exc:
        raise CommandError(f"{code}: {path}: {exc}") from exc
    except RecursionError as exc:
        raise CommandError(f"{code}: {path}: the document nests too deeply") from exc


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")
