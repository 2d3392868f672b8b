"""Every SQL statement of the effect ledger and the connections' gates, kept together.

Each state change is a guarded UPDATE whose WHERE clause names the allowed source states
(``effects/states.py``) and, for an attempt's own writes, its owner token; callers check the
row count. Time is the database's now(). JSON columns are selected cast to ``json`` (Django's
psycopg setup leaves ``jsonb`` as text). Lock order: a connection's row, then an effect's.
"""

from __future__ import annotations

# The connection a call goes through, locked for the gate (its concurrency cap and its
# circuit breaker are decided under this lock, so two workers cannot both take the last
# slot or both be the half-open probe).
LOCK_CONNECTION = """
SELECT c.id, c.status, c.broken_reason, c.circuit, c.circuit_until,
       c.circuit_until > now() AS circuit_waiting,
       GREATEST(0, EXTRACT(EPOCH FROM c.circuit_until - now()))::float AS circuit_seconds,
       c.consecutive_failures, c.max_concurrency,
       (SELECT count(*) FROM effects_effect e
         WHERE e.connection_id = c.id AND e.state = 'in_flight'
           AND e.lease_until > now()) AS in_flight,
       (SELECT GREATEST(0, EXTRACT(EPOCH FROM min(e.lease_until) - now()))::float
          FROM effects_effect e
         WHERE e.connection_id = c.id AND e.state = 'in_flight'
           AND e.lease_until > now()) AS first_free_seconds
  FROM effects_connection c
 WHERE c.id = %(connection_id)s
   FOR NO KEY UPDATE
"""

# The same lock alone, where nothing is gated (recording how a call ended): the lock order
# without counting what is in flight.
LOCK_CONNECTION_ROW = """
SELECT id FROM effects_connection WHERE id = %(connection_id)s FOR NO KEY UPDATE
"""

# The circuit's cool-down has passed: this call is the one probe (half-open).
CIRCUIT_PROBE = """
UPDATE effects_connection
   SET circuit = 'half_open', circuit_until = now() + make_interval(secs => %(lease)s)
 WHERE id = %(connection_id)s
"""

# After a call: a success closes the circuit; a failure that says the provider is unwell
# counts, and opens it at the threshold (at once when it was the half-open probe).
CIRCUIT_SUCCESS = """
UPDATE effects_connection
   SET circuit = 'closed', circuit_until = NULL, consecutive_failures = 0
 WHERE id = %(connection_id)s AND (circuit <> 'closed' OR consecutive_failures > 0)
"""

CIRCUIT_FAILURE = """
UPDATE effects_connection
   SET consecutive_failures = consecutive_failures + 1,
       circuit = CASE WHEN circuit = 'half_open'
                        OR consecutive_failures + 1 >= %(threshold)s
                      THEN 'open' ELSE circuit END,
       circuit_until = CASE WHEN circuit = 'half_open'
                              OR consecutive_failures + 1 >= %(threshold)s
                            THEN now() + make_interval(secs => %(cooldown)s)
                            ELSE circuit_until END
 WHERE id = %(connection_id)s
RETURNING circuit
"""

# An authorisation failure: nothing retries against the connection until it is repaired.
CONNECTION_BROKEN = """
UPDATE effects_connection
   SET status = 'broken', broken_reason = %(reason)s, broken_at = now(), updated_at = now()
 WHERE id = %(connection_id)s AND status = 'ok' AND secret_version = %(secret_version)s
"""

_EFFECT_COLUMNS = """
       id, org_id, run_id, step_id, iteration, key, provider, connection_id, state, token,
       owner, step_attempt, lease_until, lease_until <= now() AS lease_lapsed,
       GREATEST(0, EXTRACT(EPOCH FROM lease_until - now()))::float AS lease_seconds_left,
       calls, first_attempt_at, external_key, resolution, lookup_failures,
       EXTRACT(EPOCH FROM now() - first_attempt_at)::float AS age_seconds,
       EXTRACT(EPOCH FROM now() - last_attempt_at)::float AS since_last_call,
       result::json AS result, last_response::json AS last_response, error, reserved_cost
"""

# The effect under a key, locked: what the attempt does next depends on its state.
LOCK_EFFECT = (
    "SELECT"
    + _EFFECT_COLUMNS
    + """
  FROM effects_effect
 WHERE org_id = %(org_id)s AND key = %(key)s
   FOR UPDATE
"""
)

# The first attempt at an effect: claimed in flight, under its own lease, before the call.
INSERT_IN_FLIGHT = (
    """
INSERT INTO effects_effect
    (org_id, run_id, step_id, iteration, key, external_key, provider, connection_id, state,
     token, owner, step_attempt, lease_until, calls, first_attempt_at, last_attempt_at,
     request, reserved_cost, error, resolved_by, resolution, lookup_failures, created_at,
     updated_at)
VALUES (%(org_id)s, %(run_id)s, %(step_id)s, %(iteration)s, %(key)s, %(external_key)s,
        %(provider)s, %(connection_id)s, 'in_flight', %(token)s, %(owner)s, %(step_attempt)s,
        now() + make_interval(secs => %(lease)s), 1, now(), now(), %(request)s,
        %(reserved_cost)s, '', '', '', 0, now(), now())
ON CONFLICT (org_id, key) DO NOTHING
RETURNING"""
    + _EFFECT_COLUMNS
)

# A later call under the same key (after a refusal, a reconciliation that found nothing,
# a lapse with a provider that honours the key, or a person's "retry with the same key").
BEGIN_AGAIN = (
    """
UPDATE effects_effect
   SET state = 'in_flight', token = %(token)s, owner = %(owner)s,
       step_attempt = %(step_attempt)s, lease_until = now() + make_interval(secs => %(lease)s),
       calls = calls + 1, last_attempt_at = now(), request = %(request)s,
       reserved_cost = %(reserved_cost)s, resolution = '', lookup_failures = 0,
       updated_at = now()
 -- `calls` as read when the decision to call again was made: a call begun meanwhile by
 -- another attempt (which that decision did not see) refuses this one.
 WHERE id = %(id)s AND state = ANY(%(sources)s) AND calls = %(seen_calls)s
RETURNING"""
    + _EFFECT_COLUMNS
)

# The provider answered: the effect is made, and its answer is kept for every retry.
# Accepted from the attempt's own token, or after its lease lapsed (outcome_unknown), or
# after a person chose "retry" that is not yet begun (failed, resolution 'retry': the token
# is still this call's; BEGIN_AGAIN replaces it): the answer is a fact, and it settles the
# uncertainty. A person's retry so overtaken is not sent, and the effect says so.
SETTLE = """
WITH before AS (SELECT id, state FROM effects_effect WHERE id = %(id)s FOR UPDATE)
UPDATE effects_effect e
   SET state = 'settled', result = %(result)s, last_response = %(response)s,
       cost = %(cost)s, reserved_cost = 0, lease_until = NULL, updated_at = now(),
       error = CASE WHEN before.state = 'failed' THEN %(overtaken)s ELSE e.error END
  FROM before
 WHERE e.id = before.id AND e.token = %(token)s AND e.state = ANY(%(sources)s)
   AND (e.state <> 'failed' OR e.resolution = 'retry')
RETURNING e.id, before.state AS was
"""

# An answer that came too late to settle its effect: how many calls have begun since (a
# retry sent?) and who moved it, to tell the person.
# (settled_by_this_call: settled under this call's token by no person and no lookup: a try
# of its own whose commit was not acknowledged.)
EFFECT_CALLS = """
SELECT state, calls, resolved_by,
       state = 'settled' AND token = %(token)s AND resolved_by = '' AS settled_by_this_call
  FROM effects_effect WHERE id = %(id)s
"""

# Reconciled, or resolved by a person: settled with what was found (no token: nobody owns
# the call any more). Also a person's retry not yet begun, when a lookup finds the call it
# was to repeat made (see SETTLE).
SETTLE_FOUND = """
UPDATE effects_effect
   SET state = 'settled', result = %(result)s, reserved_cost = 0, lease_until = NULL,
       resolved_by = %(by)s, updated_at = now(),
       error = CASE WHEN state = 'failed' THEN %(overtaken)s ELSE error END
 WHERE id = %(id)s AND state = ANY(%(sources)s)
   AND (state <> 'failed' OR resolution = 'retry')
RETURNING id
"""

# The call's attempt ends without an answer that settles it: outcome_unknown (it may have
# been made) or failed (the provider refused: nothing was made).
END_ATTEMPT = """
UPDATE effects_effect
   SET state = %(state)s, error = %(error)s, last_response = %(response)s,
       lease_until = NULL, updated_at = now(),
       reserved_cost = CASE WHEN %(state)s = 'failed' THEN 0 ELSE reserved_cost END
 WHERE id = %(id)s AND token = %(token)s AND state = ANY(%(sources)s)
RETURNING id
"""

# A call still under way keeps its effect's lease (the caller's side thread renews it): a
# slow provider is not mistaken for a dead attempt.
EXTEND_LEASE = """
UPDATE effects_effect SET lease_until = now() + make_interval(secs => %(lease)s)
 WHERE id = %(id)s AND token = %(token)s AND state = 'in_flight'
"""

# A lookup that could not tell (the provider failed): counted; past a few, a person decides.
LOOKUP_FAILED = """
UPDATE effects_effect SET lookup_failures = lookup_failures + 1, updated_at = now()
 WHERE id = %(id)s AND state = 'outcome_unknown'
RETURNING lookup_failures
"""

# Another attempt's lease lapsed while its call may have been under way.
LAPSED_TO_UNKNOWN = """
UPDATE effects_effect
   SET state = 'outcome_unknown', lease_until = NULL, updated_at = now(),
       error = 'the attempt holding this effect stopped before it recorded an answer '
               '(its lease lapsed): the call may have been made'
 WHERE id = %(id)s AND state = 'in_flight' AND lease_until <= now()
RETURNING id
"""

# In flight, its lease lapsed over a minute ago, and its step no longer lives (the run was
# cancelled, failed or moved on while the attempt calling died): no attempt of the step will
# come to reconcile it. Marked outcome_unknown here, then parked for a person (TO_REVIEW) in
# the same transaction (effects/resolve.py park_orphaned_calls). The token stays: an answer
# that still arrives settles it.
ORPHANED_TO_UNKNOWN = """
UPDATE effects_effect e
   SET state = 'outcome_unknown', lease_until = NULL, updated_at = now()
 WHERE e.id IN (SELECT o.id FROM effects_effect o
                 WHERE o.state = 'in_flight'
                   AND o.lease_until < now() - make_interval(secs => %(after)s)
                   AND NOT EXISTS (
                       SELECT 1 FROM workflows_step s
                        WHERE s.run_id = o.run_id AND s.step_id = o.step_id
                          AND s.iteration = o.iteration
                          AND s.status IN ('ready', 'running', 'waiting'))
                 ORDER BY o.lease_until
                 LIMIT %(limit)s
                   FOR UPDATE SKIP LOCKED)
RETURNING e.id, e.org_id, e.run_id, e.step_id, e.iteration, e.key
"""

# Nobody can tell whether the call was made, and repeating it is not safe: a person decides.
TO_REVIEW = """
UPDATE effects_effect
   SET state = 'needs_review', error = %(error)s, updated_at = now()
 WHERE id = %(id)s AND state = ANY(%(sources)s)
RETURNING id
"""

# The last event that moved an effect out of review (or settled it), from its run's history
# (event_run_order): who won, for a resolution that came too late.
EFFECT_LAST_MOVE = """
SELECT kind, worker, detail::json AS detail
  FROM workflows_runevent
 WHERE run_id = %(run_id)s AND detail->>'key' = %(key)s
   AND kind IN ('effect.resolved', 'effect.settled', 'effect.reconciled')
 ORDER BY id DESC
 LIMIT 1
"""

# A person fails the effect (and so its step).
FAIL_REVIEWED = """
UPDATE effects_effect
   SET state = 'failed', error = %(error)s, resolved_by = %(by)s, resolution = %(resolution)s,
       reserved_cost = 0, updated_at = now()
 WHERE id = %(id)s AND state = ANY(%(sources)s)
RETURNING id
"""

# Model budgets: reserve the step's allowed cost before the call, only while the limit holds;
# settle the real cost after (releasing the reservation).
RESERVE_BUDGET = """
UPDATE effects_modelbudget
   SET reserved = reserved + %(amount)s, updated_at = now()
 WHERE org_id = %(org_id)s AND spent + reserved + %(amount)s <= "limit"
   -- nothing to reserve (a call with no stated budget): some budget must still be left
   AND (%(amount)s > 0 OR spent + reserved < "limit")
RETURNING id
"""

BUDGET = """
SELECT spent, reserved, "limit", spent >= "limit" AS spent_out
  FROM effects_modelbudget WHERE org_id = %(org_id)s
"""

SETTLE_BUDGET = """
UPDATE effects_modelbudget
   SET reserved = GREATEST(0, reserved - %(reserved)s), spent = spent + %(spent)s,
       updated_at = now()
 WHERE org_id = %(org_id)s
"""

# A park's look at what it waits for once it has committed (Park.woken_after_park): share-
# locked, so it conflicts with the waker's lock (the repair's UPDATE of the connection,
# LOCK_BUDGET of a budget raised). Either the waker's PARKED_ON runs after this read, and so
# after the park's commit, and finds the step; or this read waits for the waker's commit and
# sees the repair or the raise. A plain read could miss both: the waker's PARKED_ON taken
# before the park's commit, and this read before the waker's commit.
CONNECTION_STATUS_SHARED = """
SELECT name, status FROM effects_connection WHERE id = %(connection_id)s FOR SHARE
"""

BUDGET_SHARED = """
SELECT spent, "limit" FROM effects_modelbudget WHERE org_id = %(org_id)s FOR SHARE
"""

# A budget raised: its row locked before the parked steps are looked for (see above).
LOCK_BUDGET = """
SELECT id FROM effects_modelbudget WHERE org_id = %(org_id)s FOR NO KEY UPDATE
"""

# Steps parked on a connection (broken) or a budget (exhausted), to wake when repaired.
PARKED_ON = """
SELECT id FROM workflows_step
 WHERE org_id = %(org_id)s AND status = 'waiting' AND wait_kind = 'external'
   AND wait_detail->>'parked_on' = %(parked_on)s
 ORDER BY id
"""

SUPPRESSED = """
SELECT reason FROM effects_suppression
 WHERE org_id = %(org_id)s AND address IN (%(address)s, %(erased)s)
   AND channel IN (%(channel)s, 'any')
 LIMIT 1
"""

# Reservations whose effect can no longer settle them (its run ended: cancelled, failed,
# purged) are released, and each budget's `reserved` is made the sum of what its effects
# hold. Run by the sweep now and then: a crash between two writes cannot leak budget.
RELEASE_ORPHAN_RESERVATIONS = """
UPDATE effects_effect e SET reserved_cost = 0, updated_at = now()
  FROM workflows_run r
 WHERE e.reserved_cost > 0 AND r.id = e.run_id
   AND r.status NOT IN ('running', 'paused')
"""

RECOUNT_RESERVED = """
UPDATE effects_modelbudget b
   SET reserved = coalesce((SELECT sum(e.reserved_cost) FROM effects_effect e
                             WHERE e.org_id = b.org_id AND e.reserved_cost > 0), 0)
 WHERE b.reserved <> coalesce((SELECT sum(e.reserved_cost) FROM effects_effect e
                                WHERE e.org_id = b.org_id AND e.reserved_cost > 0), 0)
"""

# --- connection checks (effects/checks.py) -----------------------------------------------
# A check's lease on its connection, taken in a short transaction of its own and never held
# across the probe. The organisation's checks are counted under a transaction-scoped
# advisory lock (one key per organisation), taken by a statement of its own: the UPDATE's
# snapshot then sees every lease committed before the lock was granted, so two checks
# cannot both take the organisation's last slot.
CHECK_ORG_LOCK = """
SELECT pg_advisory_xact_lock(hashtextextended('waymark.connection_checks', %(org_id)s))
"""

CHECK_BEGIN = """
UPDATE effects_connection c
   SET check_token = %(token)s, check_until = now() + make_interval(secs => %(lease)s)
 WHERE c.id = %(connection_id)s
   AND (c.check_until IS NULL OR c.check_until <= now())
   AND (SELECT count(*) FROM effects_connection o
         WHERE o.org_id = c.org_id AND o.check_until > now()) < %(per_org)s
RETURNING c.id
"""

# Why CHECK_BEGIN took nothing: this connection's own check is in flight (else the
# organisation's slots are taken; no row: the connection is gone).
CHECK_HELD = """
SELECT check_until IS NOT NULL AND check_until > now() FROM effects_connection
 WHERE id = %(connection_id)s
"""

# Only the holder's own lease: one that lapsed and was taken by another check stays.
CHECK_END = """
UPDATE effects_connection SET check_token = '', check_until = NULL
 WHERE id = %(connection_id)s AND check_token = %(token)s
"""

# --- health checks (effects/health.py) ---------------------------------------------------

# Effects in flight whose lease lapsed more than %(late)s seconds ago (or that have none): the
# attempt that claimed them stopped without recording an answer, and no attempt of their step
# has looked since (the next one makes them outcome_unknown and reconciles). From the
# effect_in_flight index (in-flight effects only), with their step's state.
LAPSED_IN_FLIGHT = """
WITH lapsed AS (
    SELECT id, org_id, run_id, step_id, iteration, provider, owner, lease_until
      FROM effects_effect
     WHERE state = 'in_flight'
       AND (lease_until IS NULL OR lease_until < now() - make_interval(secs => %(late)s))
       AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))
     ORDER BY lease_until NULLS FIRST
     LIMIT %(cap)s
)
SELECT (SELECT count(*) FROM lapsed) AS total, l.id, l.org_id, l.run_id, l.step_id,
       l.iteration, l.provider, l.owner,
       EXTRACT(EPOCH FROM now() - l.lease_until)::float AS lapsed_seconds,
       s.status AS step_status
  FROM (SELECT * FROM lapsed ORDER BY lease_until NULLS FIRST LIMIT %(examples)s) l
  LEFT JOIN workflows_step s
         ON s.run_id = l.run_id AND s.step_id = l.step_id AND s.iteration = l.iteration
 ORDER BY l.lease_until NULLS FIRST
"""

# --- scrape-time gauges (effects/metrics.py) ------------------------------------------------------

# Effects by state, all but settled: settled is the ledger's history, growing with every call
# made (until its runs' retention), and is never counted. From effect_org_state (PostgreSQL 18
# skips through its leading org column; index-only once vacuumed).
METRICS_EFFECTS = """
SELECT state, count(*) AS effects
  FROM effects_effect
 WHERE state IN ('in_flight', 'outcome_unknown', 'needs_review', 'failed')
 GROUP BY state
"""

# Connections whose circuit is not closed, or that are broken, by provider: a small table
# (an organisation's connections), read whole.
METRICS_CONNECTIONS = """
SELECT provider,
       count(*) FILTER (WHERE circuit = 'open') AS open,
       count(*) FILTER (WHERE circuit = 'half_open') AS half_open,
       count(*) FILTER (WHERE status = 'broken') AS broken
  FROM effects_connection
 WHERE circuit <> 'closed' OR status = 'broken'
 GROUP BY provider
"""

# A migration between versions renamed the step (workflows.plugins.StepRename): its effects
# follow it, their ledger keys too (``run/step/iteration``, with a suffix after a slash for a
# step's further effects), so the step, run again, finds what it already did instead of doing
# it again. What providers were sent (external_key) stays as sent: it is what they know the
# effect by. Compared with left(), never LIKE: an underscore in a step id is not a wildcard.
RENAME_EFFECTS = """
UPDATE effects_effect
   SET step_id = %(new_step_id)s, iteration = %(new_iteration)s,
       key = %(new_key)s || substr(key, length(%(old_key)s) + 1), updated_at = now()
 WHERE org_id = %(org)s AND run_id = %(run)s AND step_id = %(step_id)s
   AND iteration = %(iteration)s
   AND (key = %(old_key)s OR left(key, length(%(old_key)s) + 1) = %(old_key)s || '/')
"""

# Re-run from a step (workflows' services/rerun.py, through the door): the run's settled
# effects, each a step execution's own (its key is run/step/iteration), by step and iteration.
SETTLED_EFFECTS_OF_RUN = """
SELECT step_id, iteration, key, provider FROM effects_effect
 WHERE org_id = %(org)s AND run_id = %(run)s AND state = 'settled'
   AND key = run_id || '/' || step_id || '/' || iteration
 ORDER BY step_id, iteration
"""

# The settled effect a re-run's new entry of a step takes instead of calling (the run's
# rerun_reuse: step id -> new iteration -> the old key); no row: the step calls as usual.
# Read only for an effect key with no row of its own, of an iteration past the first.
# A code run's step called inside branches has its effects listed by place too
# (rerun_reuse -> '~places' -> step id: [[place, old key or null], ...], in order): then the
# run's rows of the step since the re-run (rerun_floor) say which of them this entry takes
# (reruns.py), not its iteration.
REUSABLE_EFFECT = """
SELECT e.key, e.result::json AS result, r.rerun_reuse -> '~places' -> %(step_id)s AS places,
       r.rerun_floor AS floor
  FROM workflows_run r
  LEFT JOIN effects_effect e
    ON e.org_id = r.org_id AND e.key = r.rerun_reuse -> %(step_id)s ->> %(iteration)s
   AND e.state = 'settled'
 WHERE r.id = %(run_id)s AND r.rerun_reuse IS NOT NULL
"""

# A settled effect's stored answer, by key (a re-run's reuse by place).
SETTLED_RESULT = """
SELECT key, result::json AS result FROM effects_effect
 WHERE org_id = %(org_id)s AND key = %(key)s AND state = 'settled'
"""

# The rows a re-run entered of a step (after the run's rows when it was re-run), in order,
# each with its place and status.
STEP_ENTRIES_SINCE = """
SELECT id, iteration, status, fork_join_id, branch FROM workflows_step
 WHERE run_id = %(run_id)s AND step_id = %(step_id)s AND id > %(floor)s
 ORDER BY id
"""

# --- the ledger's fence ---------------------------------------------------------------------------

# An effect is claimed only by the step attempt that still runs (a run cancelled or a person
# erased since the attempt began must not have a call begun, or their data written back):
# share-locked, so a cancel or an erasure that holds the step waits for this claim to commit
# (and then finds its effect) or this claim waits for it (and finds the step no longer runs).
# Taken before the effect's row: the order an erasure takes them in (the step, then effects).
STEP_STILL_RUNS = """
SELECT id FROM workflows_step
 WHERE run_id = %(run_id)s AND step_id = %(step_id)s AND iteration = %(iteration)s
   AND attempt = %(attempt)s AND status = 'running'
   FOR SHARE
"""

# --- erasing a person (erasure.py) ----------------------------------------------------------------

EFFECTS_OF_RUNS = "org_id = %(org)s AND run_id = ANY(%(runs)s)"
SUPPRESSIONS_OF_ORG = "org_id = %(org)s"

# An effect in flight for a run whose person is erased: the attempt calling read their data,
# and its answer may hold it, so it can no longer record it (its token is gone); what became
# of the call is unknown, as after a lapsed lease (a run that finishes reconciles it).
FENCE_IN_FLIGHT = """
UPDATE effects_effect
   SET state = 'outcome_unknown', token = '', lease_until = NULL, updated_at = now(),
       error = 'the person was erased while this call was under way: the call may have been made'
 WHERE org_id = %(org)s AND run_id = ANY(%(runs)s) AND state = 'in_flight'
RETURNING id
"""

# An erased person's suppression entries: kept, as the keyed hash of the address.
SUPPRESSION_HASHED = """
SELECT id FROM effects_suppression
 WHERE org_id = %(org)s AND channel = %(channel)s AND address = %(hashed)s
"""
SUPPRESSION_REPLACE = "UPDATE effects_suppression SET address = %(hashed)s WHERE id = %(id)s"
SUPPRESSION_DROP = "DELETE FROM effects_suppression WHERE id = %(id)s"
SUPPRESSIONS_HOLDING = """
SELECT id, channel, address FROM effects_suppression
 WHERE org_id = %(org)s AND address ILIKE ANY(%(like)s)
 ORDER BY id FOR UPDATE
"""
