from typing import Any

from django.core.management.base import BaseCommand

from timers.sweep import run_sweeper
from workflows.plugins.engine import wait_for_stop_signal


class Command(BaseCommand):
    help = (
        "The due sweep, until stopped: fire due timers fairly and on time, fire passed "
        "deadlines, make due retries ready, start scheduled runs, delete runs past retention. "
        "Run any number: one at a time leads (a lease in the database)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        wait_for_stop_signal(run_sweeper)
