"""What the HTTP stubs share: a real threaded HTTP/1.1 server on 127.0.0.1, a record of every
request, and the fault behaviours a test switches on from its own thread at any time.

The servers are real TCP servers because the workers under test are separate OS processes.
Subclasses implement `route()` and call `gate()` at the point where their effect happens, so
`hold()` can keep a request inside the provider while a test SIGKILLs the worker.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit


@dataclass
class Request:
    method: str
    path: str  # without the query string
    query: dict[str, str]
    headers: dict[str, str]  # names lowercased
    body: Any  # parsed JSON or form fields; the raw text when neither parses; None when empty
    raw: str

    def bearer(self) -> str | None:
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        return token if scheme.lower() == "bearer" and token else None


@dataclass
class Response:
    status: int
    body: Any = None  # sent as JSON
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # sent as is (text/plain) instead of `body`


@dataclass
class Fault:
    kind: str  # "fail" | "rate_limit" | "malformed" | "drop"
    remaining: int | None  # None: every request until `until`
    until: float | None = None  # time.monotonic() deadline
    status: int = 503
    retry_after: float = 1
    path_prefix: str = ""


def _parse_body(raw: str, content_type: str) -> Any:
    if not raw:
        return None
    if content_type.startswith("application/x-www-form-urlencoded"):
        return dict(parse_qsl(raw, keep_blank_values=True))
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real clients' connection pools expect
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.conns_lock:
            self.server.conns.add(self.connection)

    def finish(self) -> None:
        with self.server.conns_lock:
            self.server.conns.discard(self.connection)
        super().finish()

    def _handle(self) -> None:
        url = urlsplit(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode(
            "utf-8", "replace"
        )
        headers = {name.lower(): value for name, value in self.headers.items()}
        request = Request(
            method=self.command,
            path=url.path,
            query=dict(parse_qsl(url.query, keep_blank_values=True)),
            headers=headers,
            body=_parse_body(raw, headers.get("content-type", "")),
            raw=raw,
        )
        response = self.server.stub.dispatch(request)
        if response is None:  # a "drop" fault: hang up without answering
            self.close_connection = True
            return
        if response.raw is not None:
            data, content_type = response.raw, "text/plain; charset=utf-8"
        else:
            data, content_type = json.dumps(response.body).encode(), "application/json"
        self.send_response(response.status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the records are the log; stderr noise helps nobody


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a request held at stop() must not keep pytest from exiting

    def __init__(self, stub: HttpStub) -> None:
        super().__init__((stub.host, 0), _Handler)
        self.stub = stub
        if stub.tls is not None:  # HTTPS: each accepted connection's handshake, then HTTP
            self.socket = stub.tls.wrap_socket(self.socket, server_side=True)
        self.conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away (SIGKILLed worker, short timeout) is what these tests do.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class Holdable:
    """Holding requests at their effect, shared by the HTTP and SMTP stubs: a test calls
    hold(), waits until n requests have arrived (to SIGKILL their client, say), then
    release()s them. State under the subclass's condition ``_cond``."""

    _cond: threading.Condition
    _held: bool
    _arrived: int
    _hold_from = 1  # the first arrival (counted since the stub started or was reset) held

    def hold(self, *, from_arrival: int = 1) -> None:
        """Requests reaching their effect block (after counting as arrived) until release();
        with ``from_arrival``, only the requests from that arrival on (the earlier ones pass):
        to hold the second of two calls, say."""
        with self._cond:
            self._held = True
            self._hold_from = from_arrival

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    @property
    def arrived(self) -> int:
        """How many requests have reached their effect (held or not)."""
        with self._cond:
            return self._arrived

    def wait_arrived(self, n: int = 1, timeout: float = 10) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._arrived >= n, timeout)


class HttpStub(Holdable):
    """Base of the HTTP stubs; not used on its own. Thread-safe: all state is under `_lock`."""

    def __init__(
        self, *, token: str | None = None, host: str = "127.0.0.1",
        tls: ssl.SSLContext | None = None,
    ) -> None:  # fmt: skip
        self.host = host  # another loopback address (127.0.0.2) is another host to a client
        self.tls = tls  # a server-side context: the stub answers HTTPS
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._held = False
        self._arrived = 0
        self._faults: list[Fault] = []
        self._slow = 0.0
        self.valid_tokens: set[str] = {token} if token else set()
        self.revoked_tokens: set[str] = set()
        self.requests: list[dict[str, Any]] = []
        self.errors: list[str] = []  # the stub's own exceptions (answered 500): a test bug

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        assert self._server is None, "already started"
        self._server = _Server(self)
        # A short poll interval: shutdown() waits for it, on every test's teardown.
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{type(self).__name__}:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        self.release()  # held requests complete (and create), as a real provider's would
        # Hang up idle keep-alive connections so their threads end now, not when clients close.
        with server.conns_lock:
            for conn in list(server.conns):
                with contextlib.suppress(OSError):  # already closed by its client
                    conn.shutdown(socket.SHUT_RDWR)
        server.server_close()
        assert self._thread is not None
        self._thread.join(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    # --- behaviours ------------------------------------------------------------------------

    def fail_next(self, n: int = 1, status: int = 503, path_prefix: str = "") -> None:
        """The next n requests (under path_prefix) answer `status` without any effect."""
        self._add(Fault("fail", n, status=status, path_prefix=path_prefix))

    def fail_for(self, seconds: float, status: int = 503, path_prefix: str = "") -> None:
        until = time.monotonic() + seconds
        self._add(Fault("fail", None, until=until, status=status, path_prefix=path_prefix))

    def rate_limit_next(self, n: int = 1, retry_after: float = 1, path_prefix: str = "") -> None:
        """The next n requests answer 429 with Retry-After, without any effect."""
        self._add(
            Fault("rate_limit", n, status=429, retry_after=retry_after, path_prefix=path_prefix)
        )

    def malformed_next(self, n: int = 1, path_prefix: str = "") -> None:
        """The next n requests take effect, then answer 200 with a body that is not JSON."""
        self._add(Fault("malformed", n, status=200, path_prefix=path_prefix))

    def drop_next(self, n: int = 1, path_prefix: str = "") -> None:
        """The next n requests take effect, then the connection closes without an answer."""
        self._add(Fault("drop", n, path_prefix=path_prefix))

    def slow(self, seconds: float) -> None:
        """Every answer waits this long after the effect (0 to turn off)."""
        with self._lock:
            self._slow = seconds

    def require_token(self, token: str) -> None:
        """Accept `Authorization: Bearer <token>`; once any is required, others answer 401."""
        with self._lock:
            self.valid_tokens.add(token)

    def revoke_token(self, token: str) -> None:
        with self._lock:
            self.revoked_tokens.add(token)

    # --- records ---------------------------------------------------------------------------

    def count(self, method: str | None = None, path_prefix: str = "") -> int:
        with self._lock:
            return sum(
                1
                for r in self.requests
                if (method is None or r["method"] == method.upper())
                and r["path"].startswith(path_prefix)
            )

    def clear(self) -> None:
        """Forget what was recorded and stored; behaviours (tokens, faults, hold) stay."""
        with self._lock:
            self.requests.clear()
            self.errors.clear()
            self._arrived = 0

    # --- for subclasses --------------------------------------------------------------------

    def route(self, request: Request) -> Response:
        raise NotImplementedError

    def gate(self) -> None:
        """Called by a subclass where its effect is about to happen: counts the arrival and
        blocks while held."""
        with self._cond:
            self._arrived += 1
            arrival = self._arrived
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._held or arrival < self._hold_from)

    def auth_error(self, request: Request) -> Response | None:
        with self._lock:
            if not self.valid_tokens and not self.revoked_tokens:
                return None
            token = request.bearer()
            if (
                token is None
                or token in self.revoked_tokens
                or (self.valid_tokens and token not in self.valid_tokens)
            ):
                return Response(401, {"error": "invalid_token"})
        return None

    def fault_response(self, fault: Fault) -> Response:
        if fault.kind == "rate_limit":
            return Response(
                429, {"error": "rate_limited"}, {"Retry-After": f"{fault.retry_after:g}"}
            )
        return Response(fault.status, {"error": "unavailable"})

    # --- internals -------------------------------------------------------------------------

    def _add(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _take_fault(self, path: str) -> Fault | None:
        with self._lock:
            now = time.monotonic()
            self._faults = [
                f
                for f in self._faults
                if (f.remaining is None or f.remaining > 0) and (f.until is None or f.until > now)
            ]
            for fault in self._faults:
                if path.startswith(fault.path_prefix):
                    if fault.remaining is not None:
                        fault.remaining -= 1
                    return fault
        return None

    def dispatch(self, request: Request) -> Response | None:
        with self._lock:
            self.requests.append(
                {
                    "method": request.method,
                    "path": request.path,
                    "query": request.query,
                    "headers": request.headers,
                    "body": request.body,
                    "raw": request.raw,
                    "monotonic": time.monotonic(),
                    "wall": time.time(),
                }
            )
        fault = self._take_fault(request.path)
        if fault is not None and fault.kind in ("fail", "rate_limit"):
            return self.fault_response(fault)
        try:
            response = self.auth_error(request) or self.route(request)
        except Exception as exc:  # a stub bug: answer, and let the fixture report it
            with self._lock:
                self.errors.append(f"{request.method} {request.path}: {exc!r}")
            return Response(500, {"error": "stub_error", "detail": repr(exc)})
        with self._lock:
            delay = self._slow
        if delay:
            time.sleep(delay)
        if fault is not None and fault.kind == "malformed":
            return Response(200, raw=b"<html>502 Bad Gateway</html>")
        if fault is not None and fault.kind == "drop":
            return None
        return response
