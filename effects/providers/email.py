"""The ``email`` provider: one message through Django's email backends (SMTP by default).

The effect key is in the ``Message-ID`` and in an ``X-Waymark-Effect-Key`` header, so the
message can be found in a mailbox and deduplicated by receivers. SMTP has neither
idempotency keys nor a lookup: a send whose ending nobody saw (the connection dropped after
DATA) is parked for a person, never sent twice on a guess.

Connection options: ``host``, ``port``, ``use_tls``, ``use_ssl``, ``username``,
``from_address``; the secret is the SMTP password.
"""

from __future__ import annotations

import hashlib
import re
import smtplib
import socket
from collections.abc import Mapping
from typing import Any

import httpcore
from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from workflows.plugins import StepFailure, render

from ..consent import NotOneAddress, canonical_email
from ..egress import EgressRefused, vet_host
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
)
from .http import EgressDenied

KEY_HEADER = "X-Waymark-Effect-Key"


def message_id(key: str, conn: ConnectionInfo | None) -> str:
    """A Message-ID made from the effect key: the same for every attempt of one effect."""
    domain = str((conn.options if conn else {}).get("message_id_domain", "waymark.invalid"))
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    left = re.sub(r"[^A-Za-z0-9_-]+", ".", key)  # dot-atom text only (RFC 5322)
    return f"<{left}.{digest}@{domain}>"


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


def _vet_mail_server(conn: ConnectionInfo) -> None:
    """The mail server is an outside address like any other: the egress guard applies (an
    organisation allowlists its internal relay)."""
    host, port = str(conn.options.get("host", "localhost")), int(conn.options.get("port", 25))
    try:
        vet_host(host, port, conn.allow)
    except EgressRefused as exc:
        raise EgressDenied(str(exc)) from exc
    except httpcore.ConnectError as exc:
        raise Unreachable(str(exc)) from exc


class EmailProvider(Provider):
    name = "email"

    def prepare(
        self, step: Mapping[str, Any], context: Mapping[str, Any], conn: ConnectionInfo | None
    ) -> Request:
        to = str(render(step["to"], dict(context))).strip()
        try:
            # The mailbox the server is given, however the address is written: what the
            # suppression list is checked against.
            recipient = canonical_email(to)
        except NotOneAddress as exc:
            raise StepFailure(f"to must be one email address ({exc}): {to[:100]!r}",
                              retryable=False) from exc  # fmt: skip
        subject = str(render(step["subject"], dict(context)))
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
            connection=self._backend(conn),
        )  # fmt: skip
        try:
            message.send(fail_silently=False)
        except Exception as exc:
            raise smtp_error(exc) from exc
        result = {"message_id": msgid, "to": request.payload["to"]}
        return Answer(result=result, response=result)

    def _backend(self, conn: ConnectionInfo | None) -> Any:
        options = conn.options if conn else {}
        if conn is not None:
            _vet_mail_server(conn)
        return get_connection(
            settings.EFFECTS["EMAIL_BACKEND"], fail_silently=False,
            host=options.get("host", "localhost"), port=int(options.get("port", 25)),
            username=options.get("username", ""), password=conn.secret if conn else "",
            use_tls=bool(options.get("use_tls", False)),
            use_ssl=bool(options.get("use_ssl", False)),
            timeout=conn.timeout_seconds if conn else 30.0,
        )  # fmt: skip

    def probe(self, conn: ConnectionInfo) -> None:
        backend = self._backend(conn)
        try:
            backend.open()
        except Exception as exc:
            raise smtp_error(exc) from exc
        finally:
            backend.close()
