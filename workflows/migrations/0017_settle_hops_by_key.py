from django.db import migrations

from workflows.engine.sql.functions import DROP_SETTLE_HOPS_V2, SETTLE_HOPS_V2


class Migration(migrations.Migration):
    """Group settles find their runs by primary key (sql/functions.py, SETTLE_HOPS_V2); v1
    stays for engines still running the previous release."""

    dependencies = [
        ("workflows", "0016_settle_hops_function"),
    ]

    operations = [
        migrations.RunSQL(SETTLE_HOPS_V2, reverse_sql=DROP_SETTLE_HOPS_V2),
    ]
