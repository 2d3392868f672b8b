"""A small process supervisor for ``manage.py runengine`` on one machine.

Each role (web, relay, sweep, one worker per lane) runs as its own child process, so a crash
or a kill in one never takes another down. A child that dies is restarted after a short
backoff, unless it exits with ``EXIT_CONFIG`` (78, sysexits' EX_CONFIG): restarting a
misconfigured child cannot help, so the supervisor stops every child and reports it. SIGTERM
or SIGINT stops every child with SIGTERM, waits for the grace period, then kills what is left.

The children start with SIGINT blocked (the signal mask is inherited through fork and exec):
a Ctrl-C in a terminal goes to the whole process group, and a child still loading Django would
print a KeyboardInterrupt traceback and die. SIGINT is the supervisor's alone; it stops its
children with SIGTERM, which each handles (or, still loading, dies of quietly).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from waymark_config.exit_codes import EXIT_CONFIG

from .processes import ROLE_ENV
from .stop_signals import on_stop_signal

logger = logging.getLogger(__name__)

__all__ = ["EXIT_CONFIG", "Child", "Supervisor"]


@dataclass
class Child:
    name: str
    argv: Sequence[str]
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = field(default=0.0)
    # Descriptors the child inherits (the web's listening socket).
    pass_fds: Sequence[int] = ()
    # What the child is to the engine (web, worker-io, relay, ...: processes.py), given to it
    # as WAYMARK_PROCESS_ROLE: its database connections and its spans are named by it.
    role: str = ""

    def start(self) -> None:
        env = {**os.environ, ROLE_ENV: self.role} if self.role else None
        # Blocked, not ignored, in this thread only while the child is made: a SIGINT that
        # comes meanwhile waits to be delivered here (or reaches another thread), never lost.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.process = subprocess.Popen(  # noqa: S603
                list(self.argv), pass_fds=tuple(self.pass_fds), env=env
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self.started_at = time.monotonic()
        logger.info("started %s (pid %s)", self.name, self.process.pid)


class Supervisor:
    def __init__(
        self,
        children: list[Child],
        *,
        grace_seconds: float = 10.0,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self.children = children
        self.grace_seconds = grace_seconds
        # Called with the pid of a child that exited on its own, before it is restarted
        # (runengine: the metrics' bookkeeping for a dead process).
        self.on_exit = on_exit
        self.stopping = threading.Event()
        self.failure: str | None = None
        # The stop signals received while supervising (their numbers), in order.
        self.signals: list[int] = []

    def run(self) -> str | None:
        """Supervise until stopped; returns why it stopped on its own (a misconfigured
        child), or None after SIGTERM or SIGINT (``signals`` says which)."""
        with on_stop_signal(self.stopping.set, received=self.signals):
            try:
                for child in self.children:
                    child.start()
                while not self.stopping.wait(0.5):
                    self._restart_dead()
            finally:
                if self.signals:
                    name = signal.Signals(self.signals[0]).name
                    logger.info("%s: stopping every process (at most %.0fs)", name,
                                self.grace_seconds)  # fmt: skip
                self._stop_all()
        return self.failure

    def _restart_dead(self) -> None:
        for child in self.children:
            assert child.process is not None
            code = child.process.poll()
            if code is None:
                continue
            if self.on_exit is not None:
                self.on_exit(child.process.pid)
            if code == EXIT_CONFIG:
                self.failure = f"{child.name} exited with {code} (misconfigured); stopping"
                self.stopping.set()
                return
            # Back off when a child keeps dying at start-up, so a broken child cannot spin.
            delay = min(30.0, 0.5 * 2 ** min(child.restarts, 6))
            if time.monotonic() - child.started_at > 60:
                child.restarts, delay = 0, 0.5
            logger.warning("%s exited with %s; restarting in %.1fs", child.name, code, delay)
            if self.stopping.wait(delay):
                return
            child.restarts += 1
            child.start()

    def _stop_all(self) -> None:
        live = [c for c in self.children if c.process and c.process.poll() is None]
        for child in live:
            assert child.process is not None
            child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_seconds
        for child in live:
            assert child.process is not None
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning(
                    "%s did not stop in %.0fs; killing it", child.name, self.grace_seconds
                )
                child.process.kill()
                child.process.wait()
