"""What the benchmark scripts share: Django on a database of their own, the side-by-side
shape, and the server's commit count. Import it first, then call ``setup``, then import the
project (its modules need Django set up)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# The side-by-side harness's shape (../shared/bench): three no-op io steps.
THREE_IO: dict[str, Any] = {
    "start": "a",
    "steps": [
        {"id": "a", "type": "noop", "next": "b"},
        {"id": "b", "type": "noop", "next": "c"},
        {"id": "c", "type": "noop", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


def use_peer_code_workflows() -> None:
    """Register the peer benchmark's code workflows (benchmarks/peer/peer_code.py: code-3 and
    its kin) in this process and in the engine processes it starts, which inherit the
    environment, as a host's ready() would register them. Call before ``setup``."""
    peer = ROOT / "benchmarks" / "peer"
    os.environ["WAYMARK_EXTRA_STEP_MODULES"] = "peer_code"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(peer), os.environ.get("PYTHONPATH")])
    )
    sys.path.insert(0, str(peer))


def setup(database: str, **environment: str) -> None:
    """Django with the project's settings, on ``database`` (WAYMARK_DB_NAME wins), quiet, with
    no statement timeout (benchmarks fill tables), and the migrations applied. The quotas are
    the defaults, as a user has them (a script that measures capacity lifts them)."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waymark_config.settings")
    os.environ.setdefault("WAYMARK_DB_NAME", database)
    os.environ.setdefault("WAYMARK_LOG_LEVEL", "WARNING")
    os.environ.setdefault("WAYMARK_DB_STATEMENT_TIMEOUT_MS", "0")
    for name, value in environment.items():
        os.environ.setdefault(name, value)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def claim_params() -> dict[str, Any]:
    """sql.CLAIM's parameters for the benchmarks that explain it: 16 io steps for a worker
    holding none (every organisation owed them all). Call after ``setup``."""
    from workflows.engine.lanes import UNSHARED

    return {"lane": "io", "n": 16, "worker": "bench", "lease": 30, "after_org": 0,
            **UNSHARED.params(16)}  # fmt: skip


def commits() -> int:
    """Transactions the server has committed in this database so far (pg_stat_database)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def empty_run_tables() -> None:
    """Every run, step, event and outbox row of this benchmark's database gone, in one
    statement (a previous run's million rows are no work for an ORM delete). CASCADE:
    effects, timers, approvals and signals reference runs and steps."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE workflows_runevent, workflows_step, workflows_outbox, workflows_run CASCADE"
        )


def database_cpu_seconds() -> float | None:
    """CPU time the database server has used so far, all its processes together (those that
    exited are in the postmaster's children's time); None when it runs on another machine.
    The difference of two readings is the server's work in between, whoever caused it."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    try:
        postmaster = _stat(backend)[1]
        _, _, own = _stat(postmaster, children=True)
    except OSError:
        return None
    live = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                _, parent, ticks = _stat(int(entry))
            except OSError:  # exited meanwhile
                continue
            live += ticks if parent == postmaster else 0
    return (own + live) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """CPU time the live process ``pid`` has used so far."""
    return _stat(pid)[2] / os.sysconf("SC_CLK_TCK")


def _stat(pid: int, *, children: bool = False) -> tuple[int, int, int]:
    """(pid, parent pid, CPU ticks) from /proc/<pid>/stat; ``children``: with its waited-for
    children's ticks."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return pid, int(fields[1]), ticks


def start_runs(
    org: Any,
    slug: str,
    count: int,
    tag: str,
    threads: int,
    inputs: Callable[[int], dict[str, Any]] | None = None,
) -> list[int]:
    """Start ``count`` runs of automation ``slug`` (start keys ``tag-n``, input
    ``inputs(n)``, else ``{"n": n}``) from ``threads`` threads through the service; their
    ids. Call after ``setup``."""
    from django.db import connection

    from workflows.services.runs import run_start

    ids: list[int] = []
    lock = threading.Lock()

    def starter(offset: int) -> None:
        mine = [
            run_start(org=org, automation_slug=slug,
                      run_input=inputs(n) if inputs else {"n": n},
                      start_key=f"{tag}-{n}").run_id
            for n in range(offset, count, threads)
        ]  # fmt: skip
        with lock:
            ids.extend(mine)
        connection.close()

    workers = [threading.Thread(target=starter, args=(i,)) for i in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return ids


def shapes_organisation(slug: str) -> Any:
    """The organisation ``slug`` (made on first use) with the side-by-side shape published as
    ``three`` and the same three steps as the code workflow ``code-3``
    (use_peer_code_workflows). Call after ``setup``."""
    from workflows.models import Organisation
    from workflows.plugins.code import publish_code_workflow
    from workflows.services.automations import automation_publish_definition

    org, _ = Organisation.objects.get_or_create(slug=slug, defaults={"name": slug})
    automation_publish_definition(org=org, slug="three", definition=THREE_IO)
    publish_code_workflow(org=org, name="code-3", version=1)
    return org


def drain_here(org: Any, slug: str, runs: int, worker: Any) -> None:
    """``runs`` runs of ``slug`` started on empty run tables, then drained in this process
    through ``worker``'s own code path (claim, execute, settle:
    workflows.code.testing.run_due_steps); exits when one did not succeed."""
    from workflows.code.testing import run_due_steps
    from workflows.models import Run

    empty_run_tables()
    start_runs(org, slug, runs, f"{slug}-{time.time()}", threads=1)
    while run_due_steps(worker, limit=16):
        pass
    failed = Run.objects.exclude(status="succeeded").count()
    if failed:
        raise SystemExit(f"{slug}: {failed} runs did not succeed")
