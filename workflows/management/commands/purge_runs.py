from typing import Any

from django.core.management.base import CommandError, CommandParser

from workflows.engine.retention import purge_finished_runs, retention_seconds
from workflows.management.base import MAX_DAYS, MigratedCommand


class Command(MigratedCommand):
    help = (
        "Delete finished runs (with their steps and history) that finished more than "
        "--older-than-days ago (default: WAYMARK_RETENTION_DAYS), in batches."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than-days", type=float, default=None)

    def handle(self, *args: Any, older_than_days: float | None, **options: Any) -> None:
        if older_than_days is not None and not 0 <= older_than_days <= MAX_DAYS:  # nan too
            raise CommandError(f"invalid_age: --older-than-days must be from 0 to {MAX_DAYS}")
        age = retention_seconds() if older_than_days is None else older_than_days * 86_400
        if age <= 0 and older_than_days is None:
            self.stdout.write("retention is off (WAYMARK_RETENTION_DAYS=0): nothing deleted")
            return
        total = 0
        while purged := purge_finished_runs(older_than_seconds=age):
            total += purged
        self.stdout.write(f"{total} finished run(s) deleted")
