import http.client
import os
import signal
import socket
import sys
import threading
from typing import Any, TextIO

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from waymark_config.exit_codes import exit_interrupted
from waymark_config.web import PortInUse, bind, web_argv
from workflows.engine.lanes import WORKER_LANES, lane_policy
from workflows.engine.scrape import multiprocess_directory, process_died
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
        parser.add_argument(
            "--web-workers",
            type=int,
            default=None,
            help="web processes (default WAYMARK_WEB_PROCESSES, 2)",
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=10.0,
            help="seconds running steps (and web requests) get to finish on shutdown",
        )
        roles = parser.add_mutually_exclusive_group()
        roles.add_argument("--no-web", action="store_true", help="engine roles only")
        roles.add_argument("--web-only", action="store_true", help="the web server only")
        parser.add_argument(
            "--demo-runs", type=int, default=0, help="start this many demo runs and show them"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        # Every child records its metrics in one directory, which the web's /metrics sums.
        with multiprocess_directory():
            self._supervise(opts)

    def _supervise(self, opts: dict[str, Any]) -> None:
        children = [] if opts["web_only"] else engine_children(opts["grace"])
        listener = None
        if not opts["no_web"]:
            # Bound here, before any child starts: a taken port stops runengine at once.
            try:
                listener = bind(opts["host"], opts["port"])
            except PortInUse as error:
                raise CommandError(str(error)) from error
            processes = opts["web_workers"] or settings.WAYMARK_WEB["PROCESSES"]
            children[:0] = web_children(listener, processes, opts["grace"])
        supervisor = Supervisor(
            children, grace_seconds=opts["grace"] + RELEASE_MARGIN_SECONDS, on_exit=process_died
        )
        if listener is not None:
            self._background(announce_ready, opts["host"], opts["port"], self.stdout, supervisor)
        if opts["demo_runs"]:
            from workflows.demo.runs import show_demo_runs

            self._background(show_demo_runs, opts["demo_runs"], self.stdout, supervisor.stopping)
        try:
            failure = supervisor.run()
        finally:
            if listener is not None:
                listener.close()
        if failure:
            raise CommandError(failure)
        if signal.SIGINT in supervisor.signals:
            # Ctrl-C: every process has stopped; the same line and status as a Ctrl-C that
            # comes before the supervisor runs (manage.py).
            # (Not a CommandError, whose "CommandError:" would read as a failure.)
            exit_interrupted("every process has stopped")

    @staticmethod
    def _background(target: Any, *args: Any) -> None:
        threading.Thread(target=target, args=args, daemon=True).start()


def web_children(listener: socket.socket, processes: int, grace: float) -> list[Child]:
    """Web processes sharing ``listener``: each accepts on it, so one that dies or restarts
    leaves the others serving."""
    fd = listener.fileno()
    return [
        Child(f"web-{number}", web_argv(fd, grace), pass_fds=(fd,), role="web")
        for number in range(processes)
    ]


def engine_children(grace: float) -> list[Child]:
    manage = [sys.executable, manage_script()]
    return [
        Child("relay", [*manage, "relay"], role="relay"),
        Child("sweep", [*manage, "sweep"], role="sweep"),
        *[
            Child(
                f"worker-{lane}" + (f"-{number}" if number else ""),
                [*manage, "worker", "--lane", lane, "--grace", str(grace)],
                role=f"worker-{lane}",
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
                [*manage, "worker", "--lane", lane, "--suspects-only", "--grace", str(grace)],
                role=f"worker-{lane}-suspects",
            )
            for lane in WORKER_LANES
        ],
    ]


def manage_script() -> str:
    """The management script this process was started with (the project's manage.py, or
    django-admin), as an absolute path: the children run it again with their own role from
    whatever directory the host was started in (``python /srv/app/manage.py runengine`` from
    ``/``), which a bare ``manage.py`` would look for in the working directory."""
    return os.path.abspath(sys.argv[0])


def announce_ready(host: str, port: int, out: TextIO, supervisor: Supervisor) -> None:
    """Print "ready" once the web answers HTTP: not when it was merely started. Any answer
    counts (a Host not in ALLOWED_HOSTS gets 400, from a server that is serving)."""
    probe = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
    while not supervisor.stopping.wait(0.2):
        try:
            connection = http.client.HTTPConnection(probe, port, timeout=5)
            connection.request("GET", "/livez")
            connection.getresponse()
            connection.close()
        except (OSError, http.client.HTTPException):
            continue
        else:
            shown = f"[{host}]" if ":" in host else host
            out.write(f"Waymark is ready: http://{shown}:{port}/ (admin /admin/, API /api/v1/)\n")
            return
