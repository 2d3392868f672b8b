"""Hops settled together (workflows/engine/group_settle.py).

The SQL below is frozen: it is what this migration ran (0018 drops this version and, going
back, installs it again from here). See 0015.
"""

from django.db import migrations

SETTLE_HOPS_V1 = """
CREATE OR REPLACE FUNCTION waymark_settle_hops_v1(p_hops jsonb)
RETURNS TABLE (n integer, outcome text, run_xmin text, taken_id bigint)
LANGUAGE plpgsql AS $function$
DECLARE
    h jsonb;
    i integer := 0;
    v_locked bigint[];
BEGIN
    SELECT coalesce(array_agg(locked.id), '{}') INTO v_locked
      FROM (SELECT r.id FROM workflows_run r
             WHERE r.id IN (SELECT (e->>'id')::bigint FROM jsonb_array_elements(p_hops) e)
             ORDER BY r.id
               FOR NO KEY UPDATE SKIP LOCKED) locked;
    FOR h IN SELECT value FROM jsonb_array_elements(p_hops) LOOP
        i := i + 1;
        IF NOT (h->>'id')::bigint = ANY(v_locked) THEN
            RETURN QUERY SELECT i, 'busy'::text, NULL::text, NULL::bigint;
            CONTINUE;
        END IF;
        RETURN QUERY
        SELECT i, r.outcome, r.run_xmin, r.taken_id
          FROM waymark_settle_hop_v1(
               (h->>'id')::bigint, (h->>'seen')::xid, (h->>'step')::bigint,
               (h->>'attempt')::integer, h->'step_output', h->'vars', h->'outputs',
               h->'entered', (h->>'steps')::integer, h->>'status', h->'output', h->>'error',
               h->'new_steps', h->'events', h->>'worker', h->>'taken_step',
               (h->>'taken_iteration')::integer) r;
    END LOOP;
END
$function$
"""

DROP_SETTLE_HOPS_V1 = "DROP FUNCTION IF EXISTS waymark_settle_hops_v1(jsonb)"


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0015_settle_hop_function"),
    ]

    operations = [
        migrations.RunSQL(SETTLE_HOPS_V1, reverse_sql=DROP_SETTLE_HOPS_V1),
    ]
