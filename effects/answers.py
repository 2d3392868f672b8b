"""What every outside answer goes through: its body read streamed and capped, and its
Retry-After read one way.

An endpoint, a provider or a connection's check answers with whatever it likes: a body of
300 MiB read whole would hold the sweeper or a worker (and everything it runs for every
organisation) for its size in memory. So a body is read a chunk at a time up to
``WAYMARK_OUTSIDE_ANSWER_MAX_BYTES`` (or less: a caller that keeps an excerpt asks for what
it keeps); past that the response is closed, unread: its connection goes, nothing more is
received. ``was_cut`` tells a caller that the body it holds is only the start of one.

A compressed body is decompressed here, within the same cap, so a small gzip bomb cannot
grow past it either (httpx would decompress a whole chunk at once).

A body is JSON only if PostgreSQL can keep it as JSON (``answer_json``): Python's json reads
``NaN`` and ``Infinity`` (no JSON has them), ``1e400`` as infinity, and ``\\u0000`` or a
lone ``\\ud800`` (no jsonb column takes them), and a document nested a hundred thousand deep
or a number of more than 4,300 digits raises out of the parser. Stored as they are, the
first failed every settle of their step, forever; the last put an answered call in front of
a person. Such a body is kept as its text instead (``answer_text``), as any other body that
is not JSON.

Retry-After comes in two forms (RFC 9110: ``delay-seconds`` or an HTTP date) and in many
broken ones (``²``, ``-5``, ``1e400``, a date in the year 99999): ``retry_after_seconds``
reads the two, bounds them, and answers None for everything else, never raising.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
import zlib
from collections.abc import Callable
from datetime import UTC
from typing import Any

import httpx
from django.conf import settings
from django.db import DatabaseError

from workflows.plugins.definitions import UNSTORABLE_REASON, storable_text, unstorable_path
from workflows.plugins.engine import database_now

CUT = "waymark.cut"  # the response extension saying the body was cut at the cap
ANSWER_TOO_LARGE = "answer_too_large"  # the stable code of an answer over the cap
RETRY_AFTER_MAX_SECONDS = 86_400.0  # a Retry-After asking for longer is read as a day
_DELAY_SECONDS = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,9})?", re.ASCII)
# Headers of the body as it came, untrue of the body kept (decompressed, maybe cut).
_BODY_HEADERS = frozenset({b"content-encoding", b"content-length", b"transfer-encoding"})


def answer_max_bytes() -> int:
    """The most of one answer's body read into memory (``WAYMARK_OUTSIDE_ANSWER_MAX_BYTES``)."""
    return int(settings.EFFECTS["OUTSIDE_ANSWER_MAX_BYTES"])


def answer_json(response: httpx.Response) -> Any:
    """The answer's body as JSON that a jsonb column keeps as it is. ValueError when it is
    not: not JSON (undecodable, NaN or Infinity among its numbers), nested deeper than it
    can be read, or holding a string PostgreSQL refuses (a NUL character, a lone surrogate)."""
    try:
        body = response.json(parse_constant=_not_json, parse_float=_finite)
    except RecursionError:
        raise ValueError("the answer's JSON nests deeper than it can be read") from None
    where = unstorable_path(body)
    if where is not None:
        raise ValueError(f"the answer's JSON at {where} {UNSTORABLE_REASON}")
    return body


def answer_text(response: httpx.Response, limit: int) -> str:
    """The answer's body as text, cut at ``limit`` characters, each character PostgreSQL
    cannot store (NUL) written as its escape."""
    return storable_text(response.text[:limit])


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def _finite(number: str) -> float:
    """A number Python reads as a finite float: ``1e400`` is read as infinity, which no
    JSON a jsonb column keeps holds."""
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"{number[:40]} is past the numbers read here")
    return value


def read_capped(response: httpx.Response, limit: int | None = None) -> httpx.Response:
    """``response`` (sent with ``stream=True``) read up to ``limit`` bytes of its body
    (decompressed), then closed: the answer as a read response, whose ``extensions[CUT]``
    is True when the body went on past the limit (the rest was never received)."""
    limit = answer_max_bytes() if limit is None else limit
    decode = _decoder(response.headers.get("content-encoding", ""))
    kept = bytearray()
    cut = False
    try:
        for chunk in response.iter_raw():
            kept += decode(chunk, limit + 1 - len(kept))
            if len(kept) > limit:
                cut = True
                break
    except zlib.error as exc:
        raise httpx.DecodingError(f"the answer's body cannot be decompressed: {exc}") from exc
    finally:
        response.close()  # unread: its connection is closed, not drained
    # As they came (bytes: a value need not be ASCII), less those of the body as it came.
    headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _BODY_HEADERS]
    return httpx.Response(
        response.status_code,
        headers=headers,
        content=bytes(kept[:limit]),
        request=response.request,
        extensions={**response.extensions, CUT: cut},
    )


def was_cut(response: httpx.Response) -> bool:
    """Whether ``response``'s body is only the start of the answer's (``read_capped``)."""
    return bool(response.extensions.get(CUT))


def too_large(what: str = "the answer") -> str:
    """The message of an answer over the cap, code first."""
    return (
        f"{ANSWER_TOO_LARGE}: {what} had a body over {answer_max_bytes():,} bytes "
        "(WAYMARK_OUTSIDE_ANSWER_MAX_BYTES); it was not read past that"
    )


def _decoder(encoding: str) -> Callable[[bytes, int], bytes]:
    """A function giving at most ``room`` bytes of a chunk's decompressed content. gzip and
    deflate (zlib's, or raw) are decompressed, the codings the egress client offers; any
    other (which no request offered) is kept as it came."""
    coding = encoding.strip().lower()
    if coding not in ("gzip", "deflate", "x-gzip"):
        return lambda chunk, room: chunk[: max(room, 0)]
    return _Inflate(raw_allowed=coding == "deflate").decode


class _Inflate:
    """gzip or zlib's deflate (its header detected), or a raw deflate stream (some servers
    send "deflate" with no header), decompressed at most ``room`` bytes at a time."""

    def __init__(self, *, raw_allowed: bool) -> None:
        self._z = zlib.decompressobj(32 + zlib.MAX_WBITS)
        self._raw_allowed = raw_allowed
        self._started = False

    def decode(self, chunk: bytes, room: int) -> bytes:
        try:
            out = self._z.decompress(chunk, max(room, 1))
        except zlib.error:
            if not self._raw_allowed or self._started:
                raise
            self._z = zlib.decompressobj(-zlib.MAX_WBITS)
            out = self._z.decompress(chunk, max(room, 1))
        self._started = True
        return out


def retry_after_seconds(
    value: str | None, date: str | None = None, *, now: Callable[[], float] | None = None
) -> float | None:
    """Retry-After as seconds from now, from 0 to ``RETRY_AFTER_MAX_SECONDS``: a number of
    seconds, or an HTTP date; None when absent or neither (never an exception). A date is
    counted from the answer's own ``Date`` (both on the sender's clock) when it has one,
    else from ``now()`` (a Unix time; the database's clock by default: never this
    process's, which may be minutes off)."""
    if not value:
        return None
    text = value.strip()
    if _DELAY_SECONDS.fullmatch(text):
        return min(float(text), RETRY_AFTER_MAX_SECONDS)
    when = _http_date(text)
    if when is None:
        return None
    sent = _http_date(date)
    start = sent if sent is not None else (now or _database_clock)()
    return min(max(0.0, when - start), RETRY_AFTER_MAX_SECONDS)


def _database_clock() -> float:
    """Now on the database's clock; this process's when the database cannot say (a
    Retry-After is read while the database is away too, and must not raise then)."""
    try:
        return database_now().timestamp()
    except DatabaseError:
        return time.time()


def _http_date(value: str | None) -> float | None:
    """An HTTP date as a Unix time; None when it is not one."""
    if not value or len(value) > 100:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def retry_after_of(
    response: httpx.Response, now: Callable[[], float] | None = None
) -> float | None:
    """A response's Retry-After in seconds (``retry_after_seconds``), or None."""
    return retry_after_seconds(response.headers.get("retry-after"),
                               response.headers.get("date"), now=now)  # fmt: skip
