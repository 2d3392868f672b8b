"""Connection secrets, encrypted at rest with keys that can be rotated.

A MultiFernet over the keys in ``settings.EFFECTS["SECRET_KEYS"]``: the first key encrypts,
every key decrypts, so a new key goes first and ``manage.py rotate_connection_secrets``
re-encrypts every stored secret with it before the old one is dropped. Without configured
keys one key is derived from SECRET_KEY (so a development checkout needs no set-up).
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


@lru_cache(maxsize=1)
def _fernet(keys: tuple[str, ...], fallback: str) -> MultiFernet:
    if not keys:
        derived = hashlib.sha256(f"waymark-connection-secrets:{fallback}".encode()).digest()
        keys = (base64.urlsafe_b64encode(derived).decode(),)
    return MultiFernet([Fernet(key.encode()) for key in keys])


def fernet() -> MultiFernet:
    return _fernet(tuple(settings.EFFECTS["SECRET_KEYS"]), settings.SECRET_KEY)


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
