"""`manage.py runengine`: one supervisor for every role; a dead child is restarted."""

from __future__ import annotations

import signal

import psutil
import pytest

from .processes import spawn, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROLES = {"relay", "sweep", "worker"}


def children(pid: int) -> dict[int, str]:
    found = {}
    for child in psutil.Process(pid).children():
        try:
            argv = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        role = next((arg for arg in argv if arg in ROLES), None)
        if role == "worker":
            role = f"worker-{argv[argv.index('--lane') + 1]}"
        if role:
            found[child.pid] = role
    return found


def test_runengine_restarts_a_dead_child_and_stops_cleanly(procs) -> None:
    engine = spawn("runengine", "--no-web", "--grace", "3")
    procs.append(engine)
    expected = {"relay", "sweep", "worker-io", "worker-slow", "worker-human"}
    first = wait_for(
        lambda: (found := children(engine.pid)) and set(found.values()) == expected and found,
        what="all roles to start",
    )
    victim = next(pid for pid, role in first.items() if role == "worker-io")
    psutil.Process(victim).kill()
    restarted = wait_for(
        lambda: next(
            (p for p, r in children(engine.pid).items() if r == "worker-io" and p != victim), None
        ),
        what="worker-io to be restarted",
    )
    assert restarted != victim
    survivors = {pid for pid, role in first.items() if role != "worker-io"}
    assert survivors <= set(children(engine.pid)), "other roles must not be restarted"

    assert stop(engine, signal.SIGTERM, timeout=30) == 0
    for pid in survivors | {restarted}:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
