"""A host that accepts TCP connections and never answers: what a hung provider looks like.

It counts the connections it holds open, and the most it held at once, so a test can tell how
many of a lane's slots one organisation's calls occupy. Connections are held until the stub is
closed (or the client gives up), never answered.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self


class Tarpit:
    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.port = self._server.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Condition()
        self._held: list[socket.socket] = []
        self.accepted = 0
        self.most_held = 0
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="tarpit", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            held, self._held = self._held, []
        self._server.close()
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()

    def held(self) -> int:
        """Connections open now: each is a call still waiting for an answer."""
        with self._lock:
            self._prune()
            return len(self._held)

    def _prune(self) -> None:
        """Forget (and close) the connections their clients gave up on."""
        kept = []
        for sock in self._held:
            if _open(sock):
                kept.append(sock)
            else:
                sock.close()
        self._held = kept

    def wait_held(self, count: int, timeout: float) -> int:
        """Until at least ``count`` connections are open (or ``timeout``): how many are."""
        with self._lock:
            self._lock.wait_for(lambda: len(self._held) >= count, timeout)
        return self.held()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    sock.close()
                    return
                self._held.append(sock)
                self.accepted += 1
                self._prune()
                self.most_held = max(self.most_held, len(self._held))
                self._lock.notify_all()


def _open(sock: socket.socket) -> bool:
    """Still open at the client's end: what it sent is read and dropped, and no end of file
    follows it."""
    try:
        sock.setblocking(False)
        while True:
            if sock.recv(65536) == b"":
                return False
    except BlockingIOError:
        return True  # nothing more to read, and not closed
    except OSError:
        return False
