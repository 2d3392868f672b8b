"""API-key authentication: ``Authorization: Bearer wmk_<prefix>_<secret>``.

The authenticated principal is the key's organisation; every view scopes its queries to
``request.auth.org``, read through ``request_key(request)``, which gives the ``ApiKey`` its
type. Keys are checked on every request, so a revoked key stops at once.
"""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from ..engine import logcontext
from ..errors import AuthenticationFailed, ReadOnlyKey, ScopeRequired
from ..models import ApiKey
from ..services.audit import Actor
from ..services.tenancy import api_key_authenticate
from .throttles import FailedAuthThrottle


class OrganisationPrincipal:
    """Stands in for ``request.user``: an organisation, not a person."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, key: ApiKey) -> None:
        self.org = key.org
        self.key = key

    def __str__(self) -> str:
        return f"org:{self.org.slug}"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[OrganisationPrincipal, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        try:
            if scheme.lower() != self.keyword.lower() or not raw.strip():
                raise AuthenticationFailed()
            key = api_key_authenticate(raw.strip())
        except AuthenticationFailed:
            self._count_failure(request)
            raise
        if logcontext.on():  # the request's log lines name its organisation
            logcontext.bind(org_id=key.org_id)
        return OrganisationPrincipal(key), key

    @staticmethod
    def _count_failure(request: Request) -> None:
        """Guessing keys is slow: past WAYMARK_RATE_AUTH_FAILURES failures, an address gets 429
        (with Retry-After) instead of 401 until the window ends, so it learns nothing more.
        Only failures are counted and checked: a valid key costs no lookup here."""
        failures = FailedAuthThrottle()
        wait = failures.blocked_for(request)
        if wait is not None:
            raise exceptions.Throttled(
                wait=wait, detail="Too many failed authentications from this address."
            )
        failures.record(request)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


def request_key(request: Request) -> ApiKey:
    """The key that authenticated ``request``: what the views scope by (``.org``)."""
    key = request.auth
    if not isinstance(key, ApiKey):
        raise AuthenticationFailed()
    return key


def request_actor(request: Request) -> Actor:
    """Who acted, for the audit log and run histories (``label``: ``api_key:<prefix>``)."""
    return Actor.api_key(request_key(request))


class IsOrganisationKey(permissions.BasePermission):
    """An API key authenticated the request, and may do what it asks: a read-only key only
    reads (checked on every request, so making a key read-only takes effect at once)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        key = request_key(request)  # raises unless an API key authenticated the request
        if key.read_only and request.method not in permissions.SAFE_METHODS:
            raise ReadOnlyKey()
        return True


def require_scope(request: Request, scope: str) -> None:
    """Refuse (403 ``scope_required``) unless the key that authenticated ``request`` has
    ``scope`` now: read again from its row, at the moment of use, so a scope taken away is
    refused at once (the key itself was read at authentication)."""
    key = request_key(request)
    if not ApiKey.objects.filter(pk=key.pk, scopes__contains=[scope]).exists():
        raise ScopeRequired(scope=scope)
