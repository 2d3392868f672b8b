from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from waymark_config.embedded_db.server import ensure_server, server_status, stop_server


class Command(BaseCommand):
    help = "Start, stop or show the embedded PostgreSQL server (data under .data/postgres)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["start", "stop", "status"])

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        db = settings.DATABASES["default"]
        if "EMBEDDED_DATA_DIR" not in db:
            raise CommandError("not_embedded: DATABASE_URL is set; this server is not embedded")
        data_dir = Path(db["EMBEDDED_DATA_DIR"])
        if action == "start":
            address = ensure_server(data_dir)
            self.stdout.write(f"running: {address.uri(db['NAME'])}")
        elif action == "stop":
            stopped = stop_server(data_dir)
            self.stdout.write("stopped" if stopped else "not running")
        else:
            running = server_status(data_dir)
            self.stdout.write(
                f"running: {running.uri(db['NAME'])}" if running is not None else "not running"
            )
