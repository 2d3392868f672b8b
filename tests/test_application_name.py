"""Every database connection names its process: ``application_name`` is ``waymark-<role>``
(waymark_config/process_role.py), so ``pg_stat_activity`` says which process holds each one.

``runengine`` gives each child its role; a worker started on its own names itself; any
other process (this test's own, ``manage.py`` commands) is ``waymark-manage``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.db import connection

from workflows.engine.lanes import WORKER_LANES

from .processes import ROOT, engine_env, spawn_worker, wait_for
from .test_web_server import free_port

pytestmark = pytest.mark.django_db(transaction=True)


def names_connected() -> set[str]:
    """The application names of the connections to this test's database now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT application_name FROM pg_stat_activity"
            " WHERE datname = current_database()"
        )
        return {name for (name,) in cursor.fetchall()}


def test_this_process_is_manage():
    assert "waymark-manage" in names_connected()
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('application_name')")
        assert cursor.fetchone() == ("waymark-manage",)


def test_each_of_runengines_processes_names_its_connections(procs, tmp_path: Path):
    port = free_port()
    out = tmp_path / "engine.out"
    with out.open("wb") as sink:
        engine = subprocess.Popen(
            [sys.executable, "manage.py", "runengine", "--port", str(port), "--web-workers", "1",
             "--grace", "1"],
            cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=engine_env(),
        )  # fmt: skip
    procs.append(engine)
    wait_for(lambda: b"ready" in out.read_bytes() or engine.poll() is not None,
             what="runengine to say ready")  # fmt: skip
    assert engine.poll() is None, out.read_text(errors="replace")[-3000:]
    # The web connects when a request needs the database (and keeps it, CONN_MAX_AGE).
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200
    expected = {
        "waymark-web", "waymark-relay", "waymark-sweep",
        *(f"waymark-worker-{lane}" for lane in WORKER_LANES),
        *(f"waymark-worker-{lane}-suspects" for lane in WORKER_LANES),
    }  # fmt: skip
    wait_for(lambda: expected <= names_connected(),
             what=f"connections named {sorted(expected - names_connected())}")  # fmt: skip
    names = names_connected()
    assert not {name for name in names if not name.startswith("waymark-")} - {""}, names


def test_a_worker_started_on_its_own_names_itself(procs):
    procs.append(spawn_worker("slow", concurrency=1))
    wait_for(lambda: "waymark-worker-slow" in names_connected(),
             what="the slow worker's connections")  # fmt: skip
