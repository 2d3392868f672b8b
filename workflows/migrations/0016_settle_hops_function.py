from django.db import migrations

from workflows.engine.sql.functions import DROP_SETTLE_HOPS_V1, SETTLE_HOPS_V1


class Migration(migrations.Migration):
    """Hops settled together (workflows/engine/group_settle.py, sql/functions.py)."""

    dependencies = [
        ("workflows", "0015_settle_hop_function"),
    ]

    operations = [
        migrations.RunSQL(SETTLE_HOPS_V1, reverse_sql=DROP_SETTLE_HOPS_V1),
    ]
