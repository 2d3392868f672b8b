"""Real engine processes for the crash and race tests.

Workers and relays run as `manage.py` subprocesses against the test database, so a test can
SIGKILL or SIGTERM them at a chosen moment. Every wait is bounded: a test fails, it never hangs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

import psutil
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def engine_env(**overrides: str) -> dict[str, str]:
    """The environment for a child process: the test database, fast polling, short leases."""
    env = dict(os.environ)
    env.update(
        WAYMARK_DB_NAME=connection.settings_dict["NAME"],
        WAYMARK_EXTRA_STEP_MODULES="tests.probe_steps",  # the `probe` step type
        WAYMARK_WORKER_POLL_SECONDS="0.2",
        WAYMARK_RELAY_POLL_SECONDS="0.05",
        WAYMARK_IO_LEASE_SECONDS="2",
        WAYMARK_IO_BACKOFF_BASE_SECONDS="0.05",
        WAYMARK_IO_BACKOFF_CAP_SECONDS="0.2",
        WAYMARK_LOG_LEVEL="WARNING",
        # The stubs listen on 127.0.0.1: organisations may allowlist it
        # (waymark_config/settings_test).
        WAYMARK_EGRESS_ALLOWABLE="127.0.0.1/32",
        # A child that does not exit in time is sent SIGABRT (exit_code): with this, it
        # prints every thread's stack first, so the failure says where it was stuck.
        PYTHONFAULTHANDLER="1",
    )
    env.update(overrides)
    return env


def spawn(*args: str, **env_overrides: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=engine_env(**env_overrides),
    )


def spawn_worker(
    lane: str = "io", *, concurrency: int = 4, grace: float = 5.0, **env: str
) -> subprocess.Popen[bytes]:
    return spawn(
        "worker", "--lane", lane, "--concurrency", str(concurrency), "--grace", str(grace), **env
    )


def spawn_relay(**env: str) -> subprocess.Popen[bytes]:
    return spawn("relay", **env)


# How long wait_for waits by default: a bound for a failure, never a budget a passing test
# spends (it returns at the event). Generous, since on a loaded 2-core machine starting
# runengine's ten niced children alone took 30 s.
WAIT_BOUND_SECONDS = 120.0


def wait_for(
    predicate: Callable[[], T | None], *, timeout: float = WAIT_BOUND_SECONDS, what: str = ""
) -> T:
    """The predicate's first truthy value, polled until ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


# How long a child may take to exit once it was asked to (or to finish its one job): a bound
# for a failure again. Twenty Django processes starting at once on a loaded 2-core machine
# took over 60 s.
EXIT_BOUND_SECONDS = 300.0


def exit_code(process: subprocess.Popen[bytes], timeout: float = EXIT_BOUND_SECONDS) -> int:
    """The child's exit code once it exits. One that is still running after ``timeout`` is
    sent SIGABRT, which makes it print its threads' stacks (PYTHONFAULTHANDLER) to its
    stderr, and the test fails saying so: a hang is reported with where it hung."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        _, err = process.communicate(timeout=30)
        stacks = err.decode(errors="replace") if err else "in its stderr"
        raise AssertionError(
            f"{process.args!r} still running after {timeout:g}s; its stacks: {stacks}"
        ) from None


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15) -> int:
    if process.poll() is None:
        process.send_signal(sig)
    return process.wait(timeout=timeout)


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """Kill a process and every process it started (a supervisor's children would otherwise
    outlive it, still connected to the test database)."""
    if process.poll() is not None:
        return
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    process.kill()
    for child in children:
        with suppress(psutil.NoSuchProcess):
            child.kill()
    process.wait(timeout=10)
    psutil.wait_procs(children, timeout=10)


@contextmanager
def running(*processes: subprocess.Popen[bytes]) -> Iterator[None]:
    """Kill whatever is still running when the block ends, pass or fail."""
    try:
        yield
    finally:
        for process in processes:
            kill_tree(process)
