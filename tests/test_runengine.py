"""`manage.py runengine`: one supervisor for every role; a dead child is restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from waymark_config.exit_codes import EXIT_INTERRUPTED

from .processes import ROOT, engine_env, exit_code, spawn, stop, wait_for
from .test_web_server import free_port

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
            kind = "suspects" if "--suspects-only" in argv else "worker"
            role = f"{kind}-{argv[argv.index('--lane') + 1]}"
        if role:
            found[child.pid] = role
    return found


def test_runengine_restarts_a_dead_child_and_stops_cleanly(procs) -> None:
    engine = spawn("runengine", "--no-web", "--grace", "3")
    procs.append(engine)
    expected = {"relay", "sweep", "worker-io", "worker-slow", "worker-human",
                "suspects-io", "suspects-slow", "suspects-human"}  # fmt: skip

    def all_roles() -> dict[int, str] | None:
        found = children(engine.pid)
        return found if set(found.values()) == expected else None

    first = wait_for(all_roles, what="all roles to start")
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


def test_stopping_runengine_hands_running_steps_back(org, procs) -> None:
    from workflows.models import RunEvent, Step
    from workflows.services.automations import automation_publish_definition
    from workflows.services.runs import run_start

    definition = {
        "start": "work",
        "steps": [{"id": "work", "type": "probe", "sleep_seconds": 60}],
    }
    automation_publish_definition(org=org, slug="slow", definition=definition)
    run_id = run_start(org=org, automation_slug="slow", run_input={}, start_key="k").run_id
    # A 60 s lease: only a hand-back makes the step claimable again soon.
    engine = spawn("runengine", "--no-web", "--grace", "1", WAYMARK_IO_LEASE_SECONDS="60")
    procs.append(engine)
    wait_for(lambda: Step.objects.filter(run_id=run_id, status="running").exists(),
             what="the io worker to claim")  # fmt: skip
    assert stop(engine, signal.SIGTERM, timeout=30) == 0
    step = Step.objects.get(run_id=run_id)
    assert (step.status, step.release_count, step.attempt) == ("ready", 1, 1)
    assert RunEvent.objects.filter(run_id=run_id, kind="step.released").count() == 1


def test_a_misconfigured_child_stops_the_supervisor_instead_of_restarting() -> None:
    import sys
    import time

    from workflows.engine.supervisor import EXIT_CONFIG, Child, Supervisor

    sleeper = Child("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"])
    broken = Child("broken", [sys.executable, "-c", f"raise SystemExit({EXIT_CONFIG})"])
    supervisor = Supervisor([sleeper, broken], grace_seconds=10)
    started = time.monotonic()
    failure = supervisor.run()  # returns on its own: nothing sends a signal here
    assert failure is not None and failure.startswith("broken exited with 78")
    assert broken.restarts == 0
    assert sleeper.process is not None and sleeper.process.poll() is not None
    assert time.monotonic() - started < 120, "the sleeper was stopped, not waited for"


# --- Ctrl-C while it starts ---------------------------------------------------------------------


def maps(pid: int, library: str) -> bool:
    """Whether the process has loaded ``library`` (a C extension Django's import loads, past
    the interpreter's own start: manage.py is importing Django)."""
    try:
        with open(f"/proc/{pid}/maps") as mapped:
            return library in mapped.read()
    except (FileNotFoundError, ProcessLookupError):
        return False


def listening(pid: int, port: int) -> bool:
    try:
        found = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in found)


def in_session(session: int) -> list[int]:
    """The live processes of a session (runengine's, and every process it started)."""
    alive = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == session and process.status() != "zombie":
                alive.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return alive


def loading_django(engine: subprocess.Popen[bytes], port: int) -> bool:
    return maps(engine.pid, "_decimal")


def bound(engine: subprocess.Popen[bytes], port: int) -> bool:
    return listening(engine.pid, port)


def starting_children(engine: subprocess.Popen[bytes], port: int) -> bool:
    return bool(psutil.Process(engine.pid).children())


def children_loading_django(engine: subprocess.Popen[bytes], port: int) -> bool:
    return any(maps(child.pid, "_decimal") for child in psutil.Process(engine.pid).children())


@pytest.mark.parametrize(
    "phase", [loading_django, bound, starting_children, children_loading_django],
    ids=lambda phase: phase.__name__,
)  # fmt: skip
def test_ctrl_c_while_runengine_starts_stops_it_with_one_line(tmp_path, procs, phase) -> None:
    # A terminal's Ctrl-C: SIGINT to the whole foreground process group (runengine and every
    # child it started), sent once start-up reaches the phase. Whichever it interrupts
    # (Django loading, the socket bound, children starting or loading Django themselves),
    # runengine stops everything, says "interrupted" on one line and exits 130.
    port = free_port()
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        engine = subprocess.Popen(
            [sys.executable, "manage.py", "runengine", "--port", str(port), "--grace", "1"],
            cwd=ROOT, env=engine_env(WAYMARK_LOG_LEVEL="INFO"), stdout=stdout, stderr=stderr,
            start_new_session=True,
        )  # fmt: skip
    procs.append(engine)
    wait_for(lambda: phase(engine, port) or engine.poll() is not None,
             what=f"runengine to reach {phase.__name__}")  # fmt: skip
    assert engine.poll() is None, err.read_text()
    os.killpg(engine.pid, signal.SIGINT)

    code = exit_code(engine)
    said = out.read_text() + err.read_text()
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    assert code == EXIT_INTERRUPTED, said
    # One plain line: not "CommandError: ...", which reads as a failure of the command.
    assert err.read_text().splitlines()[-1].startswith("interrupted"), said
    wait_for(lambda: not in_session(engine.pid), what="every process it started to exit")
