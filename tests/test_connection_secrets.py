"""Connection secrets at rest: encrypted, rotatable, never shown."""

from __future__ import annotations

from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection

from effects.models import Connection
from effects.secrets import decrypt, encrypt

pytestmark = pytest.mark.django_db


def stored(conn: Connection) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret_encrypted FROM effects_connection WHERE id = %s", [conn.pk])
        return str(cursor.fetchone()[0])


def test_a_secret_is_encrypted_at_rest_and_rotates_to_a_new_key(org, settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.EFFECTS = {**settings.EFFECTS, "SECRET_KEYS": [old]}
    conn = Connection.objects.create(org=org, name="mail", provider="email",
                                     secret_encrypted=encrypt("hunter2-token"))  # fmt: skip
    assert "hunter2" not in stored(conn)
    assert Fernet(old.encode()).decrypt(stored(conn).encode()) == b"hunter2-token"
    # Rotation: the new key first, the old one still readable, then the command.
    settings.EFFECTS = {**settings.EFFECTS, "SECRET_KEYS": [new, old]}
    out = StringIO()
    call_command("rotate_connection_secrets", stdout=out)
    assert "rotated 1 connection secret(s)" in out.getvalue()
    assert "hunter2" not in out.getvalue()
    assert Fernet(new.encode()).decrypt(stored(conn).encode()) == b"hunter2-token"
    settings.EFFECTS = {**settings.EFFECTS, "SECRET_KEYS": [new]}  # the old key dropped
    assert decrypt(stored(conn)) == "hunter2-token"


def test_rotation_changes_nothing_when_a_secret_is_unreadable(org, settings):
    settings.EFFECTS = {**settings.EFFECTS, "SECRET_KEYS": [Fernet.generate_key().decode()]}
    readable = Connection.objects.create(org=org, name="a", provider="http",
                                         secret_encrypted=encrypt("s1"))  # fmt: skip
    lost_key = Fernet.generate_key()
    unreadable = Fernet(lost_key).encrypt(b"s2").decode()
    Connection.objects.create(org=org, name="b", provider="http", secret_encrypted=unreadable)
    before = stored(readable)
    keys = [Fernet.generate_key().decode(), *settings.EFFECTS["SECRET_KEYS"]]
    settings.EFFECTS = {**settings.EFFECTS, "SECRET_KEYS": keys}
    with pytest.raises(CommandError, match="secret_unreadable: 1 connection"):
        call_command("rotate_connection_secrets")
    assert stored(readable) == before


def test_secrets_under_the_derived_key_survive_configuring_a_key_and_rotate_off_it(org, settings):
    """A checkout that ran without WAYMARK_EFFECTS_SECRET_KEYS has its secrets under the key
    derived from SECRET_KEY. Configuring a key (and restarting) must not make them
    unreadable: every effect on those connections would fail (secret_unreadable). The
    documented rotation then moves them to the configured key."""
    from cryptography.fernet import InvalidToken

    from effects.perform import load_connection
    from effects.providers.http import HttpProvider

    settings.EFFECTS = {**settings.EFFECTS, "SECRET_KEYS": []}
    conn = Connection.objects.create(org=org, name="crm", provider="http",
                                     secret_encrypted=encrypt("crm-token"))  # fmt: skip
    new = Fernet.generate_key().decode()
    with pytest.raises(InvalidToken):  # under the derived key, not the one configured next
        Fernet(new.encode()).decrypt(stored(conn).encode())

    settings.EFFECTS = {**settings.EFFECTS, "SECRET_KEYS": [new]}  # configured, restarted
    # Still readable, where the effects read it; new secrets use the configured key.
    info = load_connection(org.pk, "crm", HttpProvider())
    assert info is not None and info.secret == "crm-token"
    assert Fernet(new.encode()).decrypt(encrypt("fresh").encode()) == b"fresh"

    out = StringIO()
    call_command("rotate_connection_secrets", stdout=out)
    assert "rotated 1 connection secret(s) to the first key" in out.getvalue()
    assert "1 of them were under the key derived from SECRET_KEY" in out.getvalue()
    assert Fernet(new.encode()).decrypt(stored(conn).encode()) == b"crm-token"
    # Once none is under it, the derived key may be dropped: the secret reads without it.
    settings.EFFECTS = {**settings.EFFECTS, "DERIVED_KEY_READABLE": False}
    assert decrypt(stored(conn)) == "crm-token"


def test_dropping_the_derived_key_before_rotating_leaves_its_secrets_unreadable(org, settings):
    """The switch does what it says (so the rotation's count is what to go by)."""
    from effects.secrets import SecretUnreadable

    settings.EFFECTS = {**settings.EFFECTS, "SECRET_KEYS": []}
    token = encrypt("old-token")
    keys = [Fernet.generate_key().decode()]
    settings.EFFECTS = {**settings.EFFECTS, "SECRET_KEYS": keys, "DERIVED_KEY_READABLE": False}
    with pytest.raises(SecretUnreadable):
        decrypt(token)
    settings.EFFECTS = {**settings.EFFECTS, "DERIVED_KEY_READABLE": True}
    assert decrypt(token) == "old-token"
