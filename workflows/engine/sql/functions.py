"""The engine's server-side functions, installed by migrations.

A shipped version is never edited: a change is a new version (``_v2``) with its own migration
(which installs it) and a switch of the statement in ``sql`` that calls it; the old version is
dropped by a later migration once no released engine calls it. The migration that installs a
version imports its text from here, so the text is written once.
"""

from __future__ import annotations

# A hop (see hops.py): one successful step's settle and the walk that follows it, written as
# one statement, when the walk was computed from the run as the worker last saw it. It
# writes only if the run is still that version of its row (``p_seen``: its xmin, which every
# UPDATE of the row changes) and still running, not past its max age, and the step's attempt
# is still the newest one running (fencing, as SETTLE_DONE). Then the writes are the slow
# settle's, in its order: the step done, the run's changes (merged, as UPDATE_RUN), the new
# steps, the ending of live steps when the run ended (as CANCEL_LIVE_STEPS_LOGGED), the events.
# It returns the outcome ('settled', 'run_changed': nothing was written, 'fenced': nothing
# was written), the run row's new xmin, and the id of the new step named ``p_taken_step``.
# Rows come as JSON arrays of objects keyed by column name; the times are seconds from now().
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

# Hops that finish together in one worker (group_settle.py): each exactly as
# waymark_settle_hop_v1 with its own parameters, in the order given, in the caller's one
# transaction. The runs are locked first, in id order (the one lock order), skipping any that
# another transaction holds: such a hop is answered 'busy' and writes nothing (its worker then
# settles it alone and waits for that lock there, not with the whole group). ``p_hops`` is a
# JSON array of objects keyed by SETTLE_HOP's parameter names; a missing key is SQL NULL (a
# JSON null is jsonb 'null'). Returns each hop's outcome with its position (``n``, from 1).
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


# As waymark_settle_hops_v1, but the runs are found by their primary key: v1's
# `id IN (SELECT ... FROM jsonb_array_elements(p_hops))` was planned as a hash semi join over
# a sequential scan of workflows_run, so a group's lock cost grew with every run in the table
# (1.1 ms a group at 3,000 runs). `id = ANY(ARRAY(...))` is an index condition.
SETTLE_HOPS_V2 = """
CREATE OR REPLACE FUNCTION waymark_settle_hops_v2(p_hops jsonb)
RETURNS TABLE (n integer, outcome text, run_xmin text, taken_id bigint)
LANGUAGE plpgsql AS $function$
DECLARE
    h jsonb;
    i integer := 0;
    v_locked bigint[];
BEGIN
    SELECT coalesce(array_agg(locked.id), '{}') INTO v_locked
      FROM (SELECT r.id FROM workflows_run r
             WHERE r.id = ANY(ARRAY(SELECT (e->>'id')::bigint
                                      FROM jsonb_array_elements(p_hops) e))
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

DROP_SETTLE_HOPS_V2 = "DROP FUNCTION IF EXISTS waymark_settle_hops_v2(jsonb)"
