"""The hop's server-side function (workflows/engine/hops.py).

The SQL below is frozen: it is what this migration ran, whatever the function's current text
is now (workflows/engine/sql/functions.py, checked against the migrated database by
tests/test_schema_functions.py). A change to the function is a new version and a migration.
"""

from django.db import migrations

SETTLE_HOP_V1 = """
CREATE OR REPLACE FUNCTION waymark_settle_hop_v1(
    p_run bigint, p_seen xid, p_step bigint, p_attempt integer, p_output jsonb,
    p_vars jsonb, p_outputs jsonb, p_entered jsonb, p_steps integer,
    p_status text, p_run_output jsonb, p_error text,
    p_new_steps jsonb, p_events jsonb, p_worker text,
    p_taken_step text, p_taken_iteration integer
) RETURNS TABLE (outcome text, run_xmin text, taken_id bigint)
LANGUAGE plpgsql AS $function$
DECLARE
    v_org bigint;
    v_xmin xid;
    v_taken bigint;
    v_ended boolean := p_status NOT IN ('running', 'paused');
BEGIN
    -- The run first: the one lock order (the run, then its steps).
    SELECT r.org_id INTO v_org FROM workflows_run r
     WHERE r.id = p_run AND r.xmin = p_seen AND r.status = 'running'
       AND (r.deadline_at IS NULL OR r.deadline_at > now())
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'run_changed'::text, NULL::text, NULL::bigint;
        RETURN;
    END IF;

    UPDATE workflows_step
       SET status = 'done', output = p_output, owner = NULL, lease_until = NULL,
           finished_at = now()
     WHERE id = p_step AND attempt = p_attempt AND status = 'running';
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'fenced'::text, NULL::text, NULL::bigint;
        RETURN;
    END IF;

    UPDATE workflows_run
       SET vars = vars || p_vars, outputs = outputs || p_outputs, entered = entered || p_entered,
           steps_executed = p_steps, status = p_status, output = p_run_output, error = p_error,
           finished_at = CASE WHEN v_ended THEN now() END
     WHERE id = p_run
    RETURNING xmin INTO v_xmin;

    WITH inserted AS (
        INSERT INTO workflows_step (
            org_id, run_id, step_id, iteration, type, lane, status, owner, attempt,
            release_count, series_offset, max_attempts, lease_until, wait_kind, wake_at,
            wait_detail, output, error, finished_at, fork_join_id, branch)
        SELECT v_org, p_run, s.step_id, s.iteration, s.type, s.lane, s.status, s.owner,
               s.attempt, s.release_count, s.series_offset, s.max_attempts,
               now() + make_interval(secs => s.lease_until), s.wait_kind,
               now() + make_interval(secs => s.wake_at), s.wait_detail, s.output, s.error,
               now() + make_interval(secs => s.finished_at), s.fork_join_id, s.branch
          FROM jsonb_to_recordset(p_new_steps) AS s(
               step_id text, iteration integer, type text, lane text, status text,
               owner text, attempt integer, release_count integer, series_offset integer,
               max_attempts integer, lease_until float8, wait_kind text, wake_at float8,
               wait_detail jsonb, output jsonb, error text, finished_at float8,
               fork_join_id bigint, branch smallint)
        RETURNING id, step_id, iteration
    )
    SELECT i.id INTO v_taken FROM inserted i
     WHERE i.step_id = p_taken_step AND i.iteration = p_taken_iteration;

    IF v_ended THEN
        WITH ended AS (
            UPDATE workflows_step
               SET status = 'cancelled', owner = NULL, lease_until = NULL, wait_kind = '',
                   wake_at = NULL, finished_at = now()
             WHERE run_id = p_run AND status IN ('ready', 'running', 'waiting')
            RETURNING org_id, run_id, step_id, iteration, attempt
        )
        INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration, attempt,
                                        worker, detail, at)
        SELECT org_id, run_id, 'step.cancelled', step_id, iteration, attempt, p_worker,
               '{"reason": "the run ended"}'::jsonb, now()
          FROM ended;
    END IF;

    INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration, attempt, worker,
                                    detail, at)
    SELECT v_org, p_run, e.kind, e.step_id, e.iteration, e.attempt, p_worker, e.detail, now()
      FROM ROWS FROM (jsonb_to_recordset(p_events) AS (kind text, step_id text,
           iteration integer, attempt integer, detail jsonb))
           WITH ORDINALITY AS e(kind, step_id, iteration, attempt, detail, n)
     ORDER BY e.n;

    RETURN QUERY SELECT 'settled'::text, v_xmin::text, v_taken;
END
$function$
"""

DROP_SETTLE_HOP_V1 = """
DROP FUNCTION IF EXISTS waymark_settle_hop_v1(
    bigint, xid, bigint, integer, jsonb, jsonb, jsonb, jsonb, integer, text, jsonb, text,
    jsonb, jsonb, text, text, integer)
"""


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0014_signal_correlations"),
    ]

    operations = [
        migrations.RunSQL(SETTLE_HOP_V1, reverse_sql=DROP_SETTLE_HOP_V1),
    ]
