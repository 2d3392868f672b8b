"""What an organisation may set on its connections, as the operator allows it.

A connection's ``timeout_seconds`` and ``max_concurrency`` are the tenant's to set, and a tenant
who sets an hour's timeout and ten thousand calls in flight against a host that never answers
would hold what every organisation shares. The operator's limits
(WAYMARK_EFFECTS_MAX_TIMEOUT_SECONDS, WAYMARK_EFFECTS_MAX_CONCURRENCY) refuse larger values when
a connection is written, and hold a connection written before a limit was lowered to it when
it is called.
"""

from __future__ import annotations

from django.conf import settings

_SETTINGS = {
    "timeout_seconds": ("MAX_TIMEOUT_SECONDS", "WAYMARK_EFFECTS_MAX_TIMEOUT_SECONDS"),
    "max_concurrency": ("MAX_CONCURRENCY", "WAYMARK_EFFECTS_MAX_CONCURRENCY"),
}


def operator_limit(field: str) -> float:
    """The most the operator lets an organisation set ``field`` to."""
    return float(settings.EFFECTS[_SETTINGS[field][0]])


def limit_problem(field: str, value: float) -> str | None:
    """Why ``value`` may not be set on ``field``, or None."""
    limit = operator_limit(field)
    if value <= limit:
        return None
    return f"At most {limit:g}: the limit this service sets ({_SETTINGS[field][1]})."
