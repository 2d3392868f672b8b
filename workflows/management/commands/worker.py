import os
import sys
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows.engine.lanes import WORKER_LANES, lane_policy
from workflows.engine.processes import engine_process
from workflows.engine.worker import EXIT_REPLACE_ME, Worker


class Command(BaseCommand):
    help = "Claim and run the steps of one lane until SIGTERM (then hand running steps back)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--lane", required=True, choices=WORKER_LANES)
        parser.add_argument("--concurrency", type=int, default=None)
        parser.add_argument("--grace", type=float, default=None, help="shutdown grace, seconds")
        parser.add_argument(
            "--suspects-only",
            action="store_true",
            help="run only suspects (steps whose last attempt never settled), one at a time",
        )

    def handle(self, *args: Any, lane: str, concurrency: int | None, grace: float | None,
               suspects_only: bool, **options: Any) -> None:  # fmt: skip
        if concurrency is not None and concurrency < 1:
            raise CommandError("invalid_concurrency: --concurrency must be at least 1")
        lower_priority(settings.WAYMARK["WORKER_NICE"])
        with engine_process(f"worker-{lane}" + ("-suspects" if suspects_only else "")):
            worker = Worker(
                lane_policy(lane), concurrency=concurrency, grace_seconds=grace,
                suspects_only=suspects_only,
            )  # fmt: skip
            worker.run()
        if worker.replace_requested:
            # Hung executors cannot be stopped, only left behind: exit so the supervisor
            # (runengine, or systemd and the like) starts a fresh process with every slot.
            sys.exit(EXIT_REPLACE_ME)


def lower_priority(nice: int) -> None:
    """Lower this process's CPU priority by ``nice`` (WAYMARK_WORKER_NICE). A negative value
    raises it, which needs root or CAP_SYS_NICE: refused as a setting that cannot work
    (manage.py prints it in one line and exits with EXIT_CONFIG, on which runengine stops
    with the reason instead of restarting a worker that cannot start)."""
    if not nice:
        return
    try:
        os.nice(nice)
    except PermissionError:
        raise ImproperlyConfigured(
            f"invalid_worker_nice: WAYMARK_WORKER_NICE={nice} would raise the worker's CPU "
            "priority, which this user may not do (it needs root or CAP_SYS_NICE); "
            "set it to 0 or more"
        ) from None
