"""Per-organisation quotas: how much one organisation may hold, so one tenant cannot take the
service from the others. Defaults in settings (WAYMARK_QUOTA_*), an organisation's own
``quota_*`` fields override them, and 0 means no limit. Starts per minute are a rate limit on
the API (api/throttles.py); the counts are checked here, in the services, so the API, the admin
and the commands all meet them.
"""

from __future__ import annotations

import threading
import time

from django.conf import settings
from django.db import connection

from ..engine import sql
from ..errors import QuotaExceeded, RunningRunsQuota
from ..models import Automation, AutomationVersion, Organisation

# A running-runs count is reused this long per organisation and process: counting on every
# start would cost every start up to the quota's worth of index entries. The quota is thus
# enforced within this many seconds, which is what a guard against a runaway tenant needs.
RUNNING_COUNT_SECONDS = 5.0

_running: dict[int, tuple[float, int]] = {}  # org id -> (counted at, running runs)
_running_lock = threading.Lock()


def quota(org: Organisation, name: str) -> int:
    own: int | None = getattr(org, f"quota_{name}")
    if own is not None:
        return own
    return int(settings.WAYMARK[f"QUOTA_{name.upper()}"])


def lock_organisation(org: Organisation) -> None:
    """Counts of an organisation's objects are checked and changed under this lock, so two
    concurrent creations cannot both take the last unit. NO KEY: run starts, which only
    reference the row, are not held up."""
    Organisation.objects.select_for_update(no_key=True).filter(pk=org.pk).get()


def check_automations(org: Organisation) -> None:
    """In the creating transaction, after lock_organisation."""
    limit = quota(org, "automations")
    if limit and Automation.objects.filter(org=org).count() >= limit:
        raise QuotaExceeded(limit=limit, what="automations")


def check_versions(org: Organisation) -> None:
    """In the creating transaction, after lock_organisation."""
    limit = quota(org, "versions")
    if limit and AutomationVersion.objects.filter(org=org).count() >= limit:
        raise QuotaExceeded(limit=limit, what="versions")


def check_running_runs(org: Organisation) -> None:
    limit = quota(org, "running_runs")
    if limit and _running_runs(org, limit) >= limit:
        raise RunningRunsQuota(limit=limit, what="running runs")


def _running_runs(org: Organisation, limit: int) -> int:
    now = time.monotonic()
    with _running_lock:
        counted = _running.get(org.pk)
    if counted is not None and now - counted[0] < RUNNING_COUNT_SECONDS:
        return counted[1]
    with connection.cursor() as cursor:
        cursor.execute(sql.RUNNING_RUNS_UP_TO, {"org": org.pk, "limit": limit})
        (count,) = cursor.fetchone()
    with _running_lock:
        _running[org.pk] = (now, int(count))
    return int(count)


def forget_running_counts() -> None:
    """Count again at the next start (tests, and after an operator changes a quota)."""
    with _running_lock:
        _running.clear()
