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
# How many runs a search matches decides its plan: the newest runs by id, each tested (a
# word in many runs), or the trigram index (a rare one). The planner reads that from the
# statistics of the index's expression; at the default target (100) a name in 0.2% of the
# runs was sometimes taken for 1% and read by id, through half a million runs (2 s at a
# million); at 1,000 the estimates held (benchmarks/RESULTS.md). It makes ANALYZE of the
# runs sample 300,000 rows instead of 30,000 (7 s instead of 0.7 s at a million runs, in
# autovacuum's background).
STATISTICS = "ALTER INDEX run_search ALTER COLUMN 2 SET STATISTICS 1000"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("workflows", "0024_run_migrations"),
    ]

    operations = [
        TrigramExtension(),
        BtreeGinExtension(),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(CREATE, DROP),
                migrations.RunSQL(STATISTICS, migrations.RunSQL.noop),
            ],
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
