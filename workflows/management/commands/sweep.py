from typing import Any

from django.core.management.base import BaseCommand

from workflows.engine.processes import engine_process
from workflows.engine.stop_signals import wait_for_stop_signal
from workflows.engine.sweeper import run_sweeper


class Command(BaseCommand):
    help = (
        "The sweep, until stopped: fire passed deadlines, make due retries ready, deliver late "
        "signals, delete runs past retention, and run the apps' sweep services and tasks (due "
        "timers, scheduled starts). Run any number: one at a time leads (a lease in the "
        "database)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        with engine_process("sweep"):
            wait_for_stop_signal(run_sweeper)
