"""A TCP proxy to a PostgreSQL server's unix socket that can cut listening connections
silently: the half-open connection of tests/test_database_faults.py.

One engine process connects through it (its DATABASE_URL names the proxy's address). Every
connection is forwarded both ways, and a connection whose client sends a ``LISTEN`` is
marked as listening. ``cut_listeners()`` turns such connections into black holes: the
server's side is closed (its backend goes, as it would after a server-side timeout), the
client's side stays open and everything it sends is dropped, and nothing ever comes back:
the client sees no error, only silence. While cutting, a new connection that sends LISTEN is
cut as it does. ``heal()`` stops cutting new ones; a cut connection stays dead, as a real
half-open one does, so only a client that noticed and connected again hears anything.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress
from dataclasses import dataclass, field


@dataclass
class Flow:
    client: socket.socket
    server: socket.socket
    listening: bool = False  # its client sent LISTEN
    dead: bool = False  # cut: nothing is forwarded any more


@dataclass
class Tally:
    listens: int = 0  # LISTEN statements forwarded to the server
    cut: int = 0  # listening connections cut
    noticed: int = 0  # cut connections their client closed (it noticed the silence)
    flows: list[Flow] = field(default_factory=list)


class ListenProxy:
    def __init__(self, server_socket: str) -> None:
        self.server_socket = server_socket  # the path of the server's .s.PGSQL.<port>
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.cutting = False
        self.tally = Tally()
        self.lock = threading.Lock()
        self.closed = threading.Event()

    def __enter__(self) -> ListenProxy:
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed.set()
        self.listener.close()
        with self.lock:
            for flow in self.tally.flows:
                _close(flow.client)
                _close(flow.server)

    def snapshot(self) -> Tally:
        with self.lock:
            tally = self.tally
            return Tally(listens=tally.listens, cut=tally.cut, noticed=tally.noticed)

    def cut_listeners(self) -> None:
        with self.lock:
            self.cutting = True
            for flow in self.tally.flows:
                if flow.listening and not flow.dead:
                    self._cut(flow)

    def heal(self) -> None:
        with self.lock:
            self.cutting = False

    def _cut(self, flow: Flow) -> None:
        """Call with the lock held."""
        flow.dead = True
        self.tally.cut += 1
        _close(flow.server)  # the server's side ends; the client's stays open, silent

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(self.server_socket)
            except OSError:
                _close(client)
                continue
            flow = Flow(client, server)
            with self.lock:
                self.tally.flows.append(flow)
            threading.Thread(target=self._upstream, args=(flow,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(flow,), daemon=True).start()

    def _upstream(self, flow: Flow) -> None:
        """Client to server; a LISTEN marks the flow (and cuts it while cutting)."""
        while True:
            try:
                data = flow.client.recv(65536)
            except OSError:
                data = b""
            with self.lock:
                if not data:
                    if flow.dead:
                        self.tally.noticed += 1
                    break
                if b"LISTEN " in data:
                    flow.listening = True
                    if self.cutting and not flow.dead:
                        self._cut(flow)
                    elif not flow.dead:
                        self.tally.listens += 1
                if flow.dead:
                    continue  # dropped
            try:
                flow.server.sendall(data)
            except OSError:
                break
        _close(flow.client)
        _close(flow.server)

    def _downstream(self, flow: Flow) -> None:
        """Server to client, until either side ends or the flow is cut."""
        while True:
            try:
                data = flow.server.recv(65536)
            except OSError:
                return
            if not data or flow.dead:
                if not flow.dead:
                    _close(flow.client)
                return
            try:
                flow.client.sendall(data)
            except OSError:
                return


def _close(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with suppress(OSError):
        sock.close()
