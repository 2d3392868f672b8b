"""The control room's runs by status in the last hour and the last day: (organisation,
status, created_at), so each count is a range of its window, capped, instead of every run of
that status (run_org_status_id orders by id, which says nothing of time). Built
CONCURRENTLY, so an installation with millions of runs keeps starting and settling them
while it is built (hence a migration outside a transaction)."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("workflows", "0030_erasure_scope"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="run",
            index=models.Index(
                fields=["org", "status", "created_at"], name="run_org_status_created"
            ),
        ),
    ]
