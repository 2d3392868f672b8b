from django.db import migrations, models

# The keys a signal answers. Frozen: what this migration ran, whatever the function's current
# text is now (workflows/engine/sql/functions.py; see 0015).
SIGNAL_KEYS_V1 = """
CREATE OR REPLACE FUNCTION waymark_signal_keys_v1(
    p_org bigint, p_name text, p_correlation text, p_correlations text[]
) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $function$
    SELECT array_agg(DISTINCT p_org::text || '/' || p_name || '/' || c)
      FROM unnest(array_prepend(p_correlation, p_correlations)) AS c
$function$
"""

DROP_SIGNAL_KEYS_V1 = "DROP FUNCTION IF EXISTS waymark_signal_keys_v1(bigint, text, text, text[])"

# Pending signals by the keys they answer (waymark_signal_keys_v1): the sweep's late
# matching probes it once per waiting step, so its cost follows the waits, not the signals
# nobody waits for. fastupdate off: a probe never reads a pending list that the inserts of a
# flood of signals grew.
SIGNAL_PENDING_KEYS = """
CREATE INDEX signal_pending_keys ON workflows_signal
 USING gin (waymark_signal_keys_v1(org_id, name::text, correlation::text, correlations::text[]))
  WITH (fastupdate = off)
 WHERE consumed_at IS NULL AND dropped_at IS NULL AND run_id IS NULL
"""


class Migration(migrations.Migration):
    """The sweep's late matching goes from the waiting steps to the signals they match
    (sql.SIGNALS_MATCHED_LATE), through these two indexes."""

    dependencies = [
        ("workflows", "0019_quotas_for_every_start"),
    ]

    operations = [
        migrations.RunSQL(SIGNAL_KEYS_V1, reverse_sql=DROP_SIGNAL_KEYS_V1),
        migrations.RunSQL(SIGNAL_PENDING_KEYS, reverse_sql="DROP INDEX signal_pending_keys"),
        migrations.AddIndex(
            model_name="signal",
            index=models.Index(
                condition=models.Q(
                    ("consumed_at__isnull", True),
                    ("dropped_at__isnull", True),
                    ("run__isnull", False),
                ),
                fields=["run", "id"],
                name="signal_pending_run",
            ),
        ),
    ]
