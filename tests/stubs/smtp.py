"""An SMTP server (aiosmtpd in its own thread and event loop) that records every message.

Like the HTTP stubs it can hold a message after DATA arrived and before it is accepted, and a
held message is still delivered on release even when the client has gone: aiosmtpd cancels a
session's handler when its client disconnects, so delivery runs in a task of its own.
"""

from __future__ import annotations

import asyncio
import email
import email.message
import email.policy
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from .base import Holdable


@dataclass
class SmtpMessage:
    mail_from: str
    rcpt_tos: list[str]
    message: email.message.EmailMessage  # parsed; a subclass of email.message.Message
    raw: bytes
    login: str | None = None  # the AUTH user name, when the client logged in
    monotonic: float = field(default_factory=time.monotonic)
    wall: float = field(default_factory=time.time)

    @property
    def message_id(self) -> str | None:
        value = self.message["Message-ID"]
        return None if value is None else str(value)

    @property
    def headers(self) -> dict[str, str]:
        """Header names lowercased; a repeated header keeps its first value."""
        found: dict[str, str] = {}
        for name, value in self.message.items():
            found.setdefault(name.lower(), str(value))
        return found


class _Controller(Controller):
    def _create_server(self) -> Coroutine[Any, Any, asyncio.AbstractServer]:
        # aiosmtpd's Controller connects to its own port once started, so port 0 would not
        # work as is: bind port 0 here (no free-port race) and record the port it got; a
        # port chosen by the test (another address's stub on the same port) is bound as is.
        async def bind() -> asyncio.AbstractServer:
            server = await self.loop.create_server(
                self._factory_invoker, host=self.hostname, port=self.port
            )
            self.port = server.sockets[0].getsockname()[1]
            return server

        return bind()


class SmtpStub(Holdable):
    """`credentials` (user, password), settable at any time: AUTH must match them (else 535);
    None accepts any. AUTH is offered without TLS (the stub has no TLS). A message arrives
    (``arrived``, ``hold()``) at DATA's end; rejected ones do not count."""

    def __init__(
        self,
        *,
        credentials: tuple[str, str] | None = None,
        hostname: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.credentials = credentials
        self.hostname = hostname
        self._port = port  # 0: any free port
        self.logins: list[tuple[str, str]] = []  # every AUTH attempt (user, password)
        self._lock = threading.Condition()
        self._cond = self._lock  # Holdable's condition
        self._controller: _Controller | None = None
        self._held = False
        self._arrived = 0
        self._delivering = 0
        self._faults: list[tuple[str, str]] = []  # (stage, reply), one per failed command
        self._tasks: set[asyncio.Task[None]] = set()  # strong refs: asyncio keeps weak ones
        self.messages: list[SmtpMessage] = []
        self.rejected = 0  # commands answered with an injected failure

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        assert self._controller is None, "already started"
        # server_hostname: else aiosmtpd calls socket.getfqdn(), which can wait on DNS.
        self._controller = _Controller(
            self,
            hostname=self.hostname,
            port=self._port,
            server_hostname="smtp-stub.test",
            authenticator=self._authenticate,
            auth_require_tls=False,
        )
        self._controller.start()
        return self

    def stop(self) -> None:
        controller, self._controller = self._controller, None
        if controller is None:
            return
        # Held messages are delivered, as a real server would, before the loop is torn down.
        self.release()
        with self._lock:
            self._lock.wait_for(lambda: self._delivering == 0, timeout=5)
        controller.stop()

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
    def host(self) -> str:
        return self.hostname

    @property
    def port(self) -> int:
        assert self._controller is not None, "not started"
        return self._controller.port

    @property
    def url(self) -> str:
        return f"smtp://{self.hostname}:{self.port}"

    # --- behaviours and records ------------------------------------------------------------

    def fail_next(self, n: int = 1, code: int = 451, at: str = "DATA") -> None:
        """The next n DATA (or RCPT, one per recipient) commands fail temporarily."""
        stage = at.upper()
        assert stage in ("DATA", "RCPT")
        with self._lock:
            self._faults += [(stage, f"{code} 4.3.0 Temporary failure (stub)")] * n

    def clear(self) -> None:
        with self._lock:
            self.messages.clear()
            self.logins.clear()
            self._arrived = 0
            self.rejected = 0

    # --- aiosmtpd handler hooks (run on the controller's event loop) -----------------------

    def _take_fault(self, stage: str) -> str | None:
        with self._lock:
            for i, (at, reply) in enumerate(self._faults):
                if at == stage:
                    del self._faults[i]
                    self.rejected += 1
                    return reply
        return None

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        if not isinstance(data, LoginPassword):
            return AuthResult(success=False, handled=False)
        given = (data.login.decode(), data.password.decode())
        with self._lock:
            self.logins.append(given)
            ok = self.credentials is None or given == self.credentials
        return AuthResult(success=ok, handled=False, auth_data=data)

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        reply = self._take_fault("RCPT")
        if reply is not None:
            return reply
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        reply = self._take_fault("DATA")
        if reply is not None:
            return reply
        raw = envelope.original_content or b""
        message = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(message, email.message.EmailMessage)
        login = session.auth_data.login.decode() if session.auth_data else None
        received = SmtpMessage(
            str(envelope.mail_from), list(envelope.rcpt_tos), message, raw, login
        )
        with self._lock:
            self._arrived += 1
            self._delivering += 1
            self._lock.notify_all()
        task = asyncio.get_running_loop().create_task(self._deliver(received))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # shield: the session's cancellation (client gone) must not cancel the delivery.
        await asyncio.shield(task)
        return "250 OK queued"

    async def _deliver(self, received: SmtpMessage) -> None:
        try:
            while True:
                with self._lock:
                    if not self._held:
                        self.messages.append(received)
                        return
                await asyncio.sleep(0.01)  # never block the loop: other sessions go on
        finally:
            with self._lock:
                self._delivering -= 1
                self._lock.notify_all()
