"""The engine's hot paths as few explicit SQL statements, kept together.

Claim, heartbeat, settle, release and the relay's batch. Every time comparison uses the
database's now(), never a worker's clock. Each statement here has a test that races it.

Django's psycopg setup loads ``jsonb`` columns as text (its JSONField decodes them itself), so
raw SQL here selects JSON columns cast to ``json``, which psycopg decodes.
"""

from __future__ import annotations

# Claim up to %(n)s claimable steps of one lane, fairly across organisations.
#
# `ahead` and `behind` walk the distinct organisations that have claimable work with a loose
# index scan (one index probe per organisation, whatever its backlog): first those after the
# organisation this worker served last, then, wrapping around, those up to it, at most n + 3
# of each, so a claim costs O(n) probes however many organisations wait, and who leads
# rotates. The 3 spare organisations keep a claim for one slot from coming back empty when
# the first organisation's rows are all locked by other claimers. Each organisation served
# gets at most ceil(n / organisations) of the batch: one organisation's 100,000 ready steps
# cannot crowd out another's few. The rows are
# locked in a CTE (FOR UPDATE SKIP LOCKED inside a LIMITed lateral subquery, never a LIMIT
# inside IN (...)) that feeds the UPDATE; the claim increments `attempt`, which is returned
# as the fencing token, and records the transition.
# It also returns what the step's templates read (the run's input, vars and outputs), so
# running a claimed step costs no further query.
CLAIM = """
WITH RECURSIVE ahead(org_id, depth) AS (
    (SELECT org_id, 1 FROM workflows_step
      WHERE lane = %(lane)s AND status IN ('ready', 'running') AND lease_until <= now()
        AND org_id > %(after_org)s
      ORDER BY org_id LIMIT 1)
    UNION ALL
    SELECT (SELECT s.org_id FROM workflows_step s
             WHERE s.lane = %(lane)s AND s.status IN ('ready', 'running')
               AND s.lease_until <= now() AND s.org_id > ahead.org_id
             ORDER BY s.org_id LIMIT 1),
           ahead.depth + 1
      FROM ahead WHERE ahead.org_id IS NOT NULL AND ahead.depth < %(n)s + 3
),
behind(org_id, depth) AS (
    (SELECT org_id, 1 FROM workflows_step
      WHERE lane = %(lane)s AND status IN ('ready', 'running') AND lease_until <= now()
        AND org_id <= %(after_org)s
      ORDER BY org_id LIMIT 1)
    UNION ALL
    SELECT (SELECT s.org_id FROM workflows_step s
             WHERE s.lane = %(lane)s AND s.status IN ('ready', 'running')
               AND s.lease_until <= now() AND s.org_id > behind.org_id
               AND s.org_id <= %(after_org)s
             ORDER BY s.org_id LIMIT 1),
           behind.depth + 1
      FROM behind WHERE behind.org_id IS NOT NULL AND behind.depth < %(n)s + 3
),
served AS (
    SELECT org_id, turn, count(*) OVER () AS k
      FROM (SELECT org_id, row_number() OVER (ORDER BY part, org_id) AS turn
              FROM (SELECT org_id, 0 AS part FROM ahead WHERE org_id IS NOT NULL
                    UNION ALL
                    SELECT org_id, 1 FROM behind WHERE org_id IS NOT NULL) found
             ORDER BY part, org_id
             LIMIT %(n)s + 3) first_n
),
locked AS (
    SELECT p.id, p.lease_until, served.org_id, served.turn
      FROM served
      CROSS JOIN LATERAL (
          SELECT s.id, s.lease_until
            FROM workflows_step s
           WHERE s.lane = %(lane)s AND s.org_id = served.org_id
             AND s.status IN ('ready', 'running') AND s.lease_until <= now()
           ORDER BY s.lease_until
           LIMIT ceil(%(n)s::numeric / served.k)::int
           FOR UPDATE SKIP LOCKED
      ) p
),
picked AS (
    SELECT id FROM (
        SELECT id, turn,
               row_number() OVER (PARTITION BY org_id ORDER BY lease_until) AS rank
          FROM locked
    ) ranked
     ORDER BY rank, turn
     LIMIT %(n)s
),
claimed AS (
    UPDATE workflows_step s
       SET status = 'running', owner = %(worker)s, attempt = s.attempt + 1,
           lease_until = now() + make_interval(secs => %(lease)s)
      FROM picked
     WHERE s.id = picked.id AND s.status IN ('ready', 'running')
 RETURNING s.id, s.org_id, s.run_id, s.step_id, s.iteration, s.type, s.attempt,
           s.released, s.max_attempts
),
logged AS (
    INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration, attempt, worker, at)
    SELECT org_id, run_id, 'step.claimed', step_id, iteration, attempt, %(worker)s, now()
      FROM claimed
)
SELECT c.id, c.org_id, c.run_id, c.step_id, c.iteration, c.type, c.attempt, c.released,
       c.max_attempts, r.version_id, r.input::json, r.vars::json, r.outputs::json, r.created_at,
       r.deadline_at <= now() AS run_expired
  FROM claimed c JOIN workflows_run r ON r.id = c.run_id
"""

# Extend the leases this worker still holds. A row that does not come back was lost (a newer
# attempt claimed it): the worker stops that step; its settle would be refused anyway.
HEARTBEAT = """
UPDATE workflows_step s
   SET lease_until = now() + make_interval(secs => %(lease)s)
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS held(id, attempt)
 WHERE s.id = held.id AND s.attempt = held.attempt AND s.status = 'running'
RETURNING s.id, s.attempt
"""

# Settle: only the newest attempt may write. No row: this attempt was fenced out.
SETTLE_DONE = """
UPDATE workflows_step
   SET status = 'done', output = %(output)s, owner = NULL, lease_until = NULL,
       finished_at = now()
 WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
RETURNING run_id
"""

SETTLE_FAILED = """
UPDATE workflows_step
   SET status = 'failed', error = %(error)s, owner = NULL, lease_until = NULL,
       finished_at = now()
 WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
RETURNING run_id
"""

# A failed attempt with attempts left: ready again after a jittered backoff.
SETTLE_RETRY = """
UPDATE workflows_step
   SET status = 'ready', error = %(error)s, owner = NULL,
       lease_until = now() + make_interval(secs => %(delay)s)
 WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
RETURNING run_id
"""

# Shutdown: hand steps back at once instead of letting their leases lapse. The hand-back does
# not count against max_attempts (`released`), so deploys cannot turn a step into poison.
RELEASE = """
UPDATE workflows_step s
   SET status = 'ready', owner = NULL, lease_until = now(), released = s.released + 1
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS held(id, attempt)
 WHERE s.id = held.id AND s.attempt = held.attempt AND s.status = 'running'
RETURNING s.id, s.org_id, s.run_id, s.step_id, s.iteration, s.attempt
"""

# FOR NO KEY UPDATE, not FOR UPDATE: inserting a step or an event checks its foreign key to
# the run with FOR KEY SHARE, which FOR UPDATE would block. A claim (step locked, then the
# event's key check on the run) against a settle (run locked, then its step) would deadlock.
# The walk never changes the run's key, so settles still serialise with each other.
LOCK_RUN = """
SELECT id, org_id, version_id, status, input::json, vars::json, outputs::json, entered::json,
       steps_executed, max_steps, deadline_at <= now() AS expired, created_at
  FROM workflows_run WHERE id = %(id)s FOR NO KEY UPDATE
"""

# The walk's one write to the run: its template data, budget and, when it ends, its outcome.
# The caller holds the row lock (LOCK_RUN); the status guard makes a finished run final.
UPDATE_RUN = """
UPDATE workflows_run
   SET vars = %(vars)s, outputs = %(outputs)s, entered = %(entered)s,
       steps_executed = %(steps)s, status = %(status)s, output = %(output)s, error = %(error)s,
       finished_at = CASE WHEN %(finished)s THEN now() ELSE NULL END
 WHERE id = %(id)s AND status = 'running'
"""

LIVE_STEPS = """
SELECT count(*) FROM workflows_step
 WHERE run_id = %(run)s AND status IN ('ready', 'running', 'waiting')
"""

# Relay: a batch of unsent intents, locked so two relays never take the same rows.
RELAY_BATCH = """
SELECT id, topic, payload::json FROM workflows_outbox
 WHERE sent_at IS NULL
 ORDER BY id
 LIMIT %(n)s
 FOR UPDATE SKIP LOCKED
"""

RELAY_MARK_SENT = "UPDATE workflows_outbox SET sent_at = now() WHERE id = ANY(%(ids)s)"

OUTBOX_CLEANUP = """
WITH old AS (
    SELECT id FROM workflows_outbox
     WHERE sent_at < now() - make_interval(secs => %(age)s)
     LIMIT %(batch)s
)
DELETE FROM workflows_outbox o USING old WHERE o.id = old.id
"""

# The last resort when the walk itself fails on a settled step (an engine bug, a step type
# missing in this process, an output that is not JSON): fail the step and its run without
# walking, so the step is not re-run until poisoned, and a person sees the error.
FAIL_STEP_AND_RUN = """
WITH step AS (
    UPDATE workflows_step
       SET status = 'failed', error = %(error)s, owner = NULL, lease_until = NULL,
           finished_at = now()
     WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
 RETURNING run_id
)
UPDATE workflows_run r
   SET status = 'failed', error = %(error)s, finished_at = now()
  FROM step
 WHERE r.id = step.run_id AND r.status = 'running'
RETURNING r.id
"""
