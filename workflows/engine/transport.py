"""The wake-up transport: PostgreSQL LISTEN/NOTIFY behind a small interface.

The queue only *wakes* workers; it is never the record of work (the step rows are). A lost
notification delays work by at most one poll interval; a duplicate one costs one empty claim.
Notifications are sent by the relay, outside the engine's hot write transactions: a NOTIFY
inside a transaction serialises every commit behind a global lock. The one exception is cheap
by construction: a transaction that makes work for a lane with an *idle* worker notifies it
directly (``rows.wakes_statement``), so an idle engine does not wait for the relay's next
batch; a busy lane has no idle worker listed, and its writers notify nobody.

Another transport (Redis, say) implements ``publish`` and ``subscribe`` the same way.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from django.db import connection

from .lanes import engine_setting
from .sql.rows import LANE_CHANNEL_PREFIX
from .transient import Outage

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Message:
    id: int  # the outbox id: the message id, so consumers can recognise duplicates
    topic: str
    payload: dict[str, Any]


class Transport(Protocol):
    def publish(self, messages: Iterable[Message]) -> None: ...

    def subscribe(self, lane: str, wake: threading.Event, stop: threading.Event) -> None: ...


def channel_for(lane: str) -> str:
    return f"{LANE_CHANNEL_PREFIX}{lane}"


def own_connection(*, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection[Any]:
    """A psycopg connection outside Django's per-thread handling, with the same settings
    (``kwargs``: psycopg's, e.g. ``row_factory``)."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("server_side_binding", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    return psycopg.connect(**params, autocommit=autocommit, **kwargs)


class PostgresNotifyTransport:
    def __init__(self) -> None:
        self._conn: psycopg.Connection | None = None

    def publish(self, messages: Iterable[Message]) -> None:
        """One NOTIFY per lane (carrying the newest message id): workers need a wake, not a
        copy of each message. Sent on an autocommit connection, so it is out before the
        relay marks the rows sent; a crash in between re-sends them later, harmlessly."""
        newest: dict[str, int] = {}
        for message in messages:
            lane = message.payload.get("lane")
            if lane:
                newest[lane] = max(newest.get(lane, 0), message.id)
        if not newest:
            return
        if self._conn is None or self._conn.closed:
            self._conn = own_connection()
        try:
            with self._conn.cursor() as cursor:
                for lane, message_id in newest.items():
                    cursor.execute("SELECT pg_notify(%s, %s)", [channel_for(lane), str(message_id)])
        except psycopg.OperationalError:
            self._conn = None
            raise

    def subscribe(self, lane: str, wake: threading.Event, stop: threading.Event) -> None:
        """Set ``wake`` on each notification for ``lane`` until ``stop``; reconnect on errors.

        LISTEN is a hint and polling is the truth: after a reconnect the worker may have
        missed notifications, so it is woken once to look.
        """
        listen(channel_for(lane), wake, stop)


def listen(channel: str, wake: threading.Event, stop: threading.Event) -> None:
    """Set ``wake`` on each notification on ``channel`` until ``stop``; reconnect and LISTEN
    again on errors (and set ``wake`` once after each (re)connect: notifications may have
    been missed). A server restart, a terminated backend: the next read fails, and the
    listener is back as soon as the server is, with one warning for the outage."""
    check = float(engine_setting("LISTEN_CHECK_SECONDS"))
    outage = Outage(f"listener for {channel}", logger, first=0.5)
    while not stop.is_set():
        try:
            with own_connection() as conn:
                _answers_within(conn, f"LISTEN {channel}", check)
                outage.ok()
                wake.set()
                _hear(conn, wake, stop, check)
        except Exception as exc:
            stop.wait(outage.failed(exc))


def _hear(conn: psycopg.Connection[Any], wake: threading.Event, stop: threading.Event,
          check: float) -> None:  # fmt: skip
    """Turn notifications into wakes until ``stop``. A listener only reads, so a connection
    that died without a word (half-open: the server's host gone, a middlebox dropping the
    flow) would leave it deaf for good: after ``check`` seconds without a notification it
    asks the server for an answer, and raises if none comes within ``check`` seconds."""
    heard = time.monotonic()
    while not stop.is_set():
        for _ in conn.notifies(timeout=0.5, stop_after=1):
            wake.set()
            heard = time.monotonic()
        if check and time.monotonic() - heard >= check:
            _answers_within(conn, "SELECT 1", check)
            wake.set()  # what arrived during the check is not yielded by notifies(): look
            heard = time.monotonic()


def _answers_within(conn: psycopg.Connection[Any], statement: str, seconds: float) -> None:
    """Run ``statement``; an OperationalError after ``seconds`` (0: no limit) without an
    answer: the socket is shut down under the waiting statement (a server-side timeout cannot
    help: the server may never see it), which makes it fail as a lost connection does."""
    if not seconds:
        conn.execute(statement)
        return
    cut = threading.Timer(seconds, _shut_down, args=(conn.fileno(),))
    cut.daemon = True
    cut.start()
    try:
        conn.execute(statement)
    finally:
        cut.cancel()


def _shut_down(fd: int) -> None:
    """Shut the connection's socket down (on a duplicate of its descriptor: the connection
    still owns and closes the original), so a read blocked on it returns at once."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def default_transport() -> Transport:
    return PostgresNotifyTransport()
