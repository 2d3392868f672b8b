import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand

from workflows.engine.relay import run_relay


class Command(BaseCommand):
    help = "Publish committed outbox rows (wake-ups) through the transport until stopped."

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        run_relay(stop)
