"""API-key authentication: ``Authorization: Bearer wmk_<prefix>_<secret>``.

The authenticated principal is the key's organisation; every view scopes its queries to
``request.auth.org``, read through ``request_key(request)``, which gives the ``ApiKey`` its
type. Keys are checked on every request, so a revoked key stops at once.
"""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, permissions
from rest_framework.request import Request

from ..errors import AuthenticationFailed
from ..models import ApiKey
from ..services.tenancy import api_key_authenticate


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
        if scheme != self.keyword or not raw.strip():
            raise AuthenticationFailed()
        key = api_key_authenticate(raw.strip())
        return OrganisationPrincipal(key), key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


def request_key(request: Request) -> ApiKey:
    """The key that authenticated ``request``: what the views scope by (``.org``)."""
    key = request.auth
    if not isinstance(key, ApiKey):
        raise AuthenticationFailed()
    return key


class IsOrganisationKey(permissions.BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        request_key(request)  # raises unless an API key authenticated the request
        return True
