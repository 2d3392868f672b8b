"""The engine's server-side functions and triggers as the migrated database holds them now.

Each is here in its current text, and nothing else is: tests/test_schema_functions.py
installs these texts and fails unless the database the migrations built holds exactly the
same functions and triggers. A version that a migration has dropped is not here.

The migration that installs a version carries its own frozen copy of the text (a migration
must mean forever what it meant when it shipped, so it never imports this module). A shipped
version is never edited: a change is a new version (``_v2``) here, a migration that installs
it with its own copy, and a switch of the statement in ``sql`` that calls it; the old version
is dropped by a later migration once no released engine calls it, and leaves this module
then.
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


# Hops that finish together in one worker, as the previous release settles them (that
# release calls it; this one calls v3; a later migration drops it): each exactly as
# waymark_settle_hop_v1 with its own parameters, in the order given, in the caller's one
# transaction. The runs are locked first, in id order (the one lock order), by primary key
# (v1, installed by migration 0016 and dropped by 0018, found them by a sequential scan),
# skipping any that another transaction holds: such a hop is answered 'busy' and writes
# nothing (its worker then settles it alone and waits for that lock there, not with the
# whole group). ``p_hops`` is a JSON array of objects keyed by SETTLE_HOP's parameter names;
# a missing key is SQL NULL (a JSON null is jsonb 'null'). Returns each hop's outcome with
# its position (``n``, from 1).
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


# As waymark_settle_hops_v2, with each kind of write made once for the whole group rather
# than once per member: v2 called waymark_settle_hop_v1 per member, six statements each, and
# a statement's start and end in PL/pgSQL cost more than the rows it wrote (pg_stat_statements:
# 0.25 ms of server time a hop, of which the rows' writes were 0.16). The outcome of each
# member is v2's:
# - 'busy': its run is held by another transaction, or is an earlier member's run (v2 found it
#   changed, or settled it once that one was fenced or stale; alone, it is settled the same way);
# - 'run_changed': the run is no longer the version its walk saw, running, within its age;
# - 'fenced': its step's attempt is no longer the newest running one;
# - 'settled', the run row's new xmin and the id of its new step named taken_step.
# The writes are v2's, in its order per run: the steps done, the runs' changes, the new steps
# (in the order each walk gave them), the live steps of each ended run cancelled with their
# events, then the members' events in member order.
# Its statements are planned once per connection (force_generic_plan: a custom plan per call
# would cost more than the call) and never by sequential scan (enable_seqscan off): a plan
# made while the engine's tables are nearly empty, as after a deploy or a TRUNCATE, would
# otherwise scan the steps of every run to cancel one run's, for as long as the plan lives
# (0.5 ms a group at 8,000 steps, auto_explain). Every row they read is found by a key.
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


# The keys a signal answers, for the index the sweep's late matching probes
# (sql.SIGNALS_MATCHED_LATE, the signal_pending_keys index of migration 0020): one
# "<org>/<name>/<correlation>" per correlation it carries (its own and ``correlations``, the
# keys an email reply answers). A signal name has no "/", so a key names one wait exactly,
# and one organisation's signals are never met by another's waits. IMMUTABLE: an index
# expression.
SIGNAL_KEYS_V1 = """
CREATE OR REPLACE FUNCTION waymark_signal_keys_v1(
    p_org bigint, p_name text, p_correlation text, p_correlations text[]
) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $function$
    SELECT array_agg(DISTINCT p_org::text || '/' || p_name || '/' || c)
      FROM unnest(array_prepend(p_correlation, p_correlations)) AS c
$function$
"""

# Any UPDATE or DELETE of an automation version already published fails with SQLSTATE WM001,
# whatever issued it (a QuerySet.update(), raw SQL, psql): the database enforces what
# AutomationVersion.save() does. Publishing is the UPDATE that sets published_at on a draft,
# so it is allowed; nothing after it is. Installed by migration 0002, before the rule that
# names carry their version.
PUBLISHED_VERSION_IS_IMMUTABLE = """
CREATE OR REPLACE FUNCTION waymark_published_version_is_immutable() RETURNS trigger
LANGUAGE plpgsql AS $function$
BEGIN
    IF OLD.published_at IS NOT NULL THEN
        RAISE EXCEPTION 'automation version % (v%) is published and cannot change',
            OLD.id, OLD.number
            USING ERRCODE = 'WM001',
                  HINT = 'Create a new version instead.';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$function$;

CREATE TRIGGER published_version_is_immutable
BEFORE UPDATE OR DELETE ON workflows_automationversion
FOR EACH ROW EXECUTE FUNCTION waymark_published_version_is_immutable();
"""

# The audit log is append-only (models/audit.py): an UPDATE of an entry is refused, and so is
# a DELETE, whatever issued it (the ORM, raw SQL, psql), with SQLSTATE WM002. One exception,
# announced by the transaction itself (set_config(..., true): for that transaction only): the
# retention purge (services/audit.py::purge_audit) announces the instant before which entries
# may go, and deletes only those. A person's erasure changes no entry (entries keep who did
# what, and no person's data is written to them). TRUNCATE is a table owner's act, beyond a
# row trigger. Version 3 (migration 0030) took away version 2's erasure exception.
AUDIT_APPEND_ONLY_V3 = """
CREATE OR REPLACE FUNCTION waymark_audit_append_only_v3() RETURNS trigger
LANGUAGE plpgsql AS $function$
BEGIN
    IF TG_OP = 'DELETE'
       AND OLD.at < NULLIF(current_setting('waymark.audit_purge_before', true), '')::timestamptz
    THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit entry % is append-only: % refused', OLD.id, TG_OP
        USING ERRCODE = 'WM002',
              HINT = 'Audit entries are never changed; only the retention purge deletes them.';
END;
$function$;

CREATE TRIGGER audit_append_only
BEFORE UPDATE OR DELETE ON workflows_auditentry
FOR EACH ROW EXECUTE FUNCTION waymark_audit_append_only_v3();
"""

# A run ending (its finished_at set: succeeded, failed, cancelled, compensated), whatever
# ended it (a hop, a group settle, the walk, a batch of timers, run control): a caller
# waiting for it (services/run_waits.py, a RunWaiter row naming the run) is notified on the
# run's own channel (RUN_ENDED_CHANNEL_PREFIX and the run's id) with its row's id (a
# notification of an earlier ending of the run, before a re-run, is told apart), and the
# rows go (a waiter killed meanwhile leaves none behind). The trigger's WHEN is evaluated
# without calling the function, so only an ending runs it; without a waiter it notifies
# nobody, so the engine's ending transactions take no notification lock at commit.
RUN_ENDED_CHANNEL_PREFIX = "waymark_run_ended_"  # services/run_waits.py listens there

RUN_ENDED_NOTIFY = f"""
CREATE OR REPLACE FUNCTION waymark_run_ended_notify_v1() RETURNS trigger
LANGUAGE plpgsql AS $function$
BEGIN
    PERFORM pg_notify('{RUN_ENDED_CHANNEL_PREFIX}' || NEW.id, w.id::text)
       FROM workflows_runwaiter w WHERE w.run_id = NEW.id;
    IF FOUND THEN
        DELETE FROM workflows_runwaiter WHERE run_id = NEW.id;
    END IF;
    RETURN NULL;
END;
$function$;

CREATE TRIGGER run_ended_notify
AFTER UPDATE OF finished_at ON workflows_run
FOR EACH ROW WHEN (OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL)
EXECUTE FUNCTION waymark_run_ended_notify_v1();
"""  # noqa: S608 (a constant channel prefix)
