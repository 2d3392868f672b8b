"""Every database connection names its process: ``application_name`` is ``waymark-<role>``
(waymark_config/process_role.py), so ``pg_stat_activity`` says which process holds each one.

``runengine`` gives each child its role; a worker started on its own names itself; any
other process (this test's own, ``manage.py`` commands) is ``waymark-manage``. A name the
operator chose wins: ``application_name`` in DATABASE_URL, then ``PGAPPNAME``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlencode

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


# --- PGAPPNAME: libpq's own variable, as an operator or a tool sets it -----------------------


def database_url(**query: str) -> str:
    """A DATABASE_URL naming the tests' server (the embedded one's socket, or the suite's own
    DATABASE_URL), with ``query`` added."""
    own = os.environ.get("DATABASE_URL", "")
    if not own:
        params = connection.get_connection_params()
        own = f"postgresql://{params['user']}@/x?host={params['host']}&port={params['port']}"
    return f"{own}{'&' if '?' in own else '?'}{urlencode(query)}"


def test_pgappname_names_every_connection_of_the_process_that_has_it(procs):
    procs.append(spawn_worker("slow", concurrency=1, PGAPPNAME="acme-billing-worker"))
    wait_for(lambda: "acme-billing-worker" in names_connected(),
             what="the worker's connections named by PGAPPNAME")  # fmt: skip
    # Its listener too (a connection of its own, outside Django's): none goes by the role.
    listener = wait_for(lambda: names_of_queries("LISTEN waymark%"), what="its listener")
    assert listener == {"acme-billing-worker"}
    assert "waymark-worker-slow" not in names_connected()


def test_an_application_name_in_database_url_wins_over_pgappname(procs):
    url = database_url(application_name="chosen-in-the-url")
    procs.append(spawn_worker("slow", concurrency=1, DATABASE_URL=url, PGAPPNAME="not-this"))
    wait_for(lambda: "chosen-in-the-url" in names_connected(),
             what="the worker's connections named by DATABASE_URL")  # fmt: skip
    assert not {"not-this", "waymark-worker-slow"} & names_connected()


def names_of_queries(pattern: str) -> set[str]:
    """The application names of the connections whose last statement is like ``pattern``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE %s",
            [pattern],
        )
        return {name for (name,) in cursor.fetchall()}
