from django.db import migrations

from workflows.engine.sql.functions import (
    DROP_SETTLE_HOPS_V1,
    DROP_SETTLE_HOPS_V3,
    SETTLE_HOPS_V1,
    SETTLE_HOPS_V3,
)


class Migration(migrations.Migration):
    """Group settles write each kind of row once per group (sql/functions.py, SETTLE_HOPS_V3);
    v2 stays for engines still running the previous release, and v1, which only the release
    before it called, goes."""

    dependencies = [
        ("workflows", "0017_settle_hops_by_key"),
    ]

    operations = [
        migrations.RunSQL(SETTLE_HOPS_V3, reverse_sql=DROP_SETTLE_HOPS_V3),
        migrations.RunSQL(DROP_SETTLE_HOPS_V1, reverse_sql=SETTLE_HOPS_V1),
    ]
