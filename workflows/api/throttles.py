"""Rate limits on the API: DRF throttles over the shared cache (the database by default).

- ``ApiKeyThrottle``: requests per API key (WAYMARK_RATE_PER_KEY).
- ``RunStartThrottle``: run starts per organisation, a quota (WAYMARK_QUOTA_STARTS_PER_MINUTE,
  or the organisation's own ``quota_starts_per_minute``); only views that declare
  ``throttle_scope = "run_starts"``, only on POST.
- ``FailedAuthThrottle``: failed authentications per client address (WAYMARK_RATE_AUTH_FAILURES),
  counted and checked by the authentication class when a key fails: past the rate, 429.

Each counts in fixed windows (one counter per window in the cache) rather than DRF's default
list of every request's time, which a high rate would make a large value read and written on
every request. A request is counted first, atomically, and refused when its count passes the
limit: requests racing in parallel each get their own count, so together they cannot pass the
limit (a read, then a write of the read plus one, would let them). One statement per count in
the database cache (``count_one``); with Redis, ``add`` then ``incr``. A refusal is DRF's
``Throttled``: 429, ``Retry-After``, code ``throttled``.
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from ..models import ApiKey

NO_VIEW: Any = None  # outside a view: the authentication class checks and counts failures


class WindowThrottle(SimpleRateThrottle):
    """A SimpleRateThrottle counting in fixed windows of its rate's period."""

    def __init__(self) -> None:
        super().__init__()
        self._set_rate(self.rate)
        self._wait = 1.0

    # Read at each request, not once at import: tests and settings changes see new rates.
    def get_rate(self) -> str | None:
        rate = api_settings.DEFAULT_THROTTLE_RATES.get(self.scope or "")
        return None if rate is None else str(rate)

    def _set_rate(self, rate: str | None) -> None:
        self.rate = rate
        limit, period = self.parse_rate(rate)
        self.limit: int = limit or 0  # 0: no limit
        self.period: int = period or 1

    def allow_request(self, request: Request, view: Any) -> bool:
        self.key = self.get_cache_key(request, view)
        if self.key is None or not self.limit:
            return True
        window = self._window()
        if self._count_one(window) > self.limit:
            self._wait = self._until_next(window)
            return False
        return True

    def wait(self) -> float | None:
        return self._wait

    def blocked_for(self, request: Request) -> float | None:
        """Seconds until this client may try again, without counting this request; None when
        it is not blocked."""
        self.key = self.get_cache_key(request, NO_VIEW)
        if self.key is None or not self.limit:
            return None
        window = self._window()
        return self._until_next(window) if self._peek(window) >= self.limit else None

    def record(self, request: Request) -> None:
        """Count one request (a failure, for FailedAuthThrottle)."""
        self.key = self.get_cache_key(request, NO_VIEW)
        if self.key is None or not self.limit:
            return
        self._count_one(self._window())

    def _window(self) -> int:
        return int(self.timer() // self.period)

    def _counter(self, window: int) -> str:
        """The cache key of this throttle's counter in ``window`` (":n": a counter, whose
        value is a count, not a pickle as the counts before counters were)."""
        return f"{self.key}:{window}:n"

    def _count_one(self, window: int) -> int:
        """This request counted in ``window``: the window's count with it."""
        key, timeout = self._counter(window), self.period + 1
        count_one = getattr(self.cache, "count_one", None)
        if count_one is not None:  # the database cache (waymark_config/pg_cache.py)
            return int(count_one(key, timeout))
        self.cache.add(key, 0, timeout)  # Redis: SET NX, then INCRBY (atomic)
        return int(self.cache.incr(key))

    def _peek(self, window: int) -> int:
        key = self._counter(window)
        peek_count = getattr(self.cache, "peek_count", None)
        return int(peek_count(key) if peek_count is not None else self.cache.get(key, 0))

    def _until_next(self, window: int) -> float:
        return max(1.0, (window + 1) * self.period - self.timer())


class ApiKeyThrottle(WindowThrottle):
    scope = "api_key"

    def get_cache_key(self, request: Request, view: Any | None) -> str | None:
        key = request.auth
        if not isinstance(key, ApiKey):
            return None
        return self.cache_format % {"scope": self.scope, "ident": key.pk}


class RunStartThrottle(WindowThrottle):
    scope = "run_starts"

    def get_cache_key(self, request: Request, view: Any | None) -> str | None:
        key = request.auth
        if request.method != "POST" or getattr(view, "throttle_scope", None) != self.scope:
            return None
        if not isinstance(key, ApiKey):
            return None
        self._own_quota(key)
        return self.cache_format % {"scope": self.scope, "ident": key.org_id}

    def _own_quota(self, key: ApiKey) -> None:
        """The organisation's own quota, when it has one, replaces the default."""
        own = key.org.quota_starts_per_minute
        if own is not None:
            self._set_rate(f"{own}/min" if own else None)


class FailedAuthThrottle(WindowThrottle):
    scope = "auth_failures"

    def get_cache_key(self, request: Request, view: Any | None) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
