from typing import Any

from django.core.management.base import BaseCommand

from workflows.engine.processes import engine_process
from workflows.engine.relay import run_relay
from workflows.engine.stop_signals import wait_for_stop_signal


class Command(BaseCommand):
    help = "Publish committed outbox rows (wake-ups) through the transport until stopped."

    def handle(self, *args: Any, **options: Any) -> None:
        with engine_process("relay"):
            wait_for_stop_signal(run_relay)
