"""Search inside runs' input: pg_trgm's trigram index over each run's start key and input
text (``workflows.models.runs.SearchText``), with btree_gin so the organisation is in the
same index.

Both extensions are trusted (PostgreSQL 13+): a database owner without superuser rights may
create them. The index is built CONCURRENTLY, so an installation with millions of runs keeps
starting and settling them while it is built (hence a migration outside a transaction). Its
SQL is written here rather than generated from the model's index: Django renders an
operator class in an index only when ``django.contrib.postgres`` is installed, which a host
project need not do; the expression is SearchText's, which the search reads (a test holds
the search to this index).
"""

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import BtreeGinExtension, TrigramExtension
from django.db import migrations, models

import workflows.models.runs

CREATE = """
CREATE INDEX CONCURRENTLY IF NOT EXISTS run_search ON workflows_run
USING gin (org_id, (start_key || ' ' || (input)::text) gin_trgm_ops)
"""
DROP = "DROP INDEX CONCURRENTLY IF EXISTS run_search"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("workflows", "0021_sweep_lease_belongs_to_the_engine"),
    ]

    operations = [
        TrigramExtension(),
        BtreeGinExtension(),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(CREATE, DROP)],
            state_operations=[
                migrations.AddIndex(
                    model_name="run",
                    index=django.contrib.postgres.indexes.GinIndex(
                        models.F("org"),
                        django.contrib.postgres.indexes.OpClass(
                            workflows.models.runs.SearchText(), name="gin_trgm_ops"
                        ),
                        name="run_search",
                    ),
                ),
            ],
        ),
    ]
