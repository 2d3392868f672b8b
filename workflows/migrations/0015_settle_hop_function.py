from django.db import migrations

from workflows.engine.sql.functions import DROP_SETTLE_HOP_V1, SETTLE_HOP_V1


class Migration(migrations.Migration):
    """The hop's server-side function (workflows/engine/hops.py, sql/functions.py)."""

    dependencies = [
        ("workflows", "0014_signal_correlations"),
    ]

    operations = [
        migrations.RunSQL(SETTLE_HOP_V1, reverse_sql=DROP_SETTLE_HOP_V1),
    ]
