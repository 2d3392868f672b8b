"""The web server that ``manage.py runengine`` supervises: waitress, on a socket runengine binds.

Why waitress (docs/how-to/production.md, "Serving the web"): it reads every request, headers and
body, on its event loop and hands only complete requests to its fixed pool of threads, and it
buffers responses the same way. A client that trickles bytes (slowloris) therefore holds a
connection, never a thread, and the pool bounds the database connections the web may open.

runengine binds the listening socket itself (a taken port is an error before anything
starts) and passes it to each web process (``python -m waymark_config.web --fd N``): every process
accepts on the same socket, and a restarted process serves it again at once.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import os
import signal
import socket
import sys
import time
from typing import Any, cast

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask
from waitress.utilities import BadRequest, Error

from .exit_codes import EXIT_CONFIG, exit_interrupted

# How long a connection refused part-way is still read (and discarded) before it is closed.
LINGER_SECONDS = 2.0

# The server's own errors, in the API's shape {"code", "detail"} (docs/how-to/call-the-api.md).
ERRORS: dict[int, tuple[str, str]] = {
    400: ("bad_request", "The request is malformed."),
    413: ("payload_too_large", "The request body is too large."),
    414: ("uri_too_long", "The request line is too long."),
    431: ("headers_too_large", "The request headers are too large."),
    500: ("server_error", "Internal error; it has been logged."),
    501: ("not_implemented", "This transfer encoding is not supported."),
}


class PortInUse(Exception):
    pass


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; PortInUse (one line, for the operator) if taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    # SO_REUSEADDR lets a restart bind past TIME_WAIT; it never shares a port another
    # program listens on (that needs SO_REUSEPORT, which is not set).
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        if error.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"{host}:{port} is already in use by another program: stop it, or serve on "
                "another port (--port or WAYMARK_PORT)"
            ) from error
        raise PortInUse(f"cannot listen on {host}:{port}: {error.strerror}") from error
    listener.listen(2048)
    listener.set_inheritable(True)
    return listener


def web_argv(fd: int, grace: float) -> list[str]:
    """The command line of one web process serving the listening socket ``fd``."""
    return [sys.executable, "-m", "waymark_config.web", "--fd", str(fd), "--grace", str(grace)]


class UriTooLong(BadRequest):
    code = 414
    reason = "URI Too Long"


class JsonErrorTask(ErrorTask):
    """The server's own error answers (400, 413, 414, 431, 500, 501) as JSON."""

    def execute(self) -> None:
        request: Any = self.request  # the stubs call it an Error; it is the parser
        error: Error = request.error
        code, detail = ERRORS.get(error.code, ("error", error.reason))
        body = json.dumps({"code": code, "detail": detail}).encode()
        self.status = f"{error.code} {error.reason}"
        self.response_headers = [*self.response_headers, ("Content-Type", "application/json")]
        self.set_close_on_finish()
        if isinstance(self.channel, Channel):
            self.channel.linger = True
        self.content_length = len(body)
        self.write(body)


class Parser(HTTPRequestParser):
    """waitress's parser plus a request-line limit (414) and the time the request began."""

    def __init__(self, adj: Adjustments) -> None:
        super().__init__(adj)
        self.started = time.monotonic()

    def received(self, data: bytes) -> int:
        if self.body_rcv is None and not self.completed:
            head = self.header_plus + data
            end = head.find(b"\n")
            if (end if end >= 0 else len(head)) > web_settings()["MAX_REQUEST_LINE_BYTES"]:
                self.parse_header(b"GET / HTTP/1.0\r\n")  # gives the error answer a version
                self.error = UriTooLong("request line too long")
                self.completed = True
                return len(data)
        return int(super().received(data))


class Channel(HTTPChannel):
    """A connection. After an error answer (the request was refused part-way) it closes
    lingering: closing with unread request bytes would send the client a reset, which can
    destroy the answer before the client reads it."""

    parser_class = Parser
    error_task_class = JsonErrorTask
    linger = False  # set by the error answer
    linger_until: float | None = None

    def handle_close(self) -> None:
        if self.linger and self.linger_until is None and self.connected and self.socket:
            try:
                self.socket.shutdown(socket.SHUT_WR)  # the answer is sent: FIN after it
            except OSError:
                super().handle_close()
                return
            self.linger_until = time.monotonic() + LINGER_SECONDS
            self.will_close = self.close_when_flushed = False
            return
        super().handle_close()

    def readable(self) -> bool:
        return self.linger_until is not None or bool(super().readable())

    def writable(self) -> bool:
        return self.linger_until is None and bool(super().writable())

    def handle_read(self) -> None:
        if self.linger_until is None:
            super().handle_read()
            return
        try:
            self.recv(65536)  # discarded; at the client's end of stream this closes
        except OSError:
            super().handle_close()


class Server(TcpWSGIServer):
    channel_class = Channel
    socket_map: dict[int, Any]  # every connection and the listener (set by make_server)

    def maintenance(self, now: float) -> None:
        """Beside waitress's idle timeout: close a connection whose request (headers and
        body) has not fully arrived REQUEST_TIMEOUT_SECONDS after its first byte, however
        steadily it trickles in."""
        super().maintenance(now)  # type: ignore[arg-type]  # a float (time.time()) in fact
        cutoff = time.monotonic() - web_settings()["REQUEST_TIMEOUT_SECONDS"]
        channels = cast("dict[int, Channel]", self.active_channels)  # stubs: a channel
        for channel in list(channels.values()):
            request = channel.request
            if isinstance(request, Parser) and not request.completed and request.started < cutoff:
                channel.will_close = True
            if channel.linger_until is not None and channel.linger_until < time.monotonic():
                Channel.handle_close(channel)  # lingered long enough: close now


def web_settings() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.WAYMARK_WEB)


access_log = logging.getLogger("waymark.access")


def logged(application: Any) -> Any:
    """The application, with one INFO line per request on ``waymark.access``: client
    address, method, path, status and time to the answer's start. Never the query string
    or a header: they may carry a key, a cursor or a person's data."""

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        began = time.monotonic()

        def start(status: str, headers: Any, exc_info: Any = None) -> Any:
            access_log.info(
                "%s %s %s %s %.1f ms", environ.get("REMOTE_ADDR", "-"),
                environ.get("REQUEST_METHOD", "-"), environ.get("PATH_INFO", "-"),
                status.split(" ", 1)[0], (time.monotonic() - began) * 1000,
            )  # fmt: skip
            return start_response(status, headers, exc_info)

        return application(environ, start)

    return app


def without_head_bodies(application: Any) -> Any:
    """The application, answering HEAD with its GET's status and headers and no body (RFC 9110
    9.3.2). Neither Django's handler nor waitress drops the body Django writes for HEAD: sent,
    it was read by a keep-alive client as the start of its next answer ("illegal status
    line"), and a proxy pooling connections could hand it to another client."""

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        answer = application(environ, start_response)
        if environ.get("REQUEST_METHOD") != "HEAD":
            return answer
        close = getattr(answer, "close", None)
        if close is not None:
            close()  # the request's end (Django's request_finished) as for any answer
        return []

    return app


def make_server(listener: socket.socket, application: Any) -> Server:
    web = web_settings()
    adj = Adjustments(
        threads=web["THREADS"],
        connection_limit=web["CONNECTION_LIMIT"],
        channel_timeout=web["IDLE_TIMEOUT_SECONDS"],
        # Timeouts are checked this often (whole seconds): the loop wakes at least each second.
        cleanup_interval=1,
        max_request_header_size=web["MAX_HEADER_BYTES"],
        max_request_body_size=web["MAX_BODY_BYTES"],
        ident="waymark",
        expose_tracebacks=False,
    )
    sockinfo = (listener.family, listener.type, listener.proto, listener.getsockname())
    socket_map: dict[int, Any] = {}
    server = Server(
        without_head_bodies(application), socket_map, _sock=listener, adj=adj,
        bind_socket=False, sockinfo=sockinfo,
    )  # fmt: skip
    server.socket_map = socket_map
    return server


def serve(fd: int, grace: float) -> None:
    """Serve until SIGTERM or SIGINT, then let answers in progress finish for ``grace`` s."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waymark_config.settings")
    from django.core.exceptions import ImproperlyConfigured

    try:
        from waymark_config.wsgi import application
    except ImproperlyConfigured as error:
        # A setting that cannot work (manage.py's rule): one line, and EX_CONFIG, on which
        # runengine stops with the reason instead of restarting this process forever.
        print(error, file=sys.stderr)
        sys.exit(EXIT_CONFIG)

    try:
        listener = socket.socket(fileno=fd)
    except OSError as error:
        print(f"web: no listening socket on fd {fd}: {error}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    if web_settings()["ACCESS_LOG"]:
        application = logged(application)
    server = make_server(listener, application)
    # One line when this process accepts: "ready" (runengine) means one process answers,
    # and a process still loading is not yet sharing the socket's connections.
    logging.getLogger("waymark.web").info("web process %d serving", os.getpid())
    stopping: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopping.append(signum)
        server.pull_trigger()  # wakes the loop now, not at its next one-second tick

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    while not stopping:
        wasyncore.loop(timeout=1.0, use_poll=True, map=server.socket_map, count=1)
    server.accepting = False  # the other web processes (and the kernel's queue) go on
    server.del_channel()
    deadline = time.monotonic() + grace
    while _busy(server) and time.monotonic() < deadline:
        wasyncore.loop(timeout=0.1, use_poll=True, map=server.socket_map, count=1)
    server.task_dispatcher.shutdown(timeout=max(0, math.ceil(deadline - time.monotonic())))


def _busy(server: Server) -> bool:
    """Whether a request is being served or an answer is still being sent."""
    return any(
        isinstance(channel, Channel) and (channel.requests or channel.total_outbufs_len)
        for channel in list(server.socket_map.values())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="One Waymark web process (see runengine).")
    parser.add_argument("--fd", type=int, required=True, help="the listening socket")
    parser.add_argument("--grace", type=float, default=10.0)
    args = parser.parse_args()
    try:
        serve(args.fd, args.grace)
    except KeyboardInterrupt:
        # Ctrl-C before serve() took SIGINT for itself (loading Django): one line (manage.py's
        # rule). Under runengine it never comes: its children start with SIGINT blocked.
        exit_interrupted()


if __name__ == "__main__":
    main()
