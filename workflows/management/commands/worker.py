from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows.engine.lanes import WORKER_LANES, lane_policy
from workflows.engine.worker import Worker


class Command(BaseCommand):
    help = "Claim and run the steps of one lane until SIGTERM (then hand running steps back)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--lane", required=True, choices=WORKER_LANES)
        parser.add_argument("--concurrency", type=int, default=None)
        parser.add_argument("--grace", type=float, default=None, help="shutdown grace, seconds")

    def handle(self, *args: Any, lane: str, concurrency: int | None, grace: float | None,
               **options: Any) -> None:  # fmt: skip
        if concurrency is not None and concurrency < 1:
            raise CommandError("invalid_concurrency: --concurrency must be at least 1")
        Worker(lane_policy(lane), concurrency=concurrency, grace_seconds=grace).run()
