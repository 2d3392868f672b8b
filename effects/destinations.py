"""Where a connection's secret goes, and the rule that settings alone never move it.

Changing a connection's settings and knowing its secret are two different powers (an API
key that may write, a staff member with ``change_connection``): a change that would send the
stored secret somewhere else (a base URL on another origin; another SMTP server, or the same
one in the clear) is made only with the secret given again. Each provider says where its
secret goes (Provider.secret_destination)."""

from __future__ import annotations

import re
from typing import Any

from .models import Connection
from .perform import PROVIDERS
from .providers.base import Provider


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
    """What a change moved, in words, for the error that asks for the secret again: as the
    connection's provider says it (Provider.destination_in_words)."""
    found = PROVIDERS.get(provider)
    return (found or Provider).destination_in_words


# A connection's base URL: http(s), a host (a name or an IPv4 address: an IPv6 one by a name
# that resolves to it), a port that is one, and no user or password (a credential there would
# be shown wherever the URL is, which the secret never is). The API's schema says the same
# pattern, so what it lets a client send is what the API takes.
BASE_URL_PATTERN = (
    r"^https?://([^\s/?#@:\[\]]+)"
    r"(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?"
    r"([/?#]\S*)?$"
)
BASE_URL_RULE = (
    "an http:// or https:// URL with a host name or IPv4 address, and no user or password in "
    "it (the credential goes in the secret)"
)


def base_url_problem(base_url: str) -> str | None:
    """What a connection's base URL must be, when it is not (None: it is). Empty is allowed
    (a provider with a default, or an email connection, which names its server in its
    options)."""
    if not base_url or re.fullmatch(BASE_URL_PATTERN, base_url):
        return None
    return BASE_URL_RULE
