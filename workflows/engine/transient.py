"""Transient database errors: retried, never recorded as anything's result.

A deadlock, a serialization failure, a lock or statement timeout, a lost connection: none of
them says anything about the work (the timer, the step, the decision) that met it. The same
work, tried again in a new transaction, succeeds. So every path that does work on behalf of
something else (a timer fired, a deadline, a late signal, a settle) rolls its transaction
back and tries again; it never writes such an error as the work's outcome (a timer marked
fired with "deadlock detected" leaves its step waiting forever).

Django wraps the driver's error (``django.db.OperationalError`` and friends) with the
psycopg error as its ``__cause__``; both are looked at.

Any other error met while the database does not answer (a library's own error as a server
goes away under it, a half-read answer) is the outage's too: ``away(exc)`` asks the database
before a caller takes such an error for the work's own (a settle would fail its run with it).
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from django.db import InterfaceError as DjangoInterfaceError
from django.db import connection

# serialization_failure, deadlock_detected, lock_not_available (lock_timeout, NOWAIT),
# query_canceled (statement_timeout, a cancel request).
RETRY_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57014"})
# The connection is gone: class 08 (connection exception), and the server shutting down or
# restarting under it (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now),
# or no connection to be had (53300 too_many_connections).
LOST_CONNECTION_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` is (or was caused by) a database error that trying again in a new
    transaction can cure."""
    return any(_transient(each) for each in _chain(exc))


def lost_connection(exc: BaseException) -> bool:
    """True when ``exc`` means the connection itself is gone: close it before trying again."""
    return any(_lost(each) for each in _chain(exc))


class DatabaseAway(psycopg.OperationalError):
    """An error that is not a database error, met while the database did not answer: the
    outage's, not the work's. A lost connection to every classifier here."""

    def __init__(self, met: BaseException) -> None:
        super().__init__(f"the database does not answer (met {type(met).__name__}: {met})")


def away(exc: BaseException) -> BaseException | None:
    """``exc`` as the transient error it is (a ``DatabaseAway`` for an error of another kind
    met while the database does not answer), or None when the database answers and ``exc``
    is not transient: then it is the work's own error (a bug, a broken row). Asks the
    database only for an error that is not transient (the rare path)."""
    if is_transient(exc):
        return exc
    if database_answers():
        return None
    wrapped = DatabaseAway(exc)
    wrapped.__cause__ = exc
    return wrapped


def database_answers() -> bool:
    """Whether the database answers a new connection now (Django's settings: the embedded
    server's backend raises a lost connection while it starts, stops or is stopped)."""
    try:
        probe = connection.get_new_connection(connection.get_connection_params())
    except Exception:
        return False
    try:
        probe.execute("SELECT 1")
        return True
    except Exception:
        return False
    finally:
        probe.close()


def _transient(exc: BaseException) -> bool:
    if _lost(exc):
        return True
    return isinstance(exc, psycopg.Error) and exc.sqlstate in RETRY_SQLSTATES


def _lost(exc: BaseException) -> bool:
    if isinstance(exc, DjangoInterfaceError | psycopg.InterfaceError):
        return True  # "connection already closed": the driver's connection is gone
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    # No SQLSTATE at all: the server never answered (the socket closed under the query).
    return state is None or state.startswith("08") or state in LOST_CONNECTION_SQLSTATES


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from (``raise ... from``: Django's wrapper of the
    driver's error, a caller's own wrapper), once each. Not what it was merely raised while
    handling: an error of its own that met a deadlock on the way is still its own."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not each for each in seen):
        seen.append(current)
        current = current.__cause__
    return seen


class Outage:
    """A long-running loop's view of the database being away (a restart, a failover, a
    terminated backend, no free connection): one warning when it goes, one when it is back,
    and a growing pause between tries, instead of a traceback per try.

    ``failed(exc)`` is called with each error and returns how long to wait before the next
    try; ``ok()`` after each success. An error that is not transient (a bug) is logged with
    its traceback every time, unless the database does not answer (``away``): hiding it
    would hide the bug. Safe to share between threads
    (a worker's settling threads share one, so an outage is one warning, not one a slot).
    """

    def __init__(self, what: str, log: logging.Logger, *, first: float = 0.2,
                 most: float = 5.0) -> None:  # fmt: skip
        self.what, self.log, self.first, self.most = what, log, first, most
        self.since: float | None = None  # when the current outage began (monotonic)
        self.tries = 0
        self._lock = threading.Lock()

    def failed(self, exc: BaseException) -> float:
        transient = away(exc)
        if transient is None:
            self.log.error("%s failed; trying again", self.what, exc_info=exc)
            return self.most
        exc = transient
        with self._lock:
            self.tries += 1
            if self.since is None:
                self.since = time.monotonic()
                what = (
                    "the database is unavailable" if lost_connection(exc) else "a transient error"
                )
                self.log.warning("%s: %s (%s); trying again until it passes", self.what, what,
                                 first_line(exc))  # fmt: skip
            return float(min(self.most, self.first * 2 ** min(self.tries - 1, 16)))

    def ok(self) -> None:
        if self.since is None:  # the common case: no lock taken
            return
        with self._lock:
            since, self.since, tries, self.tries = self.since, None, self.tries, 0
        if since is not None:
            self.log.warning("%s: the database answers again after %.1f s (%s tries)", self.what,
                             time.monotonic() - since, tries)  # fmt: skip


def log_failure(log: logging.Logger, exc: BaseException, message: str, *args: object) -> None:
    """One item of a loop failed (a deadline, a late signal, an approval's wake): a transient
    database error is a warning in one line (the item is tried again at its next turn, and
    a terminated backend or a restart would otherwise write a traceback per item); any other
    error is logged with its traceback, as the bug it is."""
    transient = away(exc)
    if transient is not None:
        log.warning(message + " (%s); tried again later", *args, first_line(transient))
    else:
        log.error(message, *args, exc_info=exc)


def first_line(exc: BaseException) -> str:
    """The driver's error (LockNotAvailable, AdminShutdown, ...) in one line."""
    exc = next((each for each in _chain(exc) if isinstance(each, psycopg.Error)), exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
