"""Connection secrets, encrypted at rest with keys that can be rotated.

A MultiFernet over the keys in ``settings.EFFECTS["SECRET_KEYS"]``
(``WAYMARK_EFFECTS_SECRET_KEYS``): the first key encrypts, every key decrypts, so a new key
goes first and ``manage.py rotate_connection_secrets`` re-encrypts every stored secret with
it before the old one is dropped.

Without configured keys (a development checkout needs no set-up) the key that encrypts is
derived from SECRET_KEY. That derived key stays readable once keys are configured: a
read-only fallback after them, which never encrypts. Otherwise configuring a first key
would make every secret written before unreadable (``secret_unreadable``), and every effect
of a restarted engine would fail. So moving from the derived key to configured keys is an
ordinary rotation: configure a key, restart, run the command (it says how many secrets it
moved off the derived key). Once none is left under it, setting
``WAYMARK_EFFECTS_DERIVED_KEY_READABLE=false`` drops the fallback. Keys derived from
``SECRET_KEY_FALLBACKS`` are read the same way, so a rotated SECRET_KEY loses no secret.
Production (``WAYMARK_PRODUCTION=1``) refuses to start without configured keys
(waymark_config/settings.py).

Plain secrets never leave this module except to the provider that uses them.
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class SecretUnreadable(Exception):
    code = "secret_unreadable"


def derived_key(secret_key: str) -> str:
    """The Fernet key derived from a Django secret key (the one used without configured keys)."""
    digest = hashlib.sha256(f"waymark-connection-secrets:{secret_key}".encode()).digest()
    return base64.urlsafe_b64encode(digest).decode()


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...], derived: tuple[str, ...]) -> MultiFernet:
    """The configured keys (the first encrypts), then the derived ones, read only; with no
    configured key the first derived key (SECRET_KEY's) encrypts."""
    ordered = list(dict.fromkeys([*keys, *derived]))  # in order, each once
    return MultiFernet([Fernet(key.encode()) for key in ordered])


def _derived_keys() -> tuple[str, ...]:
    sources = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return tuple(derived_key(str(source)) for source in sources if source)


def fernet() -> MultiFernet:
    keys = tuple(settings.EFFECTS["SECRET_KEYS"])
    readable = not keys or settings.EFFECTS.get("DERIVED_KEY_READABLE", True)
    return _fernet(keys, _derived_keys() if readable else ())


def under_derived_key(token: str) -> bool:
    """Whether ``token`` is encrypted with a key derived from SECRET_KEY (or one of its
    fallbacks), rather than with a configured key."""
    if not token:
        return False
    derived = MultiFernet([Fernet(key.encode()) for key in _derived_keys()])
    try:
        derived.decrypt(token.encode())
    except InvalidToken:
        return False
    return True


def secret_problem(secret: str) -> str | None:
    """Why ``secret`` cannot be a connection secret (it goes into headers and logins), or
    None. A line break or another control character would make the request fail with the
    secret quoted in the error."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in secret):
        return "must not contain line breaks or other control characters"
    return None


def encrypt(secret: str) -> str:
    return fernet().encrypt(secret.encode()).decode() if secret else ""


def decrypt(token: str) -> str:
    if not token:
        return ""
    try:
        return fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        # Never the token itself in the message: it is the secret, encrypted.
        raise SecretUnreadable(
            "the connection's secret cannot be decrypted with the configured keys "
            "(WAYMARK_EFFECTS_SECRET_KEYS): set it again, or restore the old key"
        ) from None


def rotate(token: str) -> str:
    """The same secret, encrypted with the first key."""
    return fernet().rotate(token.encode()).decode() if token else ""
