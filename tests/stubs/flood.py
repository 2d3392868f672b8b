"""An endpoint that answers every request with a body of any size: a real threaded HTTP/1.1
server on 127.0.0.1 whose body is written a chunk at a time (the same chunk again and
again: the stub never holds the body it sends), until it is all sent or the client hangs up.
``sent`` records how much of each body went out, so a test sees a client that stopped
reading (a loopback socket's buffers hold a few MiB at most).

With ``gzip`` the body is gzip-compressed as it is written (``Content-Encoding: gzip``,
zeros: a 300 MiB body is a few hundred KiB on the wire), a decompression bomb."""

from __future__ import annotations

import socket
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

CHUNK = 64 * 1024


class FloodStub:
    def __init__(
        self, *, status: int = 200, size: int = 300 * 1024 * 1024,
        headers: dict[str, str] | None = None, gzip: bool = False,
        content_type: str = "application/json", prefix: bytes = b'{"items": ["',
    ) -> None:  # fmt: skip
        self.status = status
        self.size = size  # bytes of the body (before compression)
        self.headers = dict(headers or {})
        self.gzip = gzip
        self.content_type = content_type
        self.prefix = prefix  # the body's start; the rest is filler ("x", or zeros gzipped)
        self.sent: list[int] = []  # per request, body bytes written (uncompressed)
        self.lock = threading.Lock()
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def wait_requests(self, n: int, timeout: float = 60) -> list[int]:
        """The body bytes sent to the first ``n`` requests, once each has ended."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if len(self.sent) >= n:
                    return list(self.sent[:n])
            time.sleep(0.05)
        raise AssertionError(f"the flood stub saw {len(self.sent)} of {n} requests end")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, stub: FloodStub) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.stub = stub

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client hanging up mid-body is the point


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def _answer(self) -> None:
        stub = self.server.stub
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(stub.status)
        self.send_header("Content-Type", stub.content_type)
        for name, value in stub.headers.items():
            self.send_header(name, value)
        if stub.gzip:
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(stub.size))
        self.end_headers()
        self.written = 0
        try:
            self._body(stub)
        except OSError:
            pass  # the client hung up: what it was sent is counted
        finally:
            with stub.lock:
                stub.sent.append(self.written)
            self.close_connection = True

    def _body(self, stub: FloodStub) -> None:
        compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if stub.gzip else None
        filler = (b"\0" if stub.gzip else b"x") * CHUNK
        pieces = [stub.prefix] if stub.prefix else []
        while self.written < stub.size:
            piece = (pieces.pop() if pieces else filler)[: stub.size - self.written]
            if compressor is None:
                self.wfile.write(piece)
            else:
                self._chunk(compressor.compress(piece))
            self.written += len(piece)
        if compressor is not None:
            self._chunk(compressor.flush())
            self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


class SmtpFlood:
    """A mail server whose greeting never ends: continuation lines ("220-…", 1,000 bytes
    each) as fast as the client reads them, ``size`` bytes in all, then silence until the
    test ends. ``sent`` is what it wrote before the client hung up (or all of it)."""

    LINE = b"220-" + b"x" * 994 + b"\r\n"

    def __init__(self, size: int = 300 * 1024 * 1024) -> None:
        self.size = size
        self.sent: list[int] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self._stopped.set()
        self._listener.close()
        self._thread.join(5)

    def _serve(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        written = 0
        with sock:
            try:
                while written < self.size:
                    sock.sendall(self.LINE)
                    written += len(self.LINE)
            except OSError:
                pass  # the client hung up
            self.sent.append(written)
            self._stopped.wait(60)
