"""How a delivery is signed, and how a receiver checks it (docs/how-to/receive-webhooks.md shows the
same in a few lines of any language).

The signature is HMAC-SHA256, keyed with the subscription's secret, over
``<timestamp>.<body>``: the Unix time of the attempt in seconds, a dot, and the request's
body exactly as sent (bytes). It goes in one header::

    Waymark-Signature: t=1767225600,v1=5257a869e7ec…(64 hex digits)

A receiver recomputes it with its copy of the secret, compares in constant time, and refuses
a timestamp too far from its own clock (a replayed request). Each attempt is signed afresh
(its own timestamp); the body, and ``Waymark-Delivery-Id``, are the same on every attempt.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Waymark-Signature"
TOLERANCE_SECONDS = 300


def signature(secret: str, timestamp: int, body: bytes) -> str:
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signature_header(secret: str, body: bytes, *, timestamp: int | None = None) -> str:
    """The header's value for ``body``, signed now (or at ``timestamp``)."""
    at = int(time.time()) if timestamp is None else timestamp
    return f"t={at},v1={signature(secret, at, body)}"


def verify(
    secret: str,
    header: str,
    body: bytes,
    *,
    tolerance: float = TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:
    """What a receiver does: True when ``header`` signs ``body`` with ``secret`` and its
    timestamp is within ``tolerance`` seconds of ``now``. Several ``v1`` values (a secret
    being rotated) pass when any one does."""
    parts = [part.partition("=") for part in header.split(",")]
    stamps = [value for key, _, value in parts if key.strip() == "t"]
    candidates = [value.strip() for key, _, value in parts if key.strip() == "v1"]
    # ASCII digits only: isdigit() also takes "²", which int() refuses (a raise, not False).
    stamp = stamps[0].strip() if len(stamps) == 1 else ""
    if not (stamp.isascii() and stamp.isdigit()) or not candidates:
        return False
    timestamp = int(stamp)
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    expected = signature(secret, timestamp, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)
