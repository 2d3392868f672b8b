"""Re-encrypt every webhook signing secret with the first of WAYMARK_EFFECTS_SECRET_KEYS.

Run it beside ``rotate_connection_secrets`` when the key is rotated
(docs/how-to/receive-webhooks.md): the secrets themselves do not change, so receivers notice
nothing. Secrets never appear in its output; when any cannot be decrypted with the configured keys,
nothing changes.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError
from django.db import transaction

from effects.public import SecretUnreadable, decrypt, rotate
from webhooks.models import Subscription
from workflows.plugins.runs import MigratedCommand


class Command(MigratedCommand):
    help = "Re-encrypt every webhook signing secret with the first configured key."

    def handle(self, *args: Any, **options: Any) -> None:
        rotated, unreadable = 0, []
        with transaction.atomic():
            for subscription in Subscription.objects.select_for_update().order_by("id"):
                try:
                    decrypt(subscription.secret_encrypted)
                except SecretUnreadable:
                    unreadable.append(f"{subscription.org_id}/{subscription.pk}")
                    continue
                subscription.secret_encrypted = rotate(subscription.secret_encrypted)
                subscription.save(update_fields=["secret_encrypted"])
                rotated += 1
            if unreadable:
                raise CommandError(
                    f"secret_unreadable: {len(unreadable)} webhook secret(s) cannot be "
                    f"decrypted with the configured keys ({', '.join(unreadable[:10])}); "
                    "nothing was rotated"
                )
        self.stdout.write(f"rotated {rotated} webhook secret(s) to the first key")
