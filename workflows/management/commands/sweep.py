import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "The due sweep for timers. A placeholder until the timers issue: it only idles."

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        stop.wait()
