"""Group settles write each kind of row once per group (waymark_settle_hops_v3); v2 stays
for engines still running the previous release, and v1, which only the release before it
called, goes.

The SQL below is frozen: it is what this migration ran. See 0015.
"""

from importlib import import_module

from django.db import migrations

SETTLE_HOPS_V3 = """
CREATE OR REPLACE FUNCTION waymark_settle_hops_v3(p_hops jsonb)
RETURNS TABLE (n integer, outcome text, run_xmin text, taken_id bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $function$
DECLARE
    v_first integer[];    -- each locked run's first member
    v_current integer[];  -- ... whose run is as its walk saw it
    v_done integer[];     -- ... whose step was still its to settle
    v_settled integer[];  -- v_done, in order, with each run's org, new xmin and taken step
    v_orgs bigint[];
    v_xmins text[];
    v_taken bigint[];
    v_ended bigint[];     -- runs the group ended
BEGIN
    WITH member AS (
        SELECT e.n::integer AS m, (e.h->>'id')::bigint AS run_id, (e.h->>'seen')::xid AS seen,
               (e.h->>'step')::bigint AS step, (e.h->>'attempt')::integer AS attempt,
               e.h->'step_output' AS step_output
          FROM jsonb_array_elements(p_hops) WITH ORDINALITY AS e(h, n)
    ),
    locked AS MATERIALIZED (
        SELECT r.id, r.xmin AS run_xmin, r.status, r.deadline_at FROM workflows_run r
         WHERE r.id = ANY(ARRAY(SELECT member.run_id FROM member))
         ORDER BY r.id
           FOR NO KEY UPDATE SKIP LOCKED
    ),
    first_of_run AS MATERIALIZED (
        SELECT DISTINCT ON (member.run_id) member.*,
               l.run_xmin = member.seen AND l.status = 'running'
               AND (l.deadline_at IS NULL OR l.deadline_at > now()) AS as_seen
          FROM member JOIN locked l ON l.id = member.run_id
         ORDER BY member.run_id, member.m
    ),
    done AS (
        UPDATE workflows_step s
           SET status = 'done', output = f.step_output, owner = NULL, lease_until = NULL,
               finished_at = now()
          FROM first_of_run f
         WHERE f.as_seen AND s.id = f.step AND s.attempt = f.attempt AND s.status = 'running'
        RETURNING f.m
    )
    SELECT ARRAY(SELECT f.m FROM first_of_run f),
           ARRAY(SELECT f.m FROM first_of_run f WHERE f.as_seen), ARRAY(SELECT done.m FROM done)
      INTO v_first, v_current, v_done;

    IF cardinality(v_done) > 0 THEN
        WITH member AS (
            SELECT e.n::integer AS m, (e.h->>'id')::bigint AS run_id, e.h->'vars' AS vars,
                   e.h->'outputs' AS outputs, e.h->'entered' AS entered,
                   (e.h->>'steps')::integer AS steps, e.h->>'status' AS status,
                   e.h->'output' AS output, e.h->>'error' AS error,
                   e.h->'new_steps' AS new_steps, e.h->>'taken_step' AS taken_step,
                   (e.h->>'taken_iteration')::integer AS taken_iteration
              FROM jsonb_array_elements(p_hops) WITH ORDINALITY AS e(h, n)
             WHERE e.n::integer = ANY(v_done)
        ),
        runs AS (
            UPDATE workflows_run r
               SET vars = r.vars || member.vars, outputs = r.outputs || member.outputs,
                   entered = r.entered || member.entered, steps_executed = member.steps,
                   status = member.status, output = member.output, error = member.error,
                   finished_at = CASE WHEN member.status NOT IN ('running', 'paused')
                                      THEN now() END
              FROM member
             WHERE r.id = member.run_id
            RETURNING member.m, r.org_id, r.xmin::text AS run_xmin
        ),
        inserted AS (
            INSERT INTO workflows_step (
                org_id, run_id, step_id, iteration, type, lane, status, owner, attempt,
                release_count, series_offset, max_attempts, lease_until, wait_kind, wake_at,
                wait_detail, output, error, finished_at, fork_join_id, branch)
            SELECT runs.org_id, member.run_id, s.step_id, s.iteration, s.type, s.lane,
                   s.status, s.owner, s.attempt, s.release_count, s.series_offset,
                   s.max_attempts, now() + make_interval(secs => s.lease_until), s.wait_kind,
                   now() + make_interval(secs => s.wake_at), s.wait_detail, s.output,
                   s.error, now() + make_interval(secs => s.finished_at), s.fork_join_id,
                   s.branch
              FROM member JOIN runs ON runs.m = member.m
                   CROSS JOIN LATERAL ROWS FROM (jsonb_to_recordset(member.new_steps) AS (
                       step_id text, iteration integer, type text, lane text, status text,
                       owner text, attempt integer, release_count integer,
                       series_offset integer, max_attempts integer, lease_until float8,
                       wait_kind text, wake_at float8, wait_detail jsonb, output jsonb,
                       error text, finished_at float8, fork_join_id bigint, branch smallint))
                   WITH ORDINALITY AS s(step_id, iteration, type, lane, status, owner, attempt,
                       release_count, series_offset, max_attempts, lease_until, wait_kind,
                       wake_at, wait_detail, output, error, finished_at, fork_join_id, branch,
                       k)
             ORDER BY member.m, s.k
            RETURNING id, run_id, step_id, iteration
        )
        SELECT array_agg(runs.m ORDER BY runs.m), array_agg(runs.org_id ORDER BY runs.m),
               array_agg(runs.run_xmin ORDER BY runs.m),
               array_agg(taken.id ORDER BY runs.m),
               array_agg(member.run_id) FILTER (WHERE member.status NOT IN ('running', 'paused'))
          INTO v_settled, v_orgs, v_xmins, v_taken, v_ended
          FROM runs JOIN member ON member.m = runs.m
               LEFT JOIN inserted taken
                      ON taken.run_id = member.run_id AND taken.step_id = member.taken_step
                     AND taken.iteration = member.taken_iteration;

        IF v_ended IS NOT NULL THEN
            WITH ended AS (
                UPDATE workflows_step
                   SET status = 'cancelled', owner = NULL, lease_until = NULL, wait_kind = '',
                       wake_at = NULL, finished_at = now()
                 WHERE run_id = ANY(v_ended) AND status IN ('ready', 'running', 'waiting')
                RETURNING org_id, run_id, step_id, iteration, attempt
            )
            INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration, attempt,
                                            worker, detail, at)
            SELECT ended.org_id, ended.run_id, 'step.cancelled', ended.step_id,
                   ended.iteration, ended.attempt, e.h->>'worker',
                   '{"reason": "the run ended"}'::jsonb, now()
              FROM ended JOIN jsonb_array_elements(p_hops) WITH ORDINALITY AS e(h, n)
                   ON e.n::integer = ANY(v_settled) AND (e.h->>'id')::bigint = ended.run_id
             ORDER BY ended.run_id;
        END IF;

        INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration, attempt,
                                        worker, detail, at)
        SELECT settled.org_id, (hop.doc->>'id')::bigint, e.kind, e.step_id, e.iteration,
               e.attempt, hop.doc->>'worker', e.detail, now()
          FROM unnest(v_settled, v_orgs) WITH ORDINALITY AS settled(m, org_id, k)
               JOIN jsonb_array_elements(p_hops) WITH ORDINALITY AS hop(doc, n)
                 ON hop.n::integer = settled.m
               CROSS JOIN LATERAL ROWS FROM (jsonb_to_recordset(hop.doc->'events') AS (
                   kind text, step_id text, iteration integer, attempt integer, detail jsonb))
               WITH ORDINALITY AS e(kind, step_id, iteration, attempt, detail, j)
         ORDER BY settled.k, e.j;
    END IF;

    RETURN QUERY
    SELECT each.m,
           CASE WHEN each.m = ANY(v_done) THEN 'settled'
                WHEN each.m = ANY(v_current) THEN 'fenced'
                WHEN each.m = ANY(v_first) THEN 'run_changed'
                ELSE 'busy' END,
           v_xmins[array_position(v_settled, each.m)],
           v_taken[array_position(v_settled, each.m)]
      FROM generate_series(1, jsonb_array_length(p_hops)) AS each(m);
END
$function$
"""

DROP_SETTLE_HOPS_V3 = "DROP FUNCTION IF EXISTS waymark_settle_hops_v3(jsonb)"

DROP_SETTLE_HOPS_V1 = "DROP FUNCTION IF EXISTS waymark_settle_hops_v1(jsonb)"

# Going back installs v1 again, as the migration that created it did.
SETTLE_HOPS_V1 = import_module("workflows.migrations.0016_settle_hops_function").SETTLE_HOPS_V1


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0017_settle_hops_by_key"),
    ]

    operations = [
        migrations.RunSQL(SETTLE_HOPS_V3, reverse_sql=DROP_SETTLE_HOPS_V3),
        migrations.RunSQL(DROP_SETTLE_HOPS_V1, reverse_sql=SETTLE_HOPS_V1),
    ]
