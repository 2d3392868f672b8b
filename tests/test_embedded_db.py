"""The embedded PostgreSQL: one server per data directory, shared by processes, kept on stop;
a stopped server stays stopped until started; a server starting or stopping is a transient
wait, never an error of another kind.

These tests start their own server in a temporary directory, so stopping it cannot disturb
the server the rest of the suite runs on.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from waymark_config.embedded_db import server
from waymark_config.embedded_db.server import (
    ServerStillRunning,
    ensure_server,
    server_status,
    stop_server,
)
from workflows.engine.transient import is_transient, lost_connection

from .clusters import server_home

ROOT = Path(__file__).resolve().parent.parent


def _pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])


def _address_in_subprocess(data_dir: Path, how: str = "ensure_server") -> str:
    code = (
        "import sys; from pathlib import Path; "
        f"from waymark_config.embedded_db.server import {how}; "
        f"print({how}(Path(sys.argv[1])).socket_dir)"
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
def data_dir() -> Iterator[Path]:
    with server_home("embedded") as home:
        path = home / "pg"
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

    # Stopped by an operator, it stays stopped: a process that connects meets a lost
    # connection (to be tried again), and does not start it behind the operator's back.
    with pytest.raises(psycopg.errors.CannotConnectNow) as refused:
        ensure_server(data_dir)
    assert is_transient(refused.value) and lost_connection(refused.value)
    assert server_status(data_dir) is None

    # `embedded_db start` (another process here) starts it; the committed row survived.
    _address_in_subprocess(data_dir, "start_server")
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


def test_a_server_still_writing_its_pid_file_is_waited_for_not_an_assertion(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL writes postmaster.pid in stages (its pid first, its socket and "ready"
    last). A process reading it meanwhile waits for the server (bounded), and when it is
    not ready in time meets a lost connection: never the wheel's AssertionError."""
    address = ensure_server(data_dir)
    whole = (data_dir / "postmaster.pid").read_text()
    starting = data_dir.parent / "starting"  # a data directory whose server is still starting
    starting.mkdir()
    (starting / "postmaster.pid").write_text("\n".join(whole.splitlines()[:3]) + "\n")
    monkeypatch.setattr(server, "WAIT_SECONDS", 1.0)
    with pytest.raises(psycopg.errors.CannotConnectNow) as refused:
        ensure_server(starting)
    assert lost_connection(refused.value)

    # Ready a moment later: the waiting process gets its address.
    monkeypatch.setattr(server, "WAIT_SECONDS", 30.0)
    ready = threading.Timer(0.5, (starting / "postmaster.pid").write_text, [whole])
    ready.start()
    assert ensure_server(starting) == address
    ready.join()


def test_stop_says_when_it_could_not_stop_the_server(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pg_ctl failing (a timeout, a signal refused): the server runs on, and stop says so
    instead of reporting it stopped."""
    ensure_server(data_dir)

    def refused(*args: object, **kwargs: object) -> str:
        raise subprocess.CalledProcessError(1, "pg_ctl")

    monkeypatch.setattr(server, "pg_ctl", refused)
    with pytest.raises(ServerStillRunning, match="still running"):
        stop_server(data_dir)
    assert server_status(data_dir) is not None
    monkeypatch.undo()
    assert stop_server(data_dir) is True


def test_one_process_starts_the_server_however_many_connect_at_once(data_dir: Path) -> None:
    """Four processes connect to a stopped (not operator-stopped) server at the same moment:
    one starts it, all get the same address, one postmaster runs."""
    ensure_server(data_dir)
    pid = _pid(data_dir)
    stop_server(data_dir)
    server._stopped_mark(data_dir).unlink()  # as a crash leaves it: anyone may start it
    code = (
        "import sys; from pathlib import Path; "
        "from waymark_config.embedded_db.server import ensure_server; "
        "print(ensure_server(Path(sys.argv[1])).socket_dir)"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(data_dir)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    answers = [process.communicate(timeout=120) for process in processes]
    assert [p.returncode for p in processes] == [0] * 4, answers
    assert len({out.strip() for out, _ in answers}) == 1, answers
    assert "Traceback" not in "".join(err for _, err in answers)
    assert _pid(data_dir) != pid and server_status(data_dir) is not None
