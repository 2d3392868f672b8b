"""Signals from outside: the API's entry to ``engine/signals.py``.

- ``signal_send``: a named signal with a correlation key (or for one run), stored once per
  identity, delivered to the step waiting for it or kept until one waits;
- signal-with-start: the same, for the run of a start key, starting that run first when it
  does not exist yet (``run_start`` is idempotent per start key);
- ``inbound_email``: a reply to an email a run sent: the signal ``email.reply`` correlated by
  the reply's In-Reply-To (else its References, newest first), the Message-ID the email
  effect stored in its step's output.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection

from ..definitions.storable import UNSTORABLE_REASON, unstorable_path
from ..engine import sql
from ..engine.signals import Delivered, deliver
from ..engine.sql.rows import fetch_dict
from ..errors import InvalidInput, PendingSignalsQuota, SignalIdTaken, StartKeyConflict
from ..models import Organisation, Run, Signal
from . import quotas
from .runs import check_json_value, run_start

SIGNAL_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,99}")
EMAIL_REPLY = "email.reply"
MAX_IDENTITY = 200
MAX_CORRELATION = 500


@dataclass(frozen=True)
class SignalSent:
    delivered: Delivered
    run_id: int | None = None  # the run it was sent to (signal-with-start)
    run_created: bool = False


def signal_send(
    *,
    org: Organisation,
    name: str,
    correlation: str = "",
    payload: Any = None,
    identity: str | None = None,
    start: dict[str, Any] | None = None,
) -> SignalSent:
    """Send a signal; with ``start`` ({"automation", "start_key", "input"}), to the run of
    that start key, started first if it does not exist."""
    _check(name, correlation, identity, payload)
    if start is None:
        sent = _deliver(org, name=name, correlation=correlation, payload=payload,
                        identity=identity)  # fmt: skip
        return SignalSent(sent)
    if identity is not None:
        _refuse_id_of_another(org, identity, name, correlation)
    run_id, created = _run_of_start_key(org, start)
    # The signal of the run this call just started is kept whatever the pending-signals
    # quota says: refused, it would leave that run started without the signal it was started
    # for (the starts quota bounds these, one per run).
    sent = _deliver(org, name=name, correlation=correlation, payload=payload,
                    identity=identity, run_id=run_id, quota=not created)  # fmt: skip
    return SignalSent(sent, run_id, created)


def _deliver(org: Organisation, *, quota: bool = True, **signal: Any) -> Delivered:
    """``deliver`` under the organisation's pending-signals quota: a signal no step takes is
    kept only within it (PendingSignalsQuota, 429, and nothing stored, past it)."""
    admit = (lambda: quotas.admit_pending_signal(org)) if quota else None
    try:
        return deliver(org_id=org.pk, admit_pending=admit, **signal)
    except PendingSignalsQuota as refused:
        quotas.remember_count(org, refused)
        raise


def _refuse_id_of_another(org: Organisation, identity: str, name: str, correlation: str) -> None:
    """A signal-with-start whose id another signal (another name or correlation) holds:
    refused before anything starts. Sent on, its signal would be that other one's duplicate
    (nothing stored) and the run it started would wait for a signal never kept."""
    held = Signal.objects.filter(org=org, identity=identity).values("name", "correlation").first()
    if held is not None and (held["name"], held["correlation"]) != (name, correlation):
        raise SignalIdTaken(identity=identity, name=held["name"], correlation=held["correlation"])


def _run_of_start_key(org: Organisation, start: dict[str, Any]) -> tuple[int, bool]:
    """The run of the start key: the existing one (its input stands; the signal is for it,
    whatever input came with it, and no quota applies), or a new one started now. A key
    that started a run of another automation is refused, as a start with it is
    (start_key_conflict): the signal is not for that run."""
    existing = (Run.objects.filter(org=org, start_key=start["start_key"])
                .values("pk", "automation__slug").first())  # fmt: skip
    if existing is not None:
        if existing["automation__slug"] != start["automation"]:
            raise StartKeyConflict(start_key=start["start_key"], run_id=existing["pk"],
                                   differs="of another automation")  # fmt: skip
        return existing["pk"], False
    started = run_start(org=org, automation_slug=start["automation"],
                        run_input=start.get("input", {}), start_key=start["start_key"])  # fmt: skip
    return started.run_id, started.created


def inbound_email(
    *, org: Organisation, message_id: str, in_reply_to: str, references: Sequence[str],
    payload: dict[str, Any],
) -> SignalSent:  # fmt: skip
    """A reply to an email a run sent: delivered as ``email.reply`` to the step waiting on
    the Message-ID it answers (In-Reply-To, else the newest of References that one waits
    for); kept, correlated by In-Reply-To, when none waits yet."""
    candidates = [c.strip() for c in [in_reply_to, *reversed(list(references))] if c.strip()]
    if not candidates:
        raise InvalidInput(reason="in_reply_to or references is required: what does it answer?")
    candidates = [c for c in dict.fromkeys(candidates) if len(c) <= MAX_CORRELATION][:100]
    if not candidates:
        raise InvalidInput(reason=f"in_reply_to and references: at most {MAX_CORRELATION} "
                                  "characters each")  # fmt: skip
    correlation = next((c for c in candidates if _awaited(org.pk, c)), candidates[0])
    identity = _email_identity(message_id.strip()) if message_id.strip() else None
    _check(EMAIL_REPLY, correlation, identity, payload)
    # Every candidate is kept: a reply that comes before the run waits still meets a step
    # waiting on any Message-ID of its thread.
    sent = _deliver(org, name=EMAIL_REPLY, correlation=correlation, payload=payload,
                    identity=identity, source="email", also=candidates)  # fmt: skip
    return SignalSent(sent)


def _email_identity(message_id: str) -> str:
    """``email:<Message-ID>``; a long one is hashed to fit (it identifies, nobody reads it)."""
    identity = f"email:{message_id}"
    if len(identity) <= MAX_IDENTITY:
        return identity
    return "email:sha256:" + hashlib.sha256(message_id.encode()).hexdigest()


def _awaited(org_id: int, correlation: str) -> bool:
    params: dict[str, Any] = {"org_id": org_id, "name": EMAIL_REPLY, "run_id": None,
                              "correlation": correlation, "correlations": []}  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(sql.SIGNAL_WAITERS, params)
        return fetch_dict(cursor) is not None


def _check(name: str, correlation: str, identity: str | None, payload: Any) -> None:
    if SIGNAL_NAME_RE.fullmatch(name) is None:
        raise InvalidInput(reason="name: a signal name starts with a letter, then letters, "
                                  "digits, _ . : or - (at most 100 characters)")  # fmt: skip
    if len(correlation) > MAX_CORRELATION:
        raise InvalidInput(reason=f"correlation: at most {MAX_CORRELATION} characters")
    if identity is not None and not 1 <= len(identity) <= MAX_IDENTITY:
        raise InvalidInput(reason=f"id: 1 to {MAX_IDENTITY} characters")
    for text, what in ((name, "name"), (correlation, "correlation"), (identity or "", "id")):
        if unstorable_path(text) is not None:
            raise InvalidInput(reason=f"{what} {UNSTORABLE_REASON}")
    check_json_value(payload, "payload", "The signal payload")
