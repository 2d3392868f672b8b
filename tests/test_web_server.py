"""The web server `runengine` starts: slow clients cannot starve it, a taken port stops it,
health endpoints tell the process from the database, and its own errors are JSON.

Every server here is the real one (`runengine --web-only`, the same children runengine always
starts) on a free port; clients are raw sockets. No assertion depends on how fast an idle
machine is: /healthz must answer *while* the slow sockets are still open and unanswered.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from waitress.task import ThreadedTaskDispatcher

from .processes import ROOT, engine_env, wait_for

pytestmark = pytest.mark.django_db

_spec = importlib.util.spec_from_file_location("slowloris", ROOT / "benchmarks" / "slowloris.py")
assert _spec is not None and _spec.loader is not None
slowloris = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slowloris)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_web(procs, tmp_path: Path, **env: str) -> int:
    """`runengine --web-only` on a free port; returns the port once it printed "ready"."""
    port = free_port()
    out = tmp_path / f"web-{port}.out"
    with out.open("wb") as sink:
        engine = subprocess.Popen(
            [sys.executable, "manage.py", "runengine", "--web-only", "--port", str(port),
             "--grace", "1"],
            cwd=ROOT, env=engine_env(**env), stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    procs.append(engine)
    wait_for(lambda: b"ready" in out.read_bytes() or engine.poll() is not None,
             timeout=90, what="the web server to say ready")  # fmt: skip
    assert engine.poll() is None, "runengine exited"
    return port


def get(port: int, path: str, *, extra: bytes = b"") -> tuple[int, dict[str, object]]:
    _, answer = slowloris.timed_get("127.0.0.1", port, path + extra.decode(), timeout=60)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head, f"no answer for {path[:40]}"
    return int(head.split()[1]), json.loads(body)


def raw(port: int, request: bytes) -> tuple[int, bytes, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split()[1]), head, body


def still_waiting(sock: socket.socket) -> bool:
    """Open, and nothing answered yet (the server neither replied nor closed it)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False  # closed on our side
    # Readable means answered or closed (recv would return bytes or b""): either way, done.
    return not readable


@pytest.mark.parametrize("slow", [2, 50])
def test_healthz_answers_while_slow_clients_trickle_headers(procs, tmp_path, slow) -> None:
    # The server never drops them during this test: the answer must not wait for them.
    port = start_web(procs, tmp_path, WAYMARK_WEB_REQUEST_TIMEOUT_SECONDS="600")
    with slowloris.slow_clients("127.0.0.1", port, slow, interval=0.5) as sockets:
        time.sleep(1.5)  # each has trickled a few more bytes: the server is reading them
        status, body = get(port, "/healthz")
        assert (status, body) == (200, {"status": "ok", "database": "ok"})
        waiting = sum(still_waiting(sock) for sock in sockets)
        assert waiting == slow, "every slow client is still connected, unanswered"


def web_processes(engine) -> set[int]:
    return {p.pid for p in psutil.Process(engine.pid).children(recursive=True)}


def test_a_request_that_never_finishes_is_dropped(procs, tmp_path) -> None:
    port = start_web(procs, tmp_path, WAYMARK_WEB_REQUEST_TIMEOUT_SECONDS="2")
    before = web_processes(procs[-1])
    with slowloris.slow_clients("127.0.0.1", port, 1, interval=0.5) as sockets:
        # Trickling steadily, never idle: only the whole-request timeout can end it, and it
        # costs the connection only, not a process (and the requests it was serving).
        # 25 s: ten times the timeout plus the once-a-second check, and still under the
        # 30 s after which gunicorn's arbiter aborted a silent worker (the old server).
        wait_for(lambda: not still_waiting(sockets[0]), timeout=25,
                 what="the server to drop the unfinished request")  # fmt: skip
    assert get(port, "/livez")[0] == 200
    assert web_processes(procs[-1]) == before


def test_healthz_reports_the_database_and_livez_does_not_need_it(procs, tmp_path) -> None:
    port = start_web(procs, tmp_path)
    assert get(port, "/healthz") == (200, {"status": "ok", "database": "ok"})
    assert get(port, "/livez") == (200, {"status": "ok"})


def test_without_the_database_livez_answers_and_healthz_says_503(procs, tmp_path) -> None:
    closed = free_port()  # nothing listens there: connections are refused at once
    port = start_web(procs, tmp_path, DATABASE_URL=f"postgres://nobody@127.0.0.1:{closed}/x")
    assert get(port, "/livez") == (200, {"status": "ok"})
    assert get(port, "/healthz") == (503, {"status": "unavailable", "database": "unreachable"})


def test_the_servers_own_errors_are_json(procs, tmp_path) -> None:
    port = start_web(procs, tmp_path)
    cases = {
        414: b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
        431: b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
        400: b"GET / HTTP/1.1\r\nHost: localhost\r\nContent-Length: nope\r\n\r\n",
    }
    codes = {414: "uri_too_long", 431: "headers_too_large", 400: "bad_request"}
    for expected, request in cases.items():
        status, head, body = raw(port, request)
        assert status == expected
        assert b"content-type: application/json" in head.lower()
        assert json.loads(body)["code"] == codes[expected]
        assert set(json.loads(body)) == {"code", "detail"}


def test_a_head_answer_has_no_body_and_the_connection_stays_in_step(procs, tmp_path) -> None:
    """HEAD answers with the headers a GET has and no body (RFC 9110 9.3.2): a body sent was
    read by the next request on the same connection as the start of its answer."""
    port = start_web(procs, tmp_path)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        head_then_get = (
            b"HEAD /livez HTTP/1.1\r\nHost: localhost\r\n\r\n"
            b"GET /livez HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        sock.sendall(head_then_get)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    answers = b"".join(chunks)
    head, _, rest = answers.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answers[:300]
    # What follows the HEAD's headers is the GET's answer, whole, not a body.
    assert rest.startswith(b"HTTP/1.1 200"), answers[:600]
    assert json.loads(rest.partition(b"\r\n\r\n")[2]) == {"status": "ok"}


def test_a_taken_port_stops_runengine_with_one_line(procs) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        engine = subprocess.Popen(
            [sys.executable, "manage.py", "runengine", "--port", str(port)],
            cwd=ROOT, env=engine_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        procs.append(engine)
        out, err = engine.communicate(timeout=90)
    assert engine.returncode != 0
    assert b"ready" not in out
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port} is already in use" in lines[0], err


def test_each_request_is_logged_without_its_query_string(procs, tmp_path: Path) -> None:
    port = start_web(procs, tmp_path, WAYMARK_LOG_LEVEL="INFO")
    status, _ = get(port, "/livez?token=secret-value")
    assert status == 200
    out = tmp_path / f"web-{port}.out"
    line = wait_for(
        lambda: next((x for x in out.read_text().splitlines() if "GET /livez 200" in x), None),
        what="the access log line",
    )
    assert "waymark.access" in line and "127.0.0.1" in line
    assert "secret-value" not in out.read_text()


def test_waitress_warns_of_its_queue_only_once_it_holds_a_threads_worth(caplog, settings) -> None:
    """waitress warns for every request that waits for a thread; the log keeps the warning
    only once the queue holds as many requests as a process has threads."""
    dispatcher = ThreadedTaskDispatcher()  # no threads: every task waits
    threads = settings.WAYMARK_WEB["THREADS"]
    with caplog.at_level(logging.WARNING, logger="waitress.queue"):
        for _ in range(threads):
            dispatcher.add_task(object())  # type: ignore[arg-type]  # never run: no threads
    depths = [record.getMessage() for record in caplog.records if record.name == "waitress.queue"]
    assert depths == [f"Task queue depth is {threads}"]
