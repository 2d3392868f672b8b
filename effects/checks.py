"""Connection checks: are this connection's credentials still good? Asked for from the web
tier (``POST /api/v1/connections/{name}/check``, the admin's "Check the connection now"), so
a check must never hold a web thread for the connection's own timeout, which its tenant
sets (a host that accepts and never answers would hold it that long):

- the probe runs on a thread of its own; the request waits for it at most
  ``WAYMARK_CONNECTION_CHECK_SECONDS`` and then answers ``failed: no answer within …``. The
  probe's own timeouts are cut to twice that bound, so it ends soon after.
- one check per connection at a time (409 ``check_in_progress``) and at most
  ``WAYMARK_CONNECTION_CHECKS_PER_ORG`` per organisation (429 ``checks_busy``), so one tenant
  cannot occupy every web thread. A lease on the connection's row says so: taken in a short
  transaction, never held across the probe, released when the probe ends. A holder that died
  leaves a lease that lapses by itself.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
from collections.abc import Callable
from dataclasses import replace

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from workflows.errors import Conflict, NotFound, WaymarkError
from workflows.plugins import StepFailure
from workflows.plugins.audit import Actor

from . import sql
from .models import Connection
from .providers.base import AuthFailed, CallError, ConnectionInfo, Provider
from .resolve import repair_connection
from .states import ConnectionStatus

log = logging.getLogger(__name__)

# The probe's own timeouts are cut to this many check bounds: past the bound the request
# answers "no answer within …" (one wording, however the host is silent), and the probe
# gives up soon after on its own.
PROBE_TIMEOUT_FACTOR = 2
# A lease lasts this many check bounds: a probe is a few steps (connect, send, read the
# answer), each cut as above, and the lease must outlive the probe it guards. The probe
# releases it as it ends; the lapse only frees a connection whose checking process died.
LEASE_FACTOR = 5
# Probe threads one process may run at once. A probe outlives its request only when a
# server trickles bytes slower than the bound but never finishes; this caps how many such
# probes can pile up (past it, checks are refused with ``checks_busy``).
MAX_PROBE_THREADS = 32
_probe_slots = threading.BoundedSemaphore(MAX_PROBE_THREADS)


class CheckInProgress(Conflict):
    code = "check_in_progress"
    default_detail = (
        'Connection "{name}" is being checked already; ask again once that check has answered.'
    )


class ConnectionGone(NotFound):
    code = "unknown_connection"  # deleted while the check was asked for
    default_detail = 'No connection "{name}" in this organisation.'


class ChecksBusy(WaymarkError):
    """The organisation's checks in flight are at their cap (or this server's are)."""

    code = "checks_busy"
    status = 429

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.retry_after_seconds = math.ceil(check_seconds())


def check_seconds() -> float:
    return float(settings.EFFECTS["CONNECTION_CHECK_SECONDS"])


def check_connection(conn: Connection, *, by: Actor | str, seconds: float | None = None) -> str:
    """Probe the connection's credentials at its provider now: "ok" (repaired if it was
    broken), "broken" (marked so, with the reason), or "failed: …" (the check could not tell;
    the connection is left as it was). Waits at most ``seconds`` (at most the operator's
    bound); raises CheckInProgress or ChecksBusy when it may not start."""
    from .perform import PROVIDERS, load_connection

    limit = check_seconds() if seconds is None else min(seconds, check_seconds())
    provider = PROVIDERS.get(conn.provider)
    if provider is None:
        return f"failed: unknown provider {conn.provider!r}"
    token = _begin(conn)
    probe: _Probe | None = None
    try:
        try:
            info = load_connection(conn.org_id, conn.name, provider)
        except StepFailure as exc:  # the secret cannot be decrypted with the configured keys
            return f"failed: {exc}"
        assert info is not None
        cut = min(info.timeout_seconds, check_seconds() * PROBE_TIMEOUT_FACTOR)
        info = replace(info, timeout_seconds=cut)
        probe = _Probe.start(provider, info, release=lambda: _end(conn.pk, token))
        if not probe.wait(limit):
            Connection.objects.filter(pk=conn.pk).update(checked_at=timezone.now())
            return (
                f"failed: no answer within {limit:.3g} s (a check waits at most "
                "WAYMARK_CONNECTION_CHECK_SECONDS, whatever the connection's timeout)"
            )
        return _record(conn, probe.error, by=by)
    finally:
        if probe is None or not probe.abandoned:  # an abandoned probe releases it as it ends
            _end(conn.pk, token)


def _begin(conn: Connection) -> str:
    """Take the connection's check lease; its token."""
    token = secrets.token_hex(16)
    per_org = int(settings.EFFECTS["CONNECTION_CHECKS_PER_ORG"])
    params: dict[str, int | float | str] = {
        "org_id": conn.org_id, "connection_id": conn.pk, "token": token,
        "lease": check_seconds() * LEASE_FACTOR, "per_org": per_org,
    }  # fmt: skip
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.CHECK_ORG_LOCK, params)
        cursor.execute(sql.CHECK_BEGIN, params)
        if cursor.fetchone() is not None:
            return token
        cursor.execute(sql.CHECK_HELD, params)
        held = cursor.fetchone()
    if held is None:
        raise ConnectionGone(name=conn.name)
    if held[0]:
        raise CheckInProgress(name=conn.name)
    raise ChecksBusy(
        f"This organisation already has {per_org} connection checks in flight; "
        "try again once one has answered."
    )


def _end(connection_id: int, token: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql.CHECK_END, {"connection_id": connection_id, "token": token})


def _record(conn: Connection, error: Exception | None, *, by: Actor | str) -> str:
    """What the probe's outcome says about the connection, written down."""
    now = timezone.now()
    row = Connection.objects.filter(pk=conn.pk)
    if isinstance(error, AuthFailed):
        row.update(status=ConnectionStatus.BROKEN, broken_reason=f"reconnect {conn.name}: "
                   f"{error}"[:500], broken_at=now, checked_at=now)  # fmt: skip
        return "broken"
    if isinstance(error, CallError):
        row.update(checked_at=now)
        return f"failed: {error}"
    if error is not None:
        raise error  # a defect in the provider: the request fails as it would have inline
    row.update(checked_at=now)
    if conn.status == ConnectionStatus.BROKEN:
        repair_connection(conn, by=by)
    return "ok"


class _Probe:
    """One provider probe on a thread of its own, which a request waits for a bounded time.

    When the request stops waiting, the probe is *abandoned*: it keeps the connection's
    check lease until it ends (so the connection and its organisation's slot stay taken)
    and then releases it itself."""

    def __init__(self, release: Callable[[], None]) -> None:
        self.error: Exception | None = None
        self.abandoned = False
        self._release = release
        self._done = threading.Event()
        self._lock = threading.Lock()

    @classmethod
    def start(
        cls, provider: Provider, info: ConnectionInfo, *, release: Callable[[], None]
    ) -> _Probe:
        if not _probe_slots.acquire(blocking=False):
            raise ChecksBusy("This server is still finishing earlier connection checks; "
                             "try again shortly.")  # fmt: skip
        probe = cls(release)
        thread = threading.Thread(
            target=probe._run, args=(provider, info), name="connection-check", daemon=True
        )
        try:
            thread.start()
        except BaseException:
            _probe_slots.release()
            raise
        return probe

    def wait(self, seconds: float) -> bool:
        """Whether the probe ended within ``seconds``; if not, it is abandoned."""
        if self._done.wait(seconds):
            return True
        with self._lock:
            self.abandoned = not self._done.is_set()
            return not self.abandoned

    def _run(self, provider: Provider, info: ConnectionInfo) -> None:
        try:
            provider.probe(info)
        except Exception as exc:
            self.error = exc
        finally:
            _probe_slots.release()
            with self._lock:
                self._done.set()
                abandoned = self.abandoned
            if abandoned:
                self._release_late()

    def _release_late(self) -> None:
        try:
            self._release()
        except Exception:
            log.exception("a connection check could not release its lease; it lapses by itself")
        finally:
            connection.close()  # this thread's own database connection, opened for this
