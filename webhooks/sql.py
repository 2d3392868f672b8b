"""Every SQL statement of the webhooks app, and the trigger it puts on the engine's run history.

The trigger (``ENQUEUE_V2``) is here in its current text; the migration that installed it
carries its own frozen copy (tests/test_schema_functions.py holds the two equal).
"""

from __future__ import annotations

# Deliveries are written in the transaction of the event they report, whatever wrote the
# event: the engine's walk, its one-statement start, a hop or a group settle (server-side
# functions), run control, a decision. A row trigger on workflows_runevent does it, so the
# engine knows nothing of webhooks. Its WHEN clause lets through only the events a
# subscription can name (evaluated without calling the function: every other event costs
# nothing); for those, the organisation's active subscriptions are one probe of a partial
# index, and the event's data (the run's automation and version, the step, the event's
# detail) is read only when one of them wants it. A code run's turns (its ``code`` steps) are
# the engine's own: their step.failed is not one of the workflow's steps failing.
ENQUEUE_V2 = """
CREATE OR REPLACE FUNCTION webhooks_enqueue_v2() RETURNS trigger
LANGUAGE plpgsql AS $function$
DECLARE
    v_type text := CASE
        WHEN NEW.kind <> 'step.waiting' THEN NEW.kind
        WHEN NEW.detail ? 'approval' THEN 'approval.requested'
        ELSE 'task.requested' END;
    v_run jsonb;
    v_data jsonb;
BEGIN
    PERFORM 1 FROM webhooks_subscription s
     WHERE s.org_id = NEW.org_id AND s.active AND v_type = ANY(s.event_types);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF NEW.kind = 'step.failed' AND EXISTS (
        SELECT 1 FROM workflows_step st
         WHERE st.run_id = NEW.run_id AND st.step_id = NEW.step_id
           AND st.iteration = NEW.iteration AND st.type = 'code') THEN
        -- A code run's turn (workflows/code): the engine's own step, not one the workflow
        -- called; what failed it is the run's run.failed, or the called step's step.failed.
        RETURN NULL;
    END IF;
    SELECT jsonb_build_object('id', r.id, 'automation', a.slug, 'version', v.number,
                              'start_key', r.start_key)
      INTO v_run
      FROM workflows_run r
      JOIN workflows_automation a ON a.id = r.automation_id
      JOIN workflows_automationversion v ON v.id = r.version_id
     WHERE r.id = NEW.run_id;
    v_data := jsonb_build_object('run', v_run,
                                 'detail', COALESCE(NEW.detail, '{}'::jsonb) - 'version_id')
           || CASE WHEN NEW.step_id <> ''
                   THEN jsonb_build_object('step', jsonb_build_object(
                            'id', NEW.step_id, 'iteration', NEW.iteration,
                            'attempt', NEW.attempt))
                   ELSE '{}'::jsonb END;
    INSERT INTO webhooks_delivery (org_id, subscription_id, event_id, event_type, run_id,
                                   payload, occurred_at, status, attempts, next_at, token,
                                   last_error, last_response, created_at)
    SELECT NEW.org_id, s.id, NEW.id, v_type, NEW.run_id, v_data, NEW.at, 'pending', 0, now(),
           '', '', '', now()
      FROM webhooks_subscription s
     WHERE s.org_id = NEW.org_id AND s.active AND v_type = ANY(s.event_types);
    RETURN NULL;
END
$function$;

CREATE TRIGGER webhooks_enqueue
 AFTER INSERT ON workflows_runevent
 FOR EACH ROW WHEN (
     NEW.kind IN ('run.started', 'run.succeeded', 'run.failed', 'run.cancelled',
                  'run.compensated', 'step.failed', 'effect.needs_review')
     OR (NEW.kind = 'step.waiting' AND (NEW.detail ? 'approval' OR NEW.detail ? 'task')))
 EXECUTE FUNCTION webhooks_enqueue_v2();
"""

# --- sending (delivery.py) ---------------------------------------------------------------------

# Claims take turns (a transaction-scoped advisory lock), so each reads the deliveries in
# flight as the one before it left them and an organisation's cap holds across sweepers too
# (two may lead for a moment while the lead changes hands).
CLAIM_LOCK = "SELECT pg_advisory_xact_lock(hashtext('waymark.webhooks.claim'))"

# Up to %(free)s due deliveries, at most %(per_org)s in flight per organisation, fairly: the
# organisations with pending deliveries are walked from the one after %(after)s (a loose scan
# of webhook_pending: one probe per organisation, however many deliveries each holds), each
# takes what its cap leaves (its in-flight ones counted on webhook_in_flight), oldest due
# first. Taking one makes it in flight: a new owner token, one more attempt, and a lease; the
# lease is also its next_at, so a sender that dies leaves it to be taken again once the lease
# has lapsed (at least once: the endpoint dedupes by Waymark-Delivery-Id).
# One found with its %(max_attempts)s attempts already used (its last attempt left no outcome:
# the sender died or failed before recording it) is failed here instead of sent again, so no
# fault in the sending path can send a delivery past its attempts; it is not returned.
CLAIM = """
WITH RECURSIVE orgs(org_id, n) AS (
    (SELECT d.org_id, 1 FROM webhooks_delivery d
      WHERE d.status = 'pending' AND d.org_id > %(after)s
      ORDER BY d.org_id LIMIT 1)
    UNION ALL
    SELECT (SELECT d.org_id FROM webhooks_delivery d
             WHERE d.status = 'pending' AND d.org_id > orgs.org_id
             ORDER BY d.org_id LIMIT 1), orgs.n + 1
      FROM orgs
     WHERE orgs.org_id IS NOT NULL AND orgs.n < %(orgs)s
),
picked AS (
    SELECT due.id
      FROM orgs
     CROSS JOIN LATERAL (
           SELECT count(*) AS n FROM webhooks_delivery f
            WHERE f.org_id = orgs.org_id AND f.status = 'pending' AND f.lease_until > now()
     ) flying
     CROSS JOIN LATERAL (
           SELECT d.id FROM webhooks_delivery d
            WHERE d.org_id = orgs.org_id AND d.status = 'pending' AND d.next_at <= now()
            ORDER BY d.next_at
            LIMIT GREATEST(%(per_org)s - flying.n, 0)
              FOR UPDATE SKIP LOCKED
     ) due
     WHERE orgs.org_id IS NOT NULL
     LIMIT %(free)s
),
claimed AS (
    UPDATE webhooks_delivery d
       SET status = CASE WHEN d.attempts >= %(max_attempts)s THEN 'failed' ELSE 'pending' END,
           attempts = CASE WHEN d.attempts >= %(max_attempts)s THEN d.attempts
                           ELSE d.attempts + 1 END,
           token = %(token)s,
           lease_until = CASE WHEN d.attempts >= %(max_attempts)s THEN NULL
                              ELSE now() + make_interval(secs => %(lease)s) END,
           next_at = now() + make_interval(secs => %(lease)s),
           last_error = CASE WHEN d.attempts < %(max_attempts)s THEN d.last_error
                             ELSE 'attempts_used: the last of the ' || d.attempts
                                  || ' attempts ended without a recorded outcome' END
     WHERE d.id = ANY(ARRAY(SELECT id FROM picked)) AND d.status = 'pending'
    RETURNING d.id, d.org_id, d.subscription_id, d.event_id, d.event_type, d.payload,
              d.occurred_at, d.attempts, d.token, d.status
)
SELECT id, org_id, subscription_id, event_id, event_type, payload::json AS payload,
       occurred_at, attempts, token
  FROM claimed
 WHERE status = 'pending'
"""

SUBSCRIPTION = """
SELECT id, org_id, url, secret_encrypted, active FROM webhooks_subscription WHERE id = %(id)s
"""

# An attempt's outcome, written only by the attempt that holds the delivery (its token): one
# whose lease lapsed and was taken again writes nothing.
DELIVERED = """
UPDATE webhooks_delivery
   SET status = 'delivered', delivered_at = now(), lease_until = NULL, last_attempt_at = now(),
       last_status = %(status)s, last_error = '', last_response = %(response)s
 WHERE id = %(id)s AND token = %(token)s AND status = 'pending'
RETURNING id
"""

# Not delivered: again after %(delay)s seconds, or (%(final)s) failed for good.
NOT_DELIVERED = """
UPDATE webhooks_delivery
   SET status = CASE WHEN %(final)s THEN 'failed' ELSE 'pending' END,
       next_at = now() + make_interval(secs => %(delay)s), lease_until = NULL,
       last_attempt_at = now(), last_status = %(status)s, last_error = %(error)s,
       last_response = %(response)s
 WHERE id = %(id)s AND token = %(token)s AND status = 'pending'
RETURNING id
"""

# A person sends a failed delivery again (services.delivery_redeliver): a new series of
# attempts, under the same delivery id (the endpoint never acknowledged it).
REDELIVER = """
UPDATE webhooks_delivery
   SET status = 'pending', attempts = 0, next_at = now(), lease_until = NULL, token = ''
 WHERE id = %(id)s AND status = 'failed'
RETURNING id
"""

# Retention: finished deliveries created before the horizon, a batch at a time.
PURGE_FINISHED = """
DELETE FROM webhooks_delivery
 WHERE id = ANY(ARRAY(
       SELECT id FROM webhooks_delivery
        WHERE status <> 'pending' AND created_at < now() - make_interval(secs => %(age)s)
        ORDER BY created_at LIMIT %(batch)s))
"""

# --- the absence monitor (health.py) ------------------------------------------------------------

# Pending deliveries due more than %(late)s seconds ago and not in flight (an attempt in flight
# has its lease as next_at): the leading sweeper sends due ones within a poll interval, so
# these mean no sweeper leads, or its sender is stuck. From webhook_pending (PostgreSQL skips
# through its leading org column), counted up to %(cap)s, the oldest %(examples)s listed.
OVERDUE = """
WITH overdue AS (
    SELECT id, org_id, run_id, event_type, attempts, next_at
      FROM webhooks_delivery
     WHERE status = 'pending' AND next_at < now() - make_interval(secs => %(late)s)
       AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))
     ORDER BY next_at
     LIMIT %(cap)s
)
SELECT (SELECT count(*) FROM overdue) AS total, o.id, o.org_id, o.run_id, o.event_type,
       o.attempts, EXTRACT(EPOCH FROM now() - o.next_at)::float AS late_seconds
  FROM (SELECT * FROM overdue ORDER BY next_at LIMIT %(examples)s) o
 ORDER BY o.next_at
"""

# --- erasing a person (erasure.py): conditions for workflows.plugins.erasure.scrub_rows --------

DELIVERIES_OF_RUNS = "org_id = %(org)s AND run_id = ANY(%(runs)s)"
DELIVERIES_OF_ORG = "org_id = %(org)s"
