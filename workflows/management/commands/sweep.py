from typing import Any

from django.core.management.base import BaseCommand

from workflows.engine.signals import wait_for_stop_signal


class Command(BaseCommand):
    help = "The due sweep for timers. A placeholder until the timers issue: it only idles."

    def handle(self, *args: Any, **options: Any) -> None:
        wait_for_stop_signal(lambda stop: stop.wait())
