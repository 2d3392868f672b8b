import os
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from workflows.engine.lanes import WORKER_LANES, lane_policy
from workflows.engine.supervisor import Child, Supervisor

# Beyond the grace, how long a stopping worker gets to hand its remaining steps back before
# the supervisor kills it. Killing it earlier would leave those steps to wait out their leases.
RELEASE_MARGIN_SECONDS = 5.0


class Command(BaseCommand):
    help = (
        "Run web, relay, sweep, one worker and one suspects-only worker per lane on this "
        "machine, supervised."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("WAYMARK_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("WAYMARK_PORT", "8000")))
        parser.add_argument("--web-workers", type=int, default=2)
        parser.add_argument(
            "--grace",
            type=float,
            default=10.0,
            help="seconds running steps (and web requests) get to finish on shutdown",
        )
        parser.add_argument("--no-web", action="store_true", help="engine roles only")
        parser.add_argument(
            "--demo-runs", type=int, default=0, help="start this many demo runs and show them"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        manage = [sys.executable, "manage.py"]
        children = [
            Child("relay", [*manage, "relay"]),
            Child("sweep", [*manage, "sweep"]),
            *[
                Child(
                    f"worker-{lane}" + (f"-{number}" if number else ""),
                    [*manage, "worker", "--lane", lane, "--grace", str(opts["grace"])],
                )
                for lane in WORKER_LANES
                for number in range(lane_policy(lane).processes)
            ],
            # One suspects-only worker per lane: a step whose last attempt never settled runs
            # alone there, so a poison step cannot take healthy steps down with it, and
            # suspects are not starved while the lane's worker is busy.
            *[
                Child(
                    f"suspects-{lane}",
                    [
                        *manage,
                        "worker",
                        "--lane",
                        lane,
                        "--suspects-only",
                        "--grace",
                        str(opts["grace"]),
                    ],
                )
                for lane in WORKER_LANES
            ],
        ]
        if not opts["no_web"]:
            children.insert(0, Child("web", [
                sys.executable, "-m", "gunicorn", "config.wsgi:application",
                "--bind", f"{opts['host']}:{opts['port']}", "--workers", str(opts["web_workers"]),
                "--access-logfile", "-", "--graceful-timeout", str(int(opts["grace"])),
            ]))  # fmt: skip
        supervisor = Supervisor(children, grace_seconds=opts["grace"] + RELEASE_MARGIN_SECONDS)
        if opts["demo_runs"]:
            from workflows.demo.runs import show_demo_runs

            threading.Thread(
                target=show_demo_runs,
                args=(opts["demo_runs"], self.stdout, supervisor.stopping),
                daemon=True,
            ).start()
        supervisor.run()
