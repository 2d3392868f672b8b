"""Where a connection's secret goes, and the rule that settings alone never move it.

Changing a connection's settings and knowing its secret are two different powers (an API
key that may write, a staff member with ``change_connection``): a change that would send the
stored secret somewhere else (a base URL on another origin; another SMTP server, or the same
one in the clear) is made only with the secret given again. Each provider says where its
secret goes (Provider.secret_destination)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from .models import Connection
from .perform import PROVIDERS


def moves_secret(conn: Connection, base_url: str, options: Any) -> bool:
    """Whether ``base_url`` and ``options`` would send ``conn``'s stored secret somewhere
    else than its current settings do (False when it has none)."""
    provider = PROVIDERS.get(conn.provider)
    if not conn.secret_encrypted or provider is None:
        return False
    given = options if isinstance(options, dict) else {}
    now = provider.secret_destination(conn.base_url, conn.options or {})
    return bool(now != provider.secret_destination(base_url, given))


def where_it_goes(provider: str) -> str:
    """What a change moved, in words, for the error that asks for the secret again."""
    if provider == "email":
        return "another SMTP server (host, port) or over another encryption (use_tls, use_ssl)"
    return "another origin (base_url's scheme, host and port)"


def base_url_problem(base_url: str) -> str | None:
    """What a connection's base URL must be, when it is not (None: it is): an http(s) URL
    with a host, and no user or password in it (a credential there would be shown wherever
    the URL is, which the secret never is: it belongs in the secret). Empty is allowed (a
    provider with a default, or an email connection, which names its server in its
    options)."""
    if not base_url:
        return None
    try:
        parts = urlsplit(base_url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as exc:
        return f"a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "a URL without a user or password: put the credential in the secret"
    return None
