"""The ``email`` provider: one message through Django's email backends (SMTP by default).

The effect key is in the ``Message-ID`` and in an ``X-Waymark-Effect-Key`` header, so the
message can be found in a mailbox and deduplicated by receivers. SMTP has neither
idempotency keys nor a lookup: a send whose ending nobody saw (the connection dropped after
DATA) is parked for a person, never sent twice on a guess.

Connection options: ``host``, ``port``, ``use_tls``, ``use_ssl``, ``username``,
``from_address``; the secret is the SMTP password.

The mail server is an outside address like any other. With Django's SMTP backend (the
default) the connection is opened to the address the egress guard vetted (``VettedSMTP``),
so the password goes to that address and no other: smtplib would resolve the name again
itself, and a rebinding DNS answer could hand it a private one. TLS still verifies the
server's certificate for the host name.

A message that cannot be sent as rendered (a subject with a line break: header injection; a
``to`` that is not one address) fails the step in ``prepare`` with ``invalid_request``; the
whole message is built again inside ``before_sending`` before the server is contacted, so
whatever Django refuses to build fails the same way, never as an unknown outcome.
"""

from __future__ import annotations

import hashlib
import re
import smtplib
import socket
from collections.abc import Hashable, Mapping
from functools import partial
from typing import Any

import httpcore
from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.core.mail.backends.smtp import EmailBackend as SmtpBackend
from django.core.mail.message import sanitize_address
from django.utils.module_loading import import_string

from workflows.plugins import render

from ..answers import answer_max_bytes, too_large
from ..consent import NotOneAddress, canonical_email
from ..egress import Allowlist, CallDeadline, EgressRefused, vet_host
from .base import (
    Ambiguous,
    Answer,
    AuthFailed,
    CallError,
    ConnectionInfo,
    Provider,
    Refused,
    Request,
    Unreachable,
    before_sending,
)
from .http import EgressDenied, invalid_input

KEY_HEADER = "X-Waymark-Effect-Key"


def message_id(key: str, conn: ConnectionInfo | None) -> str:
    """A Message-ID made from the effect key: the same for every attempt of one effect."""
    domain = str((conn.options if conn else {}).get("message_id_domain", "waymark.invalid"))
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    left = re.sub(r"[^A-Za-z0-9_-]+", ".", key)  # dot-atom text only (RFC 5322)
    return f"<{left}.{digest}@{domain}>"


def _build(message: EmailMessage) -> None:
    """Build ``message`` as Django's SMTP backend does before it sends (the addresses
    sanitised, the MIME message rendered): whatever raises here would raise there."""
    encoding = message.encoding or settings.DEFAULT_CHARSET
    for address in [message.from_email, *message.recipients()]:
        sanitize_address(address, encoding)
    message.message().as_bytes()


def smtp_error(exc: Exception) -> CallError:
    """What an SMTP failure says about whether the message was accepted."""
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return AuthFailed(f"the mail server refused the credentials ({exc.smtp_code})")
    if isinstance(exc, smtplib.SMTPRecipientsRefused | smtplib.SMTPSenderRefused):
        codes = getattr(exc, "recipients", {}) or {}
        temporary = any(400 <= code < 500 for code, _ in codes.values()) or (
            isinstance(exc, smtplib.SMTPSenderRefused) and 400 <= exc.smtp_code < 500
        )
        if temporary:
            return Unreachable(f"the mail server asked to try later: {exc}")
        return Refused(f"the mail server refused the message: {exc}")
    if isinstance(exc, smtplib.SMTPDataError | smtplib.SMTPResponseException):
        code = exc.smtp_code
        if 400 <= code < 500:  # refused for now, before accepting: nothing was sent
            return Unreachable(f"the mail server asked to try later ({code})")
        return Refused(f"the mail server refused the message ({code})")
    if isinstance(exc, smtplib.SMTPConnectError | ConnectionRefusedError):
        return Unreachable(f"could not connect to the mail server: {exc}")
    if isinstance(exc, smtplib.SMTPServerDisconnected | socket.timeout | OSError):
        return Ambiguous(f"the mail server connection ended without an answer: {exc}")
    return Ambiguous(f"{type(exc).__name__}: {exc}")


def vetted_addresses(
    host: str, port: int, allow: Allowlist, within: float | None = None
) -> list[str]:
    """The mail server's addresses once the egress guard passed them (an organisation
    allowlists its internal relay), the name resolved within ``within`` seconds."""
    try:
        return vet_host(host, port, allow, within=within)
    except EgressRefused as exc:
        raise EgressDenied(str(exc)) from exc
    except httpcore.ConnectError as exc:
        raise Unreachable(str(exc)) from exc


class VettedSMTP(smtplib.SMTP):
    """smtplib.SMTP that connects to an address the egress guard vetted, not to whatever the
    name resolves to when smtplib connects (``_get_socket`` is smtplib's own extension
    point: SMTP_SSL and LMTP override it too)."""

    def __init__(
        self, *args: Any, allow: Allowlist, deadline: CallDeadline | None = None, **kwargs: Any
    ) -> None:
        self._allow = allow  # before __init__, which connects
        self._deadline = deadline
        super().__init__(*args, **kwargs)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        last: OSError | None = None
        # smtplib's timeout may be socket's "no timeout given" sentinel rather than a number.
        bounds = [float(timeout)] if isinstance(timeout, int | float) else []
        if self._deadline is not None:
            bounds.append(self._deadline.left())
        within = min(bounds, default=None)
        for address in vetted_addresses(host, port, self._allow, within):
            try:
                sock = socket.create_connection((address, port), timeout, self.source_address)
            except OSError as exc:  # refused or unreachable: the next vetted address
                last = exc
                continue
            if self._deadline is not None:
                self._deadline.watch_socket(sock)
            return sock
        assert last is not None  # vet_host never returns an empty list
        raise last

    def getreply(self) -> tuple[int, bytes]:
        """smtplib's, each reply read up to ``WAYMARK_OUTSIDE_ANSWER_MAX_BYTES`` (then the
        connection is given up on: ``answer_too_large``)."""
        if self.file is None and self.sock is not None:  # smtplib makes it here, lazily
            self.file = _CappedReplies(self.sock.makefile("rb"))
        if isinstance(self.file, _CappedReplies):
            self.file.left = answer_max_bytes()
        return super().getreply()


class _CappedReplies:
    """The server's side of the conversation as smtplib reads it (by lines), at most
    ``left`` bytes for the reply being read: smtplib keeps every line of a reply, and a
    server may send continuation lines ("250-…") without end."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.left = 0

    def readline(self, size: int = -1) -> bytes:
        if self.left <= 0:
            raise smtplib.SMTPServerDisconnected(too_large("the mail server's reply"))
        line: bytes = self._raw.readline(self.left if size < 0 else min(size, self.left))
        self.left -= len(line)
        return line

    def close(self) -> None:
        self._raw.close()


class VettedSMTPSSL(smtplib.SMTP_SSL, VettedSMTP):
    """SMTP over TLS: SMTP_SSL's _get_socket wraps the socket VettedSMTP opened (its super()
    is VettedSMTP here), verifying the certificate for the host name."""

    def __init__(
        self, *args: Any, allow: Allowlist, deadline: CallDeadline | None = None, **kwargs: Any
    ) -> None:
        self._allow = allow  # SMTP_SSL.__init__ calls SMTP.__init__ directly, not ours
        self._deadline = deadline
        smtplib.SMTP_SSL.__init__(self, *args, **kwargs)


class VettedSmtpBackend(SmtpBackend):
    """Django's SMTP backend, connecting only to vetted addresses."""

    def __init__(
        self, *, allow: Allowlist, deadline: CallDeadline | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.allow = allow
        self.deadline = deadline

    @property
    def connection_class(self) -> Any:
        vetted = VettedSMTPSSL if self.use_ssl else VettedSMTP
        return partial(vetted, allow=self.allow, deadline=self.deadline)


def check_header_text(name: str, value: str) -> None:
    """A line break in a header is a second header (``Hi\r\nBcc: x@y``): never sent."""
    if any(char in value for char in "\r\n\0"):
        raise invalid_input(f"{name} has a line break in it (it would add mail headers)")


class EmailProvider(Provider):
    name = "email"
    destination_in_words = (
        "another SMTP server (host, port) or over another encryption (use_tls, use_ssl)"
    )

    def secret_destination(self, base_url: str, options: Mapping[str, Any]) -> Hashable:
        """The SMTP server the password is sent to, and whether it goes encrypted."""
        return (
            str(options.get("host", "localhost")).strip().lower(), str(options.get("port", 25)),
            bool(options.get("use_tls", False)), bool(options.get("use_ssl", False)),
        )  # fmt: skip

    def prepare(
        self, step: Mapping[str, Any], context: Mapping[str, Any], conn: ConnectionInfo | None
    ) -> Request:
        to = str(render(step["to"], dict(context))).strip()
        try:
            # The mailbox the server is given, however the address is written: what the
            # suppression list is checked against.
            recipient = canonical_email(to)
        except NotOneAddress as exc:
            raise invalid_input(f"to must be one email address ({exc}): {to[:100]!r}") from exc
        check_header_text("to", to)
        subject = str(render(step["subject"], dict(context)))
        check_header_text("subject", subject)
        body = str(render(step["body"], dict(context)))
        payload = {"to": to, "subject": subject, "body": body}
        return Request(payload=payload, summary={"to": to, "subject": subject},
                       recipient=recipient)  # fmt: skip

    def call(self, request: Request, key: str, conn: ConnectionInfo | None) -> Answer:
        options = conn.options if conn else {}
        sender = str(options.get("from_address", "waymark@localhost"))
        msgid = message_id(key, conn)
        message = EmailMessage(
            subject=request.payload["subject"], body=request.payload["body"],
            from_email=sender, to=[request.payload["to"]],
            headers={"Message-ID": msgid, KEY_HEADER: key},
        )  # fmt: skip
        with before_sending("the email"):
            _build(message)  # what the backend would refuse to send, before it connects
        # The timeout bounds the whole conversation with the server, not each read.
        timeout = conn.timeout_seconds if conn else 30.0
        deadline = CallDeadline(timeout)
        message.connection = self._backend(conn, deadline)
        try:
            message.send(fail_silently=False)
        except CallError:  # the egress guard refused the address, or it did not resolve
            raise
        except Exception as exc:
            if deadline.passed:
                said = f"no answer in time (within {timeout:g} s): it may have acted"
                raise Ambiguous(said) from exc
            raise smtp_error(exc) from exc
        finally:
            deadline.close()
        result = {"message_id": msgid, "to": request.payload["to"]}
        return Answer(result=result, response=result)

    def _backend(self, conn: ConnectionInfo | None, deadline: CallDeadline | None = None) -> Any:
        options = conn.options if conn else {}
        host, port = str(options.get("host", "localhost")), int(options.get("port", 25))
        allow = conn.allow if conn else Allowlist()
        kwargs: dict[str, Any] = {
            "fail_silently": False, "host": host, "port": port,
            "username": options.get("username", ""), "password": conn.secret if conn else "",
            "use_tls": bool(options.get("use_tls", False)),
            "use_ssl": bool(options.get("use_ssl", False)),
            "timeout": conn.timeout_seconds if conn else 30.0,
        }  # fmt: skip
        path = settings.EFFECTS["EMAIL_BACKEND"]
        if import_string(path) is SmtpBackend:
            return VettedSmtpBackend(allow=allow, deadline=deadline, **kwargs)
        # Another backend connects its own way: vet the host before it does (it may resolve
        # the name again; only Django's SMTP backend is made to connect to this answer).
        vetted_addresses(host, port, allow)
        return get_connection(path, **kwargs)

    def probe(self, conn: ConnectionInfo) -> None:
        backend = self._backend(conn)
        try:
            backend.open()
        except CallError:
            raise
        except Exception as exc:
            raise smtp_error(exc) from exc
        finally:
            backend.close()
