"""How long /healthz takes while slow clients hold connections open (slowloris).

    .venv/bin/python benchmarks/slowloris.py [--host 127.0.0.1] [--port 8000]
        [--sockets 0,2,50] [--interval 1] [--hold 3] [--path /healthz]

Start the server first (`./waymark run`, or `manage.py runengine --web-only`). For each count
N it opens N sockets that send a request line and then trickle header bytes, one every
``--interval`` seconds, never finishing the headers; after ``--hold`` seconds it times one GET
of ``--path`` on a fresh connection while they are still open, and prints the time and the
status. Standard library only; asserts nothing (tests/test_web_server.py does).
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress


@contextmanager
def slow_clients(
    host: str, port: int, count: int, interval: float = 1.0
) -> Iterator[list[socket.socket]]:
    """``count`` connections trickling one header byte per ``interval`` until the block ends.
    Yields the sockets."""
    stop = threading.Event()
    sockets = []
    for _ in range(count):
        sock = socket.create_connection((host, port), timeout=10)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        sockets.append(sock)
    alive = list(sockets)

    def trickle() -> None:
        while not stop.wait(interval):
            for sock in list(alive):
                try:
                    sock.sendall(b"a")
                except OSError:
                    alive.remove(sock)  # the server closed it: that is a defence working

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        yield sockets
    finally:
        stop.set()
        thread.join()
        for sock in sockets:
            with suppress(OSError):
                sock.close()


def timed_get(host: str, port: int, path: str, timeout: float = 60.0) -> tuple[float, bytes]:
    """Seconds until the whole answer arrived, and the raw answer (empty on a timeout)."""
    started = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
            )
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    except OSError:
        return time.monotonic() - started, b""
    return time.monotonic() - started, b"".join(chunks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default=os.environ.get("WAYMARK_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("WAYMARK_PORT", "8000")))
    parser.add_argument("--sockets", default="0,2,50", help="comma-separated counts")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--hold", type=float, default=3.0)
    parser.add_argument("--path", default="/healthz")
    args = parser.parse_args()
    for count in (int(n) for n in args.sockets.split(",")):
        with slow_clients(args.host, args.port, count, args.interval):
            time.sleep(args.hold)
            elapsed, answer = timed_get(args.host, args.port, args.path)
        status = answer.split(b"\r\n", 1)[0].decode(errors="replace") or "no answer (timed out)"
        print(f"{count:4d} slow sockets open: {args.path} took {elapsed:7.3f} s  {status}")


if __name__ == "__main__":
    main()
