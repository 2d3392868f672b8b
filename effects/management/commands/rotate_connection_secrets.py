"""Re-encrypt every connection secret with the first of WAYMARK_EFFECTS_SECRET_KEYS.

Rotation: put the new key first in WAYMARK_EFFECTS_SECRET_KEYS (keep the old ones after it),
restart, run this command, then drop the old keys. Secrets never appear in its output.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError
from django.db import transaction

from effects.models import Connection
from effects.secrets import SecretUnreadable, decrypt, rotate
from workflows.management.base import MigratedCommand


class Command(MigratedCommand):
    help = "Re-encrypt every connection secret with the first configured key."

    def handle(self, *args: Any, **options: Any) -> None:
        rotated, unreadable = 0, []
        with transaction.atomic():
            for conn in Connection.objects.select_for_update().exclude(secret_encrypted=""):
                try:
                    decrypt(conn.secret_encrypted)  # readable with some configured key?
                except SecretUnreadable:
                    unreadable.append(f"{conn.org_id}/{conn.name}")
                    continue
                conn.secret_encrypted = rotate(conn.secret_encrypted)
                conn.save(update_fields=["secret_encrypted"])
                rotated += 1
            if unreadable:
                # Nothing changes when any secret is unreadable: fix the keys, run it again.
                raise CommandError(
                    f"secret_unreadable: {len(unreadable)} connection secret(s) cannot be "
                    f"decrypted with the configured keys ({', '.join(unreadable[:10])}); "
                    "nothing was rotated"
                )
        self.stdout.write(f"rotated {rotated} connection secret(s) to the first key")
