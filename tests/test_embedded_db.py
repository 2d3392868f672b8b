"""The embedded PostgreSQL: one server per data directory, shared by processes, kept on stop.

These tests start their own server in a temporary directory, so stopping it cannot disturb
the server the rest of the suite runs on.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from waymark_config.embedded_db.server import ensure_server, server_status, stop_server

ROOT = Path(__file__).resolve().parent.parent


def _pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])


def _address_in_subprocess(data_dir: Path) -> str:
    code = (
        "import sys; from pathlib import Path; "
        "from waymark_config.embedded_db.server import ensure_server; "
        "print(ensure_server(Path(sys.argv[1])).socket_dir)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(data_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout.strip()


@pytest.fixture
def data_dir(tmp_path: Path):
    path = tmp_path / "pg"
    yield path
    stop_server(path)


def test_second_process_reuses_the_server_and_stop_keeps_data(data_dir: Path) -> None:
    address = ensure_server(data_dir)
    pid = _pid(data_dir)
    with psycopg.connect(address.uri("postgres"), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('committed')")

    # Another process finds the running server instead of starting a second one.
    assert _address_in_subprocess(data_dir) == address.socket_dir
    assert _pid(data_dir) == pid

    assert stop_server(data_dir) is True
    assert server_status(data_dir) is None
    assert stop_server(data_dir) is False

    # A later process starts it again; the committed row survived the stop.
    _address_in_subprocess(data_dir)
    restarted = server_status(data_dir)
    assert restarted is not None
    assert _pid(data_dir) != pid
    with psycopg.connect(restarted.uri("postgres")) as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [("committed",)]


def test_server_survives_the_death_of_the_process_that_started_it(data_dir: Path) -> None:
    _address_in_subprocess(data_dir)  # started by a process that has now exited
    address = server_status(data_dir)
    assert address is not None
    with psycopg.connect(address.uri("postgres")) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
