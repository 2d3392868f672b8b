from typing import Any

from django.core.management.base import BaseCommand

from workflows.engine.stop_signals import wait_for_stop_signal
from workflows.engine.sweep import run_sweep


class Command(BaseCommand):
    help = "Fire passed deadlines of waiting steps and make due retries ready, until stopped."

    def handle(self, *args: Any, **options: Any) -> None:
        wait_for_stop_signal(run_sweep)
