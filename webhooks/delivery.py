"""Sending deliveries: a service of the elected sweeper (``workflows.plugins``' sweep
services), working only while its sweeper leads.

- **Claim** (one transaction, ``sql.CLAIM``): up to the free sending slots, at most
  ``WAYMARK_WEBHOOK_ORG_CONCURRENCY`` in flight per organisation, the organisations taken in
  turn. A claimed delivery has a new owner token, one more attempt and a lease; one found
  with its attempts used (its last attempt never recorded an outcome) is failed there
  instead, whatever went wrong in the sending path.
- **Send**, outside any transaction: one POST through the egress guard (the organisation's
  allowlist, private addresses refused, the resolved address pinned), signed, bounded as a
  whole by ``WAYMARK_WEBHOOK_TIMEOUT_SECONDS`` (resolving the name included), never
  following a redirect; of the answer, only the status and an excerpt are ever received.
- **Record** (``sql.DELIVERED`` / ``sql.NOT_DELIVERED``), fenced by the token: a 2xx is
  delivered; anything else is tried again after a backoff with jitter, until the attempts
  are used up (then failed). A refusal of the egress guard, or a subscription gone or
  inactive, fails at once: trying again would be refused the same way.

At least once: a sender that dies between the POST and the record leaves the delivery in
flight; its lease lapses and it is sent again, with the same body and ``Waymark-Delivery-Id``
(receivers dedupe by it). Exactly one delivery row exists per event and subscription.
"""

from __future__ import annotations

import json
import logging
import queue
import random
import secrets
import ssl
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
from django.conf import settings
from django.db import connection, transaction

from effects.public import (
    CallDeadline,
    EgressRefused,
    SecretUnreadable,
    allowlist_in_force,
    decrypt,
    egress_client,
    read_capped,
    retry_after_of,
)
from workflows.plugins import Sweep
from workflows.plugins.engine import Outage, crash_point, fetch_dict, fetch_dicts

from . import sql
from .signing import SIGNATURE_HEADER, signature_header

logger = logging.getLogger(__name__)

LEASE_MARGIN_SECONDS = 10.0  # an attempt's lease: its timeout and this
RESPONSE_CHARS = 500  # of an endpoint's answer, kept on the delivery
RESPONSE_BYTES = 4 * RESPONSE_CHARS  # of its body read (UTF-8: at most 4 bytes a character)
ORGS_PER_CLAIM = 100  # organisations one claim looks at (the next claim goes on after them)
USER_AGENT = "Waymark-Webhooks/1"


def setting(name: str) -> Any:
    return settings.WEBHOOKS[name]


@dataclass(frozen=True)
class Claimed:
    id: int
    org_id: int
    subscription_id: int
    event_id: int
    event_type: str
    payload: Any
    occurred_at: datetime
    attempts: int
    token: str

    def body(self) -> bytes:
        """What is sent, the same bytes on every attempt: the delivery's id, the event's type
        and time, and its data. Keys sorted, no spaces."""
        document = {
            "id": str(self.id),
            "type": self.event_type,
            "occurred_at": self.occurred_at.isoformat(),
            "data": self.payload,
        }
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    status: int | None = None  # the endpoint's HTTP status, if it answered
    error: str = ""
    response: str = ""
    final: bool = False  # not worth trying again
    retry_after: float | None = None  # the endpoint's Retry-After, in seconds


def claim(free: int, *, after: int = 0) -> list[Claimed]:
    """Take up to ``free`` due deliveries (organisations after ``after`` first, then from the
    start), within each organisation's cap."""
    taken: list[Claimed] = []
    for start in (after, 0) if after else (0,):
        params: dict[str, Any] = {
            "free": free - len(taken), "per_org": int(setting("ORG_CONCURRENCY")),
            "after": start, "orgs": ORGS_PER_CLAIM, "token": secrets.token_hex(16),
            "lease": float(setting("TIMEOUT_SECONDS")) + LEASE_MARGIN_SECONDS,
            "max_attempts": int(setting("MAX_ATTEMPTS")),
        }  # fmt: skip
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql.CLAIM_LOCK)
            cursor.execute(sql.CLAIM, params)
            taken += [Claimed(**row) for row in fetch_dicts(cursor)]
        if len(taken) >= free:
            break
    return taken


def deliver(item: Claimed) -> Outcome:
    """Send one claimed delivery and record what happened; what happened."""
    outcome = attempt(item)
    crash_point("webhooks.after_send")  # the tests stop a sender here: sent, not recorded
    record(item, outcome)
    return outcome


def attempt(item: Claimed) -> Outcome:
    with connection.cursor() as cursor:
        cursor.execute(sql.SUBSCRIPTION, {"id": item.subscription_id})
        subscription = fetch_dict(cursor)
    if subscription is None or not subscription["active"]:
        what = "was deleted" if subscription is None else "is inactive"
        return Outcome(False, error=f"subscription_inactive: the subscription {what}", final=True)
    try:
        secret = decrypt(subscription["secret_encrypted"])
    except SecretUnreadable as exc:
        return Outcome(False, error=f"secret_unreadable: {exc}")  # tried again: keys may return
    body = item.body()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Waymark-Delivery-Id": str(item.id),
        "Waymark-Event": item.event_type,
        SIGNATURE_HEADER: signature_header(secret, body),
    }
    return post(item.org_id, subscription["url"], headers, body)


def post(org_id: int, url: str, headers: dict[str, str], body: bytes) -> Outcome:
    """One POST through the egress guard, bounded as a whole by the timeout."""
    timeout = float(setting("TIMEOUT_SECONDS"))
    deadline = CallDeadline(timeout)
    try:
        with egress_client(
            allow=allowlist_in_force(org_id), timeout=timeout, deadline=deadline,
            ssl_context=ssl_context(),
        ) as http:  # fmt: skip
            request = http.build_request("POST", url, content=body, headers=headers)
            # Only the status and an excerpt are kept: what follows is never received.
            sent = http.send(request, follow_redirects=False, stream=True)
            response = read_capped(sent, limit=RESPONSE_BYTES)
            text = response.text[:RESPONSE_CHARS]
    except EgressRefused as exc:
        return Outcome(False, error=f"egress_refused: {exc}", final=True)
    except httpx.HTTPError as exc:
        return Outcome(False, error=f"unreachable: {_unreachable(exc, deadline)}"[:1000])
    finally:
        deadline.close()
    if 200 <= response.status_code < 300:
        return Outcome(True, status=response.status_code, response=text)
    return Outcome(
        False, status=response.status_code, response=text,
        error=f"http_{response.status_code}: the endpoint answered {response.status_code}",
        retry_after=retry_after_of(response),
    )  # fmt: skip


def _unreachable(exc: httpx.HTTPError, deadline: CallDeadline) -> str:
    """Why no answer came: a connect failure says so itself (a name that did not resolve in
    time, ``dns_timeout``); otherwise a call cut at its deadline is said as such."""
    if deadline.passed and not isinstance(exc, httpx.ConnectError):
        return f"no answer within {deadline.seconds:g} s"
    return str(exc) or repr(exc)


def record(item: Claimed, outcome: Outcome) -> bool:
    """Write the attempt's outcome, if this attempt still holds the delivery."""
    params: dict[str, Any] = {
        "id": item.id, "token": item.token, "status": outcome.status,
        "response": outcome.response.replace("\x00", "\ufffd"),
    }  # fmt: skip
    if outcome.delivered:
        statement = sql.DELIVERED
    else:
        final = outcome.final or item.attempts >= int(setting("MAX_ATTEMPTS"))
        params |= {"final": final, "delay": 0.0 if final else backoff(item.attempts, outcome),
                   "error": outcome.error.replace("\x00", "\ufffd")}  # fmt: skip
        statement = sql.NOT_DELIVERED
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone() is not None


def backoff(attempts: int, outcome: Outcome | None = None) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: base * 2^(n-1), at most
    the maximum, with jitter (from half of it to all of it: deliveries that failed together
    spread out); at least what the endpoint asked for (Retry-After), within the maximum."""
    base = float(setting("RETRY_BASE_SECONDS"))
    ceiling = float(setting("RETRY_MAX_SECONDS"))
    delay = min(ceiling, base * 2 ** min(max(attempts - 1, 0), 40))
    delay = random.uniform(delay / 2, delay)  # noqa: S311 (spreading retries, not a secret)
    if outcome is not None and outcome.retry_after is not None:
        delay = max(delay, min(outcome.retry_after, ceiling))
    return delay


_SSL: dict[str, ssl.SSLContext] = {}


def ssl_context() -> ssl.SSLContext:
    """The public certificate authorities, and those of ``WAYMARK_WEBHOOK_CA_FILE``; made
    once per process (a context costs a few milliseconds)."""
    ca_file = str(setting("CA_FILE") or "")
    context = _SSL.get(ca_file)
    if context is None:
        context = httpx.create_ssl_context(trust_env=False)
        if ca_file:
            context.load_verify_locations(cafile=ca_file)
        _SSL[ca_file] = context
    return context


class Sender:
    """The sweep service: one thread claims due deliveries while its sweeper leads and hands
    them to ``WAYMARK_WEBHOOK_CONCURRENCY`` sending threads; a slot freed, or the lead taken,
    wakes it at once, and it looks again every ``WAYMARK_WEBHOOK_POLL_SECONDS`` anyway."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.slots = int(setting("CONCURRENCY"))
        self.work: queue.Queue[Claimed | None] = queue.Queue()
        self.busy = 0
        self.lock = threading.Lock()
        self.woken = threading.Event()
        self.last_org = 0
        # A database outage: one warning when it goes, one when it is back.
        self.outage = Outage("webhooks: claiming deliveries", logger)

    def start(self, stop: threading.Event) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._claiming, args=(stop,), name="webhook-claims",
                                    daemon=True)]  # fmt: skip
        threads += [
            threading.Thread(target=self._sending, name=f"webhook-send-{n}", daemon=True)
            for n in range(self.slots)
        ]
        for thread in threads:
            thread.start()
        return threads

    def nudge(self) -> None:
        self.woken.set()

    def _claiming(self, stop: threading.Event) -> None:
        poll = float(setting("POLL_SECONDS"))
        try:
            while not stop.is_set():
                if self.sweep.leading.is_set():
                    self._claim_some()
                self.woken.wait(poll)
                self.woken.clear()
        finally:
            for _ in range(self.slots):
                self.work.put(None)  # each sending thread ends after what it holds
            connection.close()

    def _claim_some(self) -> None:
        with self.lock:
            free = self.slots - self.busy
        if free <= 0:
            return
        try:
            taken = claim(free, after=self.last_org)
        except Exception as exc:
            self.outage.failed(exc)  # the next poll is the next try
            connection.close()
            return
        self.outage.ok()
        if taken:
            self.last_org = taken[-1].org_id
        with self.lock:
            self.busy += len(taken)
        for item in taken:
            self.work.put(item)

    def _sending(self) -> None:
        try:
            while (item := self.work.get()) is not None:
                try:
                    deliver(item)
                except Exception:
                    # Its lease lapses and it is sent again: at least once.
                    logger.exception("webhooks: delivery %s failed to send or record", item.id)
                    connection.close()
                finally:
                    with self.lock:
                        self.busy -= 1
                    self.woken.set()
        finally:
            connection.close()
