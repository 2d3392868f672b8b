"""A silent host: a real TCP server on 127.0.0.1 that accepts every connection and never
sends a byte, nor closes one, until the test ends. A client with a long timeout waits there
for all of it; a test waits for ``accepted`` to know a client has arrived, or for
``wait_held`` to know how many calls hang there at once.

With ``trickle`` it answers instead, one byte of an endless answer every ``trickle``
seconds (an HTTP header by default; ``endless`` gives another protocol's head and line): a
client whose timeouts are per read never times out, until ``hang_up()``."""

from __future__ import annotations

import select
import socket
import threading
import time
from types import TracebackType
from typing import Self

# An answer that never ends: a status line, then header lines for ever.
_ENDLESS_HEAD = b"HTTP/1.1 200 OK\r\n"
_ENDLESS_LINE = b"X-Still-Coming: yes\r\n"
# An SMTP greeting that never ends: continuation lines ("220-") for ever.
SMTP_GREETING = (b"", b"220-still greeting\r\n")


class Tarpit:
    def __init__(
        self, *, trickle: float | None = None, endless: tuple[bytes, bytes] | None = None
    ) -> None:
        self._trickle = trickle
        self._endless = endless or (_ENDLESS_HEAD, _ENDLESS_LINE)
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(0.2)  # the accept loop looks at `_stopped` this often
        self._sockets: list[socket.socket] = []
        self._arrived = threading.Condition()
        self._stopped = threading.Event()
        self.most_held = 0  # the most connections open at once
        self._thread = threading.Thread(target=self._accept, name="tarpit", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    @property
    def accepted(self) -> int:
        with self._arrived:
            return len(self._sockets)

    def wait_accepted(self, count: int, timeout: float = 120) -> None:
        """Until ``count`` connections have arrived (in all); AssertionError after ``timeout``."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self._sockets) >= count, timeout):
                raise AssertionError(f"the tarpit saw {len(self._sockets)} of {count} clients")

    def still_open(self) -> int:
        """How many accepted connections the clients have not closed. What they sent is read
        and dropped (never answered) to see whether the end of the stream follows it."""
        with self._arrived:
            sockets = list(self._sockets)
        return sum(_open(sock) for sock in sockets)

    def held(self) -> int:
        """Connections open now: each is a call still waiting for an answer."""
        return self.still_open()

    def wait_held(self, count: int, timeout: float) -> int:
        """Until at least ``count`` connections are open at once (or ``timeout``): how many
        are. Looked at again whenever a client arrives, and twice a second."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while sum(_open(sock) for sock in self._sockets) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._arrived.wait(min(left, 0.5))
        return self.still_open()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._arrived:
                self._sockets.append(sock)
                self.most_held = max(self.most_held, sum(_open(s) for s in self._sockets))
                self._arrived.notify_all()
            if self._trickle is not None:
                threading.Thread(target=self._drip, args=(sock,), daemon=True).start()

    def _drip(self, sock: socket.socket) -> None:
        assert self._trickle is not None
        head, line = self._endless
        sent = 0
        while not self._stopped.wait(self._trickle):
            data = head if sent < len(head) else line
            offset = sent if sent < len(head) else (sent - len(head)) % len(line)
            try:
                sock.send(data[offset : offset + 1])
            except OSError:
                return  # hung up (by the client or by hang_up())
            sent += 1

    def hang_up(self) -> None:
        """Close every connection accepted so far (the clients see the answer cut off)."""
        with self._arrived:
            for sock in self._sockets:
                sock.close()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._listener.close()
        with self._arrived:
            for sock in self._sockets:
                sock.close()


def _open(sock: socket.socket) -> bool:
    while True:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return True  # nothing more has arrived: no end of stream
        try:
            if sock.recv(65536) == b"":
                return False
        except OSError:
            return False  # reset by the client
