"""The engine's health checks' statements (``engine/absences.py``): read only, each bounded.

Each reads a partial index of the state it looks for (late wakes: ``step_wake_due``; lapsed
leases: ``step_leases``; ready steps: ``step_claimable``; unsent rows: ``outbox_unsent``;
pending signals: ``signal_pending_age``), so its cost follows the trouble, capped by
%(cap)s, not the size of the history. The one exception is ``STRANDED_RUNS``: whether a run
has a way forward is a question about every live run, so it reads the live steps (each
through its own partial index) and the live runs once; never the finished ones' steps.

Shared parameters: %(late)s seconds (how late is too late), %(examples)s rows shown,
%(cap)s (count up to it: one past COUNT_CAP), %(orgs)s (the organisations whose rows are
looked at, or NULL for all: folded away then, so the doctor's plans are unchanged).
"""

from __future__ import annotations

# --- runs with no durable way forward -------------------------------------------------------

# A live run (running or paused) moves on only through a live step that something will move:
# ready (a worker claims it), running (its worker settles it, or the suspects take it back
# when its lease lapses), waiting with a wake time (a retry's backoff, a deadline: the sweep
# fires it), parked for a pause while its run is paused (the resume unparks it), or waiting
# without a deadline on something that will come ({untimed_holds}, stranded_runs): a signal
# (a signal's arrival finds its waiter by the step_awaits_signal index) or what an app
# answers for (the apps' WaitAnswer expressions, by the prefix of wait_detail.parked_on). A
# join's waiting row moves
# only when its branches arrive, so it is no way forward of its own.
# The rest are stranded: nothing durable will ever move them. One statement, one snapshot:
# a run between two states is never seen half-moved.
_STRANDED_RUNS = """
WITH onward AS (
    SELECT run_id FROM workflows_step WHERE status = 'ready'
    UNION ALL
    SELECT run_id FROM workflows_step WHERE status = 'running'
    UNION ALL
    SELECT run_id FROM workflows_step WHERE status = 'waiting' AND wake_at IS NOT NULL
    UNION ALL
    SELECT s.run_id FROM workflows_step s
     WHERE s.status = 'waiting' AND s.wait_kind = 'external' AND s.wake_at IS NULL
       AND {untimed_holds}
    UNION ALL
    SELECT s.run_id FROM workflows_step s JOIN workflows_run r ON r.id = s.run_id
     WHERE s.status = 'waiting' AND s.wait_kind = 'paused' AND r.status = 'paused'
),
stranded AS (
    SELECT r.id, r.org_id, r.status FROM workflows_run r
     WHERE r.status IN ('running', 'paused')
       AND (%(orgs)s::bigint[] IS NULL OR r.org_id = ANY(%(orgs)s::bigint[]))
       AND NOT EXISTS (SELECT 1 FROM onward o WHERE o.run_id = r.id)
),
shown AS (SELECT * FROM stranded ORDER BY id LIMIT %(examples)s)
SELECT (SELECT count(*) FROM stranded) AS total, shown.id AS run_id, shown.org_id,
       shown.status,
       -- Its live steps, for the why: what each waits on.
       (SELECT coalesce(json_agg(json_build_object(
                   'step_id', s.step_id, 'iteration', s.iteration, 'status', s.status,
                   'wait_kind', s.wait_kind, 'parked_on', s.wait_detail->>'parked_on',
                   'type', s.type) ORDER BY s.id), '[]'::json)
          FROM workflows_step s
         WHERE s.run_id = shown.id AND s.status IN ('ready', 'running', 'waiting')) AS live
  FROM shown
 ORDER BY shown.id
"""

_SIGNAL_WAIT = "s.wait_detail->>'signal' IS NOT NULL"


def stranded_runs(answers: list[tuple[str, str]]) -> str:
    """The statement, with the apps' answers for the untimed waits they park steps on:
    (parked_on prefix, boolean SQL over ``s``). The prefixes are quoted here; the
    expressions are the apps' constant SQL. A wait no app answers for holds only when it
    is a signal's."""
    if not answers:
        return _STRANDED_RUNS.replace("{untimed_holds}", _SIGNAL_WAIT)
    cases = " ".join(f"WHEN {_literal(prefix)} THEN ({holds})" for prefix, holds in answers)
    holds = f"CASE split_part(s.wait_detail->>'parked_on', ':', 1) {cases} ELSE {_SIGNAL_WAIT} END"
    return _STRANDED_RUNS.replace("{untimed_holds}", holds)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# --- late wakes: the sweep is not firing ----------------------------------------------------

# Waiting steps whose wake time (a retry's backoff, a deadline) passed more than %(late)s ago:
# the sweep fires them within a tick, so these mean no sweeper leads, or it fails.
LATE_WAKES = """
WITH late AS (
    SELECT id, org_id, run_id, step_id, iteration, wait_kind, wake_at,
           wait_detail->>'parked_on' AS parked_on, wait_detail->>'signal' AS signal
      FROM workflows_step
     WHERE status = 'waiting' AND wake_at IS NOT NULL
       AND wake_at < now() - make_interval(secs => %(late)s)
       AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))
     ORDER BY wake_at
     LIMIT %(cap)s
)
SELECT (SELECT count(*) FROM late) AS total, l.org_id, l.run_id, l.step_id, l.iteration,
       l.wait_kind, l.parked_on, l.signal,
       EXTRACT(EPOCH FROM now() - l.wake_at)::float AS late_seconds
  FROM (SELECT * FROM late ORDER BY wake_at LIMIT %(examples)s) l
 ORDER BY l.wake_at
"""

# --- leases held by workers that are gone ---------------------------------------------------

# Running steps whose lease lapsed more than %(late)s ago: their worker died, hung or lost
# the database, and no worker of the lane (its suspects-only worker) has taken them back.
LAPSED_LEASES = """
WITH lapsed AS (
    SELECT id, org_id, run_id, step_id, iteration, lane, owner, attempt, lease_until
      FROM workflows_step
     WHERE status = 'running' AND lease_until < now() - make_interval(secs => %(late)s)
       AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))
     ORDER BY lease_until
     LIMIT %(cap)s
)
SELECT (SELECT count(*) FROM lapsed) AS total, l.org_id, l.run_id, l.step_id, l.iteration,
       l.lane, l.owner, l.attempt,
       EXTRACT(EPOCH FROM now() - l.lease_until)::float AS lapsed_seconds
  FROM (SELECT * FROM lapsed ORDER BY lease_until LIMIT %(examples)s) l
 ORDER BY l.lease_until
"""

# --- the oldest ready step of a lane ----------------------------------------------------------

# How long the lane's oldest claimable step has waited for a worker, and how many wait (up to
# %(cap)s). As the claim, the organisations with ready work are walked with a loose index
# scan (step_claimable: one probe each, whatever its backlog) and each one's oldest is read
# from its own range.
OLDEST_READY = """
WITH RECURSIVE orgs(org_id) AS (
    (SELECT org_id FROM workflows_step
      WHERE lane = %(lane)s AND status = 'ready'
        AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))
      ORDER BY org_id LIMIT 1)
    UNION ALL
    SELECT (SELECT s.org_id FROM workflows_step s
             WHERE s.lane = %(lane)s AND s.status = 'ready' AND s.org_id > orgs.org_id
               AND (%(orgs)s::bigint[] IS NULL OR s.org_id = ANY(%(orgs)s::bigint[]))
             ORDER BY s.org_id LIMIT 1)
      FROM orgs WHERE orgs.org_id IS NOT NULL
),
firsts AS (
    SELECT f.org_id, f.run_id, f.step_id, f.iteration, f.lease_until
      FROM orgs CROSS JOIN LATERAL (
           SELECT s.org_id, s.run_id, s.step_id, s.iteration, s.lease_until
             FROM workflows_step s
            WHERE s.lane = %(lane)s AND s.org_id = orgs.org_id AND s.status = 'ready'
              AND s.lease_until <= now()
            ORDER BY s.lease_until
            LIMIT 1) f
     WHERE orgs.org_id IS NOT NULL
)
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM workflows_step
             WHERE lane = %(lane)s AND status = 'ready' AND lease_until <= now()
               AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))
             LIMIT %(cap)s) ready) AS total,
       f.org_id, f.run_id, f.step_id, f.iteration,
       EXTRACT(EPOCH FROM now() - f.lease_until)::float AS waited_seconds
  FROM (SELECT 1) one
  LEFT JOIN (SELECT * FROM firsts ORDER BY lease_until LIMIT 1) f ON true
"""

# --- the outbox: rows nobody relays -----------------------------------------------------------

# Unsent rows older than %(late)s seconds (the relay sends within a poll interval: these mean
# it is down or failing), oldest first, from the outbox_unsent index.
UNSENT_OUTBOX = """
WITH old AS (
    SELECT id, org_id, topic, payload->>'run' AS run, created_at
      FROM workflows_outbox
     WHERE sent_at IS NULL AND created_at < now() - make_interval(secs => %(late)s)
       AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))
     ORDER BY id
     LIMIT %(cap)s
)
SELECT (SELECT count(*) FROM old) AS total, o.id, o.org_id, o.topic, o.run,
       EXTRACT(EPOCH FROM now() - o.created_at)::float AS age_seconds
  FROM (SELECT * FROM old ORDER BY id LIMIT %(examples)s) o
 ORDER BY o.id
"""

# --- signals -------------------------------------------------------------------------------------

# Pending signals older than %(late)s seconds that a waiting step matches: the sweep's late
# matching (sql.SIGNALS_MATCHED_LATE, every tick) should have delivered them. The same probes,
# from the waiting steps (step_awaits_signal) to the oldest such signal each one matches.
MATCHED_SIGNALS_PENDING = """
WITH missed AS (
    SELECT s.org_id, s.run_id, s.step_id, s.iteration, m.id AS signal_id, m.name,
           m.received_at
      FROM workflows_step s
     CROSS JOIN LATERAL (
           (SELECT k.id, k.name, k.received_at FROM workflows_signal k
             WHERE waymark_signal_keys_v1(k.org_id, k.name::text, k.correlation::text,
                                          k.correlations::text[])
                   @> ARRAY[s.org_id::text || '/' || (s.wait_detail->>'signal') || '/'
                            || (s.wait_detail->>'correlation')]
               AND k.consumed_at IS NULL AND k.dropped_at IS NULL AND k.run_id IS NULL
               AND k.received_at < now() - make_interval(secs => %(late)s)
             ORDER BY k.id + 0
             LIMIT 1)
           UNION ALL
           (SELECT k.id, k.name, k.received_at FROM workflows_signal k
             WHERE k.run_id = s.run_id AND k.name = s.wait_detail->>'signal'
               AND k.consumed_at IS NULL AND k.dropped_at IS NULL AND k.run_id IS NOT NULL
               AND k.received_at < now() - make_interval(secs => %(late)s)
             ORDER BY k.id
             LIMIT 1)
     ) m
     WHERE s.status = 'waiting' AND s.wait_kind = 'external'
       AND s.wait_detail->>'signal' IS NOT NULL
       AND (%(orgs)s::bigint[] IS NULL OR s.org_id = ANY(%(orgs)s::bigint[]))
     LIMIT %(cap)s
)
SELECT (SELECT count(*) FROM missed) AS total, m.org_id, m.run_id, m.step_id, m.iteration,
       m.signal_id, m.name, EXTRACT(EPOCH FROM now() - m.received_at)::float AS age_seconds
  FROM (SELECT * FROM missed ORDER BY received_at LIMIT %(examples)s) m
 ORDER BY m.received_at
"""

# Pending signals: nobody waits for them yet (a waiter takes one as it enters its wait). How
# many (up to %(cap)s) and how old the oldest is (signal_pending_age).
PENDING_SIGNALS = """
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM workflows_signal
             WHERE consumed_at IS NULL AND dropped_at IS NULL
               AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))
             LIMIT %(cap)s) pending) AS total,
       (SELECT EXTRACT(EPOCH FROM now() - min(received_at))::float FROM workflows_signal
         WHERE consumed_at IS NULL AND dropped_at IS NULL
           AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))) AS oldest_seconds
"""

# --- the sweep's leader -----------------------------------------------------------------------

SWEEP_LEADER = """
SELECT holder, EXTRACT(EPOCH FROM now() - lease_until)::float AS lapsed_seconds
  FROM workflows_sweeplease WHERE name = %(name)s
"""
