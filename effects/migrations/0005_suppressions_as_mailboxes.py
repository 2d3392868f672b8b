"""Suppression entries stored before addresses were kept as the mailbox they name: an entry
typed ``Ann <Ann@Example.com>`` matched no recipient, since the check at send time compares
mailboxes (``ann@example.com``). Each is rewritten as the model stores it now; where that
mailbox is already suppressed on the channel, the duplicate goes (the older entry stays)."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def as_mailboxes(apps: Any, schema_editor: Any) -> None:
    from effects.consent import stored_address

    Suppression = apps.get_model("effects", "Suppression")
    for row in Suppression.objects.order_by("created_at", "id").iterator():
        address = stored_address(row.address)
        if address == row.address:
            continue
        taken = Suppression.objects.filter(org_id=row.org_id, channel=row.channel,
                                           address=address).exclude(pk=row.pk)  # fmt: skip
        if taken.exists():
            row.delete()
        else:
            Suppression.objects.filter(pk=row.pk).update(address=address)


class Migration(migrations.Migration):
    dependencies = [("effects", "0004_connection_checks_egress_created")]

    operations = [migrations.RunPython(as_mailboxes, migrations.RunPython.noop)]
