"""What a provider is, and the ways a call to one can end.

A provider turns a step's rendered request into one outside call, keyed by the effect key.
It declares what makes a repeat safe:

- ``idempotency_keys``: the provider honours the key (an ``Idempotency-Key`` header, an
  upsert by external id), so a repeat with the same key returns the first result; for
  ``key_retention_seconds`` (None: for ever);
- ``can_lookup``: it can be asked whether the effect under a key was made (``lookup``);
- ``repeatable``: the call makes nothing outside (a model completion): an unknown outcome is
  simply asked again, at the cost of the budget it reserved.

A call ends with an ``Answer`` (the effect is made), or raises one of the ``CallError``
kinds below, each saying whether anything may have been made. Whatever else escapes a call
is taken as "it may have left" (the ledger cannot tell), so a provider builds what goes on
the wire inside ``before_sending()``: a request that cannot be built (a header value that is
not ASCII, a URL that is not one, a header with a line break) is then ``Invalid``, a
permanent failure with nothing made, never an unknown outcome for a person to review.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar
from urllib.parse import urlsplit

from ..egress import Allowlist


@dataclass(frozen=True)
class ConnectionInfo:
    """A connection as a call sees it: the secret decrypted, for this call only."""

    id: int | None
    name: str
    provider: str
    base_url: str
    options: Mapping[str, Any]
    secret: str = field(repr=False)  # never in a repr, a log line or an error
    timeout_seconds: float = 30.0
    secret_version: int = 1
    allow: Allowlist = field(default_factory=Allowlist)


@dataclass(frozen=True)
class Request:
    """A rendered request. ``summary`` is what the ledger stores (no secrets); ``recipient``
    is the person it contacts, for the consent check (None: it contacts nobody)."""

    payload: Mapping[str, Any]
    summary: Mapping[str, Any]
    recipient: str | None = None
    reserve: Decimal = Decimal(0)  # a model call's allowed cost, reserved before it


@dataclass(frozen=True)
class Answer:
    result: Any  # what the step outputs, kept in the ledger for every retry
    response: Mapping[str, Any] | None = None  # what the provider said (for people)
    cost: Decimal | None = None


class CallError(Exception):
    """A call that did not produce an answer. ``made`` is "no" (the provider refused or was
    never reached: calling again is safe) or "unknown" (it may have acted)."""

    made: ClassVar[str] = "unknown"
    error_class: ClassVar[str] = "unknown"
    retryable: ClassVar[bool] = True
    counts_against_circuit: ClassVar[bool] = False

    def __init__(self, message: str, response: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.response = dict(response) if response else None


class Ambiguous(CallError):
    """Timed out after sending, the connection dropped, a 5xx, an answer that cannot be
    read: the provider may have acted."""

    error_class = "unavailable"
    counts_against_circuit = True


class Unreachable(CallError):
    """The request never left (no connection could be opened): nothing was made."""

    made = "no"
    error_class = "unavailable"
    counts_against_circuit = True


class Refused(CallError):
    """The provider said no (a 4xx): nothing was made, and asking again will not help."""

    made = "no"
    error_class = "bad_request"
    retryable = False


class Invalid(Refused):
    """The request cannot be sent as it stands, found on our side before a byte left: nothing
    was made, and sending it again would fail the same way. The message starts with the
    stable code ``invalid_request``."""

    error_class = "invalid_request"

    def __init__(self, message: str, response: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{INVALID_REQUEST}: {message}", response)


INVALID_REQUEST = "invalid_request"


@contextmanager
def before_sending(what: str) -> Iterator[None]:
    """Around the code that turns a request into what goes on the wire, before anything is
    sent: whatever it raises means nothing left, so it is ``Invalid`` (a CallError it raises
    is kept as it is). ``what`` names the request in the message."""
    try:
        yield
    except CallError:
        raise
    except Exception as exc:
        raise Invalid(f"{what} cannot be sent ({type(exc).__name__}: {str(exc)[:300]})") from exc


class RateLimited(CallError):
    """429: nothing was made; ask again after ``retry_after`` seconds (Retry-After)."""

    made = "no"
    error_class = "rate_limited"

    def __init__(
        self, message: str, retry_after: float | None, response: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message, response)
        self.retry_after = retry_after


class KeyInUse(CallError):
    """409 for the key: the provider is still working on a request with it. Ask again
    later with the same key (the outcome is unknown until then)."""

    error_class = "key_in_use"


class AuthFailed(CallError):
    """401/403, a revoked token: nothing was made, and no retry will change that until a
    person repairs the connection."""

    made = "no"
    error_class = "auth"
    retryable = False


class Provider:
    name: ClassVar[str]
    idempotency_keys: ClassVar[bool] = False
    key_retention_seconds: ClassVar[float | None] = None
    can_lookup: ClassVar[bool] = False
    repeatable: ClassVar[bool] = False
    budgeted: ClassVar[bool] = False  # its calls spend the organisation's model budget
    needs_connection: ClassVar[bool] = True

    def prepare(
        self, step: Mapping[str, Any], context: Mapping[str, Any], conn: ConnectionInfo | None
    ) -> Request:
        raise NotImplementedError

    def call(self, request: Request, key: str, conn: ConnectionInfo | None) -> Answer:
        raise NotImplementedError

    def lookup(self, request: Request, key: str, conn: ConnectionInfo | None) -> Answer | None:
        """The effect made under ``key``, or None when the provider has none."""
        raise NotImplementedError

    def probe(self, conn: ConnectionInfo) -> None:
        """Check the connection's credentials without acting (raise AuthFailed or another
        CallError); the health check of a connection."""
        raise NotImplementedError

    # What a change of secret_destination moves, in words, for the error that asks for the
    # secret again (destinations.where_it_goes): a provider that places its secret by other
    # settings than base_url says which here, beside its secret_destination.
    destination_in_words = "another origin (base_url's scheme, host and port)"

    def secret_destination(self, base_url: str, options: Mapping[str, Any]) -> Hashable:
        """Where a connection with these settings sends its secret: the origin of
        ``base_url`` (every URL a call builds from it, and any other URL only without the
        secret: http.auth_headers). A change of settings that moves it needs the secret
        given again (effects/destinations.py): a person allowed to change a
        connection's settings but never given its secret cannot have it sent to their own
        host."""
        return url_origin(base_url)

    def supports_key(self, conn: ConnectionInfo | None) -> bool:
        """Whether a repeat with the same key is safe on this connection."""
        return self.idempotency_keys

    def supports_lookup(self, conn: ConnectionInfo | None) -> bool:
        return self.can_lookup

    def retention(self, conn: ConnectionInfo | None) -> float | None:
        return self.key_retention_seconds

    def settle_seconds(self, conn: ConnectionInfo | None) -> float:
        """How long after a request the provider may still be making its effect: a lookup
        that finds nothing sooner than that proves nothing (the ledger waits and looks
        again). Option ``lookup_settle_seconds`` of the connection; 60 s by default."""
        value = (conn.options if conn else {}).get("lookup_settle_seconds", 60)
        return float(value)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def url_origin(url: str) -> tuple[str, str, int | None]:
    """A URL's scheme, host and port, as a browser compares origins (the scheme's default
    port written or not, host names in any case). A URL that is not one is its own text."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return ("", url, None)
    scheme = parts.scheme.lower()
    return (scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme))
