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
