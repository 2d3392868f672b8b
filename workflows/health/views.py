"""``GET /readyz``: the absence monitors' verdict, for probes and monitoring.

200 when every invariant holds (``"status": "ok"``; measures may warn) or when none is known
broken but a check could not run in time (``"unchecked"``); 503 when an invariant is broken
(``"broken"``: the ``broken`` list names the checks), or the database is unreachable
(``"unavailable"``). It answers for the whole installation, so it says counts, measures and
check names only: a finding's examples (run ids, organisations, worker names) are shown to a
signed-in staff user alone, and only those of the organisations the admin shows them
(``admin.scoping.member_org_ids``: a superuser sees every example; other staff the examples
of their organisations, not the installation's own, such as the sweep leader's name).

Probes come every few seconds, from every load balancer, to every web process, and the
checks read the database: a verdict is kept in the shared cache (the database's, or Redis)
for ``WAYMARK_READYZ_CACHE_SECONDS``, so the installation computes about one per period,
whichever process is asked first (one request at a time per process; the others wait for it,
then read it); and each check's statements are bounded by ``WAYMARK_READYZ_TIMEOUT_SECONDS``
(past it the check is ``unchecked``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.core.cache import cache
from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache

from ..admin.scoping import member_org_ids
from ..engine.health import Limits, run_checks
from ..engine.lanes import engine_setting

logger = logging.getLogger(__name__)

CACHE_KEY = "waymark:readyz"
_computing = threading.Lock()


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    try:
        verdict = _verdict()
    except DatabaseError as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        logger.warning("readyz: database unreachable: %s", first_line)
        return JsonResponse({"status": "unavailable", "database": "unreachable"}, status=503)
    verdict = {**verdict, "findings": _shown_to(request, verdict["findings"])}
    response = JsonResponse(verdict, status=503 if verdict["broken"] else 200)
    # A broken invariant may last hours and probes come every few seconds: the verdict is
    # logged once when it is made (_checked), not as an ERROR line per probe by Django's
    # request logger, which skips a response marked so (django.utils.log.log_response).
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def _shown_to(request: HttpRequest, findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings as the request's user may see them: without examples for anyone but
    staff, and for staff who are not superusers, with their organisations' examples only
    (the admin's scoping: what the admin would not show them, /readyz does not either)."""
    user = getattr(request, "user", None)
    if user is None or not (user.is_authenticated and user.is_staff):
        return [_without_examples(f) for f in findings]
    orgs = member_org_ids(request)
    if orgs is None:  # a superuser
        return findings
    return [_with_examples_of(f, orgs) for f in findings]


def _without_examples(finding: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in finding.items() if key != "examples"}


def _with_examples_of(finding: dict[str, Any], orgs: frozenset[int]) -> dict[str, Any]:
    """Only the examples of ``orgs``: one of no organisation (a sweeper's name) is the
    installation's, for superusers."""
    if "examples" not in finding:
        return finding
    mine = [example for example in finding["examples"] if example.get("org_id") in orgs]
    return {**finding, "examples": mine}


def _verdict() -> dict[str, Any]:
    """The shared verdict while it is fresh, else a new one."""
    fresh_for = float(engine_setting("READYZ_CACHE_SECONDS"))
    if fresh_for <= 0:
        return _checked()
    kept: dict[str, Any] | None = cache.get(CACHE_KEY)
    if kept is not None:
        return kept
    with _computing:
        kept = cache.get(CACHE_KEY)  # made by the request this one waited for
        if kept is not None:
            return kept
        verdict = _checked()
        cache.set(CACHE_KEY, verdict, timeout=fresh_for)
        return verdict


def _checked() -> dict[str, Any]:
    timeout = float(engine_setting("READYZ_TIMEOUT_SECONDS"))
    report = run_checks(Limits.from_settings(), timeout_seconds=timeout)
    if report.broken or report.unchecked:
        said = "; ".join(f"{f.label}: {f.summary}" for f in report.broken + report.unchecked)
        logger.warning("readyz: %s: %s", report.status, said)
    verdict = report.as_dict()
    del verdict["exit_code"]  # the doctor's; here the HTTP status says it
    return verdict


def forget() -> None:
    """Drop the kept verdict: the next request checks again (tests; an operator who fixed
    something and wants to see it now)."""
    cache.delete(CACHE_KEY)
