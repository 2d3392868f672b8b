from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from waymark_config.embedded_db.server import (
    ServerStillRunning,
    server_status,
    start_server,
    stop_server,
)


class Command(BaseCommand):
    help = (
        "Start, stop or show the embedded PostgreSQL server (data under .data/postgres). "
        "A stopped server stays stopped until `embedded_db start`: running engines wait for it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["start", "stop", "status"])

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        db = settings.DATABASES["default"]
        if "EMBEDDED_DATA_DIR" not in db:
            raise CommandError("not_embedded: DATABASE_URL is set; this server is not embedded")
        data_dir = Path(db["EMBEDDED_DATA_DIR"])
        if action == "start":
            try:
                address = start_server(data_dir)
            except psycopg.OperationalError as failed:
                raise CommandError(f"not_started: {failed}") from None
            self.stdout.write(f"running: {address.uri(db['NAME'])}")
        elif action == "stop":
            try:
                stopped = stop_server(data_dir)
            except (ServerStillRunning, psycopg.OperationalError) as failed:
                raise CommandError(f"not_stopped: {failed}") from None
            self.stdout.write("stopped" if stopped else "not running")
        else:
            running = server_status(data_dir)
            self.stdout.write(
                f"running: {running.uri(db['NAME'])}" if running is not None else "not running"
            )
