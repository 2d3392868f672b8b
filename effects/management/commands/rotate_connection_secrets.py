"""Re-encrypt every connection secret with the first of WAYMARK_EFFECTS_SECRET_KEYS.

Rotation: put the new key first in WAYMARK_EFFECTS_SECRET_KEYS (keep the old ones after it),
restart, run this command, then drop the old keys. Secrets never appear in its output.

Secrets written before any key was configured are under the key derived from SECRET_KEY,
which stays readable (effects/secrets.py): the command moves them to the first key too, and
says how many it moved, so the operator knows when none is left under the derived key.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.db import transaction

from effects.models import Connection
from effects.secrets import SecretUnreadable, decrypt, rotate, under_derived_key
from workflows.plugins.runs import MigratedCommand


class Command(MigratedCommand):
    help = "Re-encrypt every connection secret with the first configured key."

    def handle(self, *args: Any, **options: Any) -> None:
        rotated, derived, unreadable = 0, 0, []
        with transaction.atomic():
            for conn in Connection.objects.select_for_update().exclude(secret_encrypted=""):
                try:
                    decrypt(conn.secret_encrypted)  # readable with some configured key?
                except SecretUnreadable:
                    unreadable.append(f"{conn.org_id}/{conn.name}")
                    continue
                derived += under_derived_key(conn.secret_encrypted)
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
        if settings.EFFECTS["SECRET_KEYS"]:
            self.stdout.write(
                f"{derived} of them were under the key derived from SECRET_KEY; none is any more"
            )
        else:
            self.stdout.write(
                "no key is configured (WAYMARK_EFFECTS_SECRET_KEYS): the first key is the one "
                "derived from SECRET_KEY"
            )
