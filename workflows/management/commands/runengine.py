import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from workflows.engine.supervisor import Child, Supervisor


class Command(BaseCommand):
    help = "Run every Waymark role for one machine under one supervisor (web for now)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("WAYMARK_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("WAYMARK_PORT", "8000")))
        parser.add_argument("--web-workers", type=int, default=2)
        parser.add_argument("--grace", type=float, default=10.0)

    def handle(self, *args: Any, host: str, port: int, web_workers: int, grace: float,
               **options: Any) -> None:
        gunicorn = [
            sys.executable, "-m", "gunicorn", "config.wsgi:application",
            "--bind", f"{host}:{port}", "--workers", str(web_workers),
            "--access-logfile", "-", "--graceful-timeout", str(int(grace)),
        ]
        Supervisor([Child("web", gunicorn)], grace_seconds=grace).run()
