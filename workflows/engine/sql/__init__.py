"""Every SQL statement of the engine, kept together; ``rows`` builds and reads their rows.

Claim, heartbeat, settle, park, wake, release, run control, run start and the relay's batch.
Statements name every column they return (rows are read by name, ``rows.fetch_dicts``); the
rows the walk, the claim and the settles pass around are typed beside their statement, as
TypedDicts naming those columns (a caller casts the fetched dicts to one: no conversion).
Every time comparison uses the database's now(), never a worker's clock. Each statement here
has a test that races it.

Django's psycopg setup loads ``jsonb`` columns as text (its JSONField decodes them itself), so
raw SQL here selects JSON columns cast to ``json``, which psycopg decodes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, NotRequired, TypedDict

from .rows import LANE_CHANNEL_PREFIX

# psycopg parses a statement's text for its placeholders once and caches the result, but only
# for texts up to this long (psycopg/_queries.py MAX_CACHED_STATEMENT_LENGTH); a longer one is
# parsed again at every execution. tests/test_states.py holds every statement here under it.
PSYCOPG_CACHED_LENGTH = 4096


def _compact(statement: str) -> str:
    """The statement without its indentation, its alignment and its comment lines (the
    comments stay in this file's source), so that a long one stays under
    PSYCOPG_CACHED_LENGTH. Runs of spaces become one, and a comma takes none after it: no
    literal in these statements has two spaces or a comma."""
    lines = (" ".join(line.split()).replace(", ", ",") for line in statement.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


# The end of both claims: given `picked` (ids locked FOR UPDATE), take them for this worker
# (the fencing token grows), or park or cancel them when their run is paused or finished,
# and record each as a run event.
_CLAIMED = """
claimed AS (
    -- The run decides: a step of a paused run is parked instead of claimed (it becomes
    -- ready again on resume), and a step of a finished run is cancelled. A step whose
    -- worker died while its run was paused is caught here, the last gate before a worker.
    UPDATE workflows_step s
       SET status = CASE r.status WHEN 'running' THEN 'running'
                                  WHEN 'paused' THEN 'waiting' ELSE 'cancelled' END,
           owner = CASE WHEN r.status = 'running' THEN %(worker)s END,
           attempt = s.attempt + CASE WHEN r.status = 'running' THEN 1 ELSE 0 END,
           lease_until = CASE WHEN r.status = 'running'
                              THEN now() + make_interval(secs => %(lease)s) END,
           wait_kind = CASE WHEN r.status = 'paused' THEN 'paused' ELSE '' END,
           finished_at = CASE WHEN r.status IN ('running', 'paused') THEN NULL ELSE now() END
      FROM workflows_run r
     -- A primary-key lookup of the picked ids, always. The guard (ready or running) is
     -- written as an exclusion on purpose: an IN list would imply the step_claimable index's
     -- predicate, and with statistics that say few steps are claimable (stale after a burst)
     -- the planner scans that whole index to find the picked ids.
     WHERE s.id = ANY(ARRAY(SELECT id FROM picked)) AND r.id = s.run_id
       AND s.status NOT IN ('waiting', 'done', 'failed', 'cancelled')
       -- The run as it is now, not as this statement's snapshot had it: a run changed since
       -- (a migration between versions renamed the step and moved the run, say: the step's
       -- row is then read as it is now, the run's as it was) is not claimed from here, and
       -- its step stays ready for the next claim. Its lock is only tried (a walk holding the
       -- run: not claimed now either), so a claim never waits for a run while holding steps.
       AND r.xmin = (SELECT xmin FROM workflows_run WHERE id = r.id FOR SHARE SKIP LOCKED)
 RETURNING s.id, s.org_id, s.run_id, s.step_id, s.iteration, s.type, s.lane, s.status,
           s.attempt, s.attempt - s.release_count - s.series_offset AS attempts_used,
           s.max_attempts, s.wait_detail::json AS wait_detail, s.fork_join_id, s.branch,
           r.version_id,
           r.input::json AS run_input, r.vars::json AS run_vars,
           r.outputs::json AS run_outputs, r.created_at AS run_created_at,
           r.deadline_at <= now() AS run_expired,
           -- What a hop's walk starts from (hops.py): the run's row as of the claim.
           r.entered::json AS run_entered, r.steps_executed AS run_steps_executed,
           r.max_steps AS run_max_steps, r.xmin::text AS run_seen,
           -- The start's span (engine/tracing.py): the attempt's span is its child.
           r.trace_context
),
logged AS (
    INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration, attempt, worker, at)
    SELECT org_id, run_id,
           CASE status WHEN 'running' THEN 'step.claimed' WHEN 'waiting' THEN 'step.parked'
                       ELSE 'step.cancelled' END,
           step_id, iteration, attempt, %(worker)s, now()
      FROM claimed
)
SELECT * FROM claimed WHERE status = 'running'
"""


class ClaimedRow(TypedDict):
    """A claimed step, as the claims return it (CLAIM, CLAIM_SUSPECT, CLAIM_AFTER_HOPS):
    claimed.ClaimedStep is built from it."""

    id: int
    org_id: int
    run_id: int
    step_id: str
    iteration: int
    type: str
    lane: str
    status: str
    attempt: int
    attempts_used: int
    max_attempts: int
    # Free-form: what the step parked with (its executor's detail), plus the engine's keys
    # (a wake's woken_with, a continuation's enter).
    wait_detail: dict[str, Any] | None
    fork_join_id: int | None
    branch: int | None
    version_id: int
    # The run's template data (free-form JSON: the start's input, what its steps wrote).
    run_input: Any
    run_vars: dict[str, Any]
    run_outputs: dict[str, Any]
    run_created_at: datetime
    run_expired: bool
    run_entered: dict[str, int]
    run_steps_executed: int
    run_max_steps: int
    run_seen: str
    trace_context: str | None  # the run's start span (W3C traceparent); None: untraced


# Claim up to %(n)s claimable steps of one lane, fairly across organisations.
#
# Only ready steps: a step whose lease lapsed is a suspect (CLAIM_SUSPECT).
#
# `ahead` and `behind` walk the distinct organisations that have claimable work with a loose
# index scan (one index probe per organisation, whatever its backlog): first those after the
# organisation this worker served last, then, wrapping around, those up to it, at most n + 3
# of each, so a claim costs O(n) probes however many organisations wait, and who leads
# rotates: %(orgs)s of them, n and 3 spare ones, which keep a claim for one slot from coming
# back empty when the first organisation's rows are all locked by other claimers, and one
# more per organisation the worker holds steps of, which may be owed nothing (see below). Each
# organisation served gets at most ceil(n / organisations) of the batch: one organisation's
# 100,000 ready steps cannot crowd out another's few. Nor can it hold the claiming worker's
# slots (lanes.FairShare, from the worker's holdings in %(held_orgs)s and %(held_counts)s): an
# organisation is owed %(share)s slots less those it holds, `owed` rows are taken first, and
# rows past an organisation's due (`borrowed`) fill at most %(borrowable)s slots less the
# owed ones taken, round-robin, so the reserve stays free for an organisation whose work
# comes later. The rows are
# locked in a CTE (FOR UPDATE SKIP LOCKED inside a LIMITed lateral subquery, never a LIMIT
# inside IN (...)) that feeds the UPDATE; the claim increments `attempt`, which is returned
# as the fencing token, and records the transition.
# It also returns what the step's templates read (the run's input, vars and outputs), so
# running a claimed step costs no further query.
CLAIM = (
    """
WITH RECURSIVE ahead(org_id, depth) AS (
    (SELECT org_id, 1 FROM workflows_step
      WHERE lane = %(lane)s AND status = 'ready' AND lease_until <= now()
        AND org_id > %(after_org)s
      ORDER BY org_id LIMIT 1)
    UNION ALL
    SELECT (SELECT s.org_id FROM workflows_step s
             WHERE s.lane = %(lane)s AND s.status = 'ready'
               AND s.lease_until <= now() AND s.org_id > ahead.org_id
             ORDER BY s.org_id LIMIT 1),
           ahead.depth + 1
      FROM ahead WHERE ahead.org_id IS NOT NULL AND ahead.depth < %(orgs)s::int
),
behind(org_id, depth) AS (
    (SELECT org_id, 1 FROM workflows_step
      WHERE lane = %(lane)s AND status = 'ready' AND lease_until <= now()
        AND org_id <= %(after_org)s
      ORDER BY org_id LIMIT 1)
    UNION ALL
    SELECT (SELECT s.org_id FROM workflows_step s
             WHERE s.lane = %(lane)s AND s.status = 'ready'
               AND s.lease_until <= now() AND s.org_id > behind.org_id
               AND s.org_id <= %(after_org)s
             ORDER BY s.org_id LIMIT 1),
           behind.depth + 1
      FROM behind WHERE behind.org_id IS NOT NULL AND behind.depth < %(orgs)s::int
),
owed AS (
    SELECT org_id, turn, greatest(%(share)s::int - coalesce(h.n, 0), 0) AS owed
      FROM (SELECT org_id, row_number() OVER (ORDER BY part, org_id) AS turn
              FROM (SELECT org_id, 0 AS part FROM ahead WHERE org_id IS NOT NULL
                    UNION ALL
                    SELECT org_id, 1 FROM behind WHERE org_id IS NOT NULL) found
             ORDER BY part, org_id
             LIMIT %(orgs)s::int) first_n
      LEFT JOIN unnest(%(held_orgs)s::bigint[], %(held_counts)s::int[]) h(org_id, n)
     USING (org_id)
),
served AS (
    SELECT org_id, turn, owed, count(*) OVER () AS k
      FROM owed WHERE owed + %(borrowable)s::int > 0
),
-- `rank`: the row's place in its organisation's turn; past `owed`, it is borrowed.
locked AS (
    SELECT p.id, v.turn, v.owed,
           row_number() OVER (PARTITION BY v.org_id ORDER BY p.lease_until) AS rank
      FROM served v
      CROSS JOIN LATERAL (
          SELECT s.id, s.lease_until
            FROM workflows_step s
           WHERE s.lane = %(lane)s AND s.org_id = v.org_id
             AND s.status = 'ready' AND s.lease_until <= now()
           ORDER BY s.lease_until
           LIMIT least(ceil(%(n)s::numeric / v.k)::int, v.owed + %(borrowable)s)
           FOR UPDATE SKIP LOCKED
      ) p
),
picked AS (
    SELECT id FROM (
        SELECT id, turn, rank, rank > owed AS borrowed,
               row_number() OVER (PARTITION BY rank > owed ORDER BY rank, turn) AS place,
               count(*) FILTER (WHERE rank <= owed) OVER () AS owed_taken
          FROM locked
    ) placed
     WHERE NOT borrowed OR place <= %(borrowable)s - owed_taken
     ORDER BY borrowed, rank, turn
     LIMIT %(n)s
),
"""  # noqa: S608 (constant SQL joined with constant SQL)
    + _CLAIMED
)
CLAIM = _compact(CLAIM)

# CLAIM, sent with hops that end runs (hops.hops_together, hops._hop_and_claim) in their
# transaction and their round trip, before their answers are known: one step for each of the
# hops' steps in %(hopped)s that this transaction wrote (its row's xmin is this transaction's:
# the hop settled it), none for a hop that wrote nothing (fenced, its run changed or held).
# So the claim commits only with a hop that wrote, as when it waited for the hop's answer, a
# round trip later. pg_current_xact_id_if_assigned: a transaction that wrote nothing has no
# id yet, and then claims nothing.
CLAIM_AFTER_HOPS = CLAIM.replace(
    "WITH RECURSIVE ahead(",
    "WITH RECURSIVE wanted(n) AS (SELECT count(*)::int FROM workflows_step"
    " WHERE id = ANY(%(hopped)s::bigint[]) AND xmin = pg_current_xact_id_if_assigned()::xid),\n"
    "ahead(",
    1,
).replace("%(n)s", "(SELECT n FROM wanted)")


# Set on every connection that claims (a worker's: its claim loop's, steps.PreparedClaims, and its
# settling threads', steps.plan_claims_generically_from_now_on), before its first claim. Under the
# default plan_cache_mode (auto) PostgreSQL kept a custom plan for CLAIM, planning it again at every
# execution (0.5 ms of a claim's 1.3 ms in pg_stat_statements, on a 2-core machine), because its
# generic plan's estimate looks dearer. The plan does not depend on the parameters (lane,
# organisation to go on from, how many): what picks the indexes is constant (status = 'ready'
# matching the step_claimable index's predicate). Only server-side prepared statements are affected:
# on those connections, the settle's, whose plans were generic under auto already. Behind a
# transaction-mode pooler the setting may stay on another server connection: the claim is then
# planned at every call, as before: slower, never wrong. The plan depends on the tables' size
# when it was made, though: it is made again while they grow (plans.py).
GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"

# A suspect: a step whose last attempt never settled (its lease lapsed: the worker died, hung
# or was cut off from the database). It may be what killed its worker, so it is claimed one
# at a time, by a worker that holds nothing else (worker.py): a poison step can then cost
# only itself attempts, never the healthy steps claimed beside it.
CLAIM_SUSPECT = (
    """
WITH picked AS (
    SELECT id FROM workflows_step
     WHERE lane = %(lane)s AND status = 'running' AND lease_until <= now()
     ORDER BY lease_until
     LIMIT 1
       FOR UPDATE SKIP LOCKED
),
"""  # noqa: S608 (constant SQL joined with constant SQL)
    + _CLAIMED
)

# Extend the leases this worker still holds, each on its own: a row locked by a slow
# transaction (this worker's own long settle, say) is skipped, not waited for, so one row
# cannot hold up every other lease. `extended` false and `held` true: unknown (locked), try
# again next beat. `held` false: a newer attempt claimed it, or the step was cancelled or
# settled: the worker stops that attempt; its settle would be refused anyway.
HEARTBEAT = """
WITH wanted AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS h(id, attempt)
),
lockable AS (
    SELECT s.id FROM workflows_step s JOIN wanted h ON h.id = s.id AND h.attempt = s.attempt
     WHERE s.status = 'running'
       FOR NO KEY UPDATE OF s SKIP LOCKED
),
extended AS (
    UPDATE workflows_step s
       SET lease_until = now() + make_interval(secs => %(lease)s)
      FROM lockable
     WHERE s.id = lockable.id AND s.status = 'running'
 RETURNING s.id
)
SELECT h.id, h.attempt, e.id IS NOT NULL AS extended,
       coalesce(s.status = 'running' AND s.attempt = h.attempt, false) AS held
  FROM wanted h
  LEFT JOIN extended e ON e.id = h.id
  LEFT JOIN workflows_step s ON s.id = h.id
"""


class HeartbeatRow(TypedDict):
    id: int
    attempt: int
    extended: bool
    held: bool


# Idle workers (workflows_idleworker): a worker waiting for work lists itself, so the next
# transaction that makes work for its lane notifies it (rows.wakes_statement); a worker that
# takes work again strikes itself off. Run on the worker's own autocommit connection.
MARK_IDLE = """
INSERT INTO workflows_idleworker (worker, lane, idle_until)
VALUES (%(worker)s, %(lane)s, now() + make_interval(secs => %(ttl)s))
ON CONFLICT (worker) DO UPDATE SET lane = EXCLUDED.lane, idle_until = EXCLUDED.idle_until
"""

MARK_BUSY = "DELETE FROM workflows_idleworker WHERE worker = %(worker)s"

# A caller waiting for a run to end (services/run_waits.py): the organisation's run as it
# is, and the caller listed as its waiter while it has not ended (``waiter``: the row's id,
# which the notification carries). No row: no run of the organisation's. The trigger
# run_ended_notify notifies the run's channel once it ends, and takes its waiters' rows away.
WAIT_FOR_RUN = """
WITH run AS (
    SELECT id, status, output, error, finished_at FROM workflows_run
     WHERE id = %(run)s AND org_id = %(org)s
), listed AS (
    INSERT INTO workflows_runwaiter (run_id, since)
    SELECT id, now() FROM run WHERE finished_at IS NULL
    RETURNING id
)
SELECT id, status, output::text AS output, error, finished_at,
       (SELECT id FROM listed) AS waiter
  FROM run
"""

# The run as run_wait answers it (output as text, decoded by the caller).
RUN_OUTCOME = """
SELECT id, status, output::text AS output, error, finished_at FROM workflows_run
 WHERE id = %(run)s AND org_id = %(org)s
"""

STOP_WAITING = "DELETE FROM workflows_runwaiter WHERE id = %(waiter)s"

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

# A failed attempt with attempts left waits out a jittered backoff, outside the claimable
# index (PROMOTE_DUE_RETRIES makes it ready again once due).
# A deferral (``refund``: not the step's fault) does not count the attempt against
# max_attempts, like a hand-back on shutdown, and writes no error: its reason is in its
# step.deferred event, and a step that then succeeds keeps no error text of it.
SETTLE_RETRY = """
UPDATE workflows_step
   SET status = 'waiting', error = CASE WHEN %(refund)s THEN error ELSE %(error)s END,
       owner = NULL, lease_until = NULL,
       wait_kind = 'retry', wake_at = now() + make_interval(secs => %(delay)s),
       release_count = release_count + CASE WHEN %(refund)s THEN 1 ELSE 0 END
 WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
RETURNING run_id
"""

# The executor parked its step: it waits, holding no slot and no lease, for a wake from
# outside (wake_step) or for its deadline (`wake_at`, fired by the sweep).
SETTLE_PARK = """
UPDATE workflows_step
   SET status = 'waiting', owner = NULL, lease_until = NULL, wait_kind = 'external',
       wake_at = now() + make_interval(secs => %(deadline)s), wait_detail = %(detail)s,
       output = %(output)s,
       release_count = release_count + CASE WHEN %(refund)s THEN 1 ELSE 0 END
 WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
RETURNING run_id
"""

# Retries whose backoff has passed become ready, a bounded batch of one lane at a time. Only
# the due end of the step_wake_due index is read. Runs are not locked: a step of a paused
# run made ready here is parked by the claim.
PROMOTE_DUE_RETRIES = """
WITH due AS (
    SELECT id FROM workflows_step
     WHERE status = 'waiting' AND wake_at <= now() AND wait_kind = 'retry'
       AND lane = %(lane)s
     ORDER BY wake_at
     LIMIT %(n)s
       FOR UPDATE SKIP LOCKED
),
woken AS (
    UPDATE workflows_step s
       SET status = 'ready', wait_kind = '', wake_at = NULL, lease_until = now()
      FROM due
     WHERE s.id = due.id AND s.status = 'waiting'
 RETURNING s.org_id, s.run_id, s.step_id, s.iteration, s.attempt
)
INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration, attempt, worker, at)
SELECT org_id, run_id, 'step.retry_due', step_id, iteration, attempt, %(worker)s, now()
  FROM woken
"""

# Waiting steps whose deadline has passed, oldest first, for the sweep. Read without a lock:
# each is then fired under its run's lock by a guarded transition (WAKE_*), so a deadline
# racing a wake from outside has exactly one winner.
DUE_DEADLINES = """
SELECT id, run_id, wait_detail ->> 'on_deadline' AS on_deadline FROM workflows_step
 WHERE status = 'waiting' AND wake_at <= now() AND wait_kind = 'external'
 ORDER BY wake_at
 LIMIT %(n)s
"""


class DueDeadlineRow(TypedDict):
    id: int
    run_id: int
    on_deadline: str | None  # the outcome the step declared when it parked


STEP_RUN = "SELECT run_id FROM workflows_step WHERE id = %(id)s"

# The one way a waiting step wakes (a signal consumed, a decision taken, a timer or a
# deadline fired): guarded on its status and kind, so of two wakes (a signal and its
# deadline) exactly one wins; the caller holds the run's lock and walks on in the same
# transaction. `due` true: only if its deadline has passed (the sweep's guard). `run`: the run
# whose lock the caller holds (a step of another run is not woken under the wrong lock).
# Done, with an outcome: the walk goes on from it.
WAKE_DONE = """
UPDATE workflows_step
   SET status = 'done', output = %(output)s, wait_kind = '', wake_at = NULL,
       finished_at = now()
 WHERE id = %(id)s AND run_id = %(run)s AND status = 'waiting' AND wait_kind = 'external'
   AND (NOT %(due)s OR wake_at <= now())
RETURNING id, org_id, run_id, step_id, iteration, attempt, wait_detail::json AS wait_detail,
          fork_join_id, branch
"""


# A waiting step failed for good by what should have woken it (its wake raised a bug, not
# a transient error): its run then follows the step's failure path instead of waiting for
# a wake that will never come. Same row as WAKE_DONE's, for the walk.
FAIL_WAITING = """
UPDATE workflows_step
   SET status = 'failed', error = %(error)s, wait_kind = '', wake_at = NULL,
       finished_at = now()
 WHERE id = %(id)s AND run_id = %(run)s AND status = 'waiting'
RETURNING id, org_id, run_id, step_id, iteration, attempt, wait_detail::json AS wait_detail,
          fork_join_id, branch
"""


class WokenStepRow(TypedDict):
    """WAKE_DONE's row: the step woken done, which the walk goes on from."""

    id: int
    org_id: int
    run_id: int
    step_id: str
    iteration: int
    attempt: int
    wait_detail: dict[str, Any] | None  # free-form, as ClaimedRow's
    fork_join_id: int | None
    branch: int | None


# Ready, to run again (its executor sees why in its context); parked instead while the run
# is paused.
WAKE_READY = """
UPDATE workflows_step
   SET status = CASE WHEN %(paused)s THEN 'waiting' ELSE 'ready' END,
       wait_kind = CASE WHEN %(paused)s THEN 'paused' ELSE '' END,
       wake_at = NULL, lease_until = now(),
       wait_detail = coalesce(wait_detail, '{}'::jsonb)
                     || jsonb_build_object('woken_with', %(payload)s::jsonb)
 WHERE id = %(id)s AND run_id = %(run)s AND status = 'waiting' AND wait_kind = 'external'
   AND (NOT %(due)s OR wake_at <= now())
RETURNING id, org_id, run_id, step_id, iteration, attempt, lane
"""


class ReadiedStepRow(TypedDict):
    """WAKE_READY's row, and RELEASE's: a step made ready again, whose lane is to wake."""

    id: int
    org_id: int
    run_id: int
    step_id: str
    iteration: int
    attempt: int
    lane: str


# Shutdown: hand steps back at once instead of letting their leases lapse. The hand-back does
# not count against max_attempts (`release_count`), so deploys cannot turn a step into poison.
# Its rows are ReadiedStepRow's.
RELEASE = """
UPDATE workflows_step s
   SET status = 'ready', owner = NULL, lease_until = now(), release_count = s.release_count + 1
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS held(id, attempt)
 WHERE s.id = held.id AND s.attempt = held.attempt AND s.status = 'running'
RETURNING s.id, s.org_id, s.run_id, s.step_id, s.iteration, s.attempt, s.lane
"""

# --- runs: the walk and run control ---------------------------------------------------------

# FOR NO KEY UPDATE, not FOR UPDATE: inserting a step or an event checks its foreign key to
# the run with FOR KEY SHARE, which FOR UPDATE would block. A claim (step locked, then the
# event's key check on the run) against a settle (run locked, then its step) would deadlock.
# The walk never changes the run's key, so settles still serialise with each other.
_LOCK_RUN_BY = """
SELECT id, org_id, version_id, status, input::json AS input, vars::json AS vars,
       outputs::json AS outputs, entered::json AS entered, steps_executed, max_steps,
       deadline_at <= now() AS expired, created_at
  FROM workflows_run WHERE id = %({key})s FOR NO KEY UPDATE
"""
LOCK_RUN = _LOCK_RUN_BY.format(key="id")


# Several runs locked, in id order (the one lock order), and each one's waiting step woken
# with its outcome as WAKE_DONE wakes it (waits.wake_steps_together): %(wakes)s is a JSON
# array of {"id": the step's pk, "run": its run, "output": its output}. A step is woken only
# once every run is locked: the runs locked are read as one array (an InitPlan, run before
# the update's first row). Not as ``IN (SELECT id FROM locked)``: with the JSON's row count
# unknown to the planner, the prepared statement's generic plan rescanned the locked runs for
# every step (a semi join on a CTE scan: 36 of the statement's 38 ms for a batch of 500). A
# row per run locked, LOCK_RUN's columns with its woken step's (step_pk NULL: that step no
# longer waited).
LOCK_RUNS_WAKE_DONE = """
WITH wakes AS (
    SELECT * FROM jsonb_to_recordset(%(wakes)s::jsonb) AS w(id bigint, run bigint, output jsonb)
),
locked AS MATERIALIZED (
    SELECT id, org_id, version_id, status, input, vars, outputs, entered, steps_executed,
           max_steps, deadline_at <= now() AS expired, created_at
      FROM workflows_run WHERE id IN (SELECT run FROM wakes)
     ORDER BY id
       FOR NO KEY UPDATE
),
woken AS (
    UPDATE workflows_step s
       SET status = 'done', output = w.output, wait_kind = '', wake_at = NULL,
           finished_at = now()
      FROM wakes w
     WHERE s.id = w.id AND s.run_id = w.run AND s.status = 'waiting'
       AND s.wait_kind = 'external' AND w.run = ANY (ARRAY(SELECT id FROM locked))
    RETURNING s.id, s.run_id, s.step_id, s.iteration, s.attempt, s.wait_detail,
              s.fork_join_id, s.branch
)
SELECT l.id, l.org_id, l.version_id, l.status, l.input::json AS input, l.vars::json AS vars,
       l.outputs::json AS outputs, l.entered::json AS entered, l.steps_executed, l.max_steps,
       l.expired, l.created_at, k.id AS step_pk, k.step_id, k.iteration, k.attempt,
       k.wait_detail::json AS wait_detail, k.fork_join_id, k.branch
  FROM locked l LEFT JOIN woken k ON k.run_id = l.id
 ORDER BY l.id
"""


class RunRow(TypedDict):
    """LOCK_RUN's row: the run as the walk holds it (walk.RunState is built from it)."""

    id: int
    org_id: int
    version_id: int
    status: str
    # The run's template data (free-form JSON: the start's input, what its steps wrote).
    input: Any
    vars: dict[str, Any]
    outputs: dict[str, Any]
    entered: dict[str, int]
    steps_executed: int
    max_steps: int
    expired: bool
    created_at: datetime


class LockedRunThenRow(RunRow):
    """The row of a statement of locked_run_then: the run's, and how many steps changed."""

    # Always there; NotRequired only so that it can be popped before the rest becomes a
    # RunState (steps._settling).
    changed: NotRequired[int]


def locked_run_then(transition: str) -> str:
    """The run's lock and a step's guarded transition (a statement above ending in
    ``RETURNING run_id``) in one statement: the run's row (from ``%(run)s``) and how many
    steps changed (``changed``, 0: fenced out). The lock order holds: the transition's
    WHERE requires the locked run (an InitPlan, run before any step row is locked)."""
    head, returning = transition.rsplit("RETURNING run_id", 1)
    assert not returning.strip(), "a transition ends in RETURNING run_id"
    return f"""
WITH run AS ({_LOCK_RUN_BY.format(key="run")}),
changed AS (
{head.strip()}
   AND EXISTS (SELECT 1 FROM run)
RETURNING run_id
)
SELECT run.*, (SELECT count(*) FROM changed) AS changed FROM run
"""  # noqa: S608 (composed of this module's constant SQL)


# A run's finished_at: the ending transaction's now(), but never before the run's created_at
# (its creating transaction's now()). A transaction that began before the run was created can
# still end it (an erasure that finds the run after it began, a caller's transaction around
# run_cancel_locked): its now() is earlier than the run's creation, by the time between the
# two transactions' starts. One clock (the database's), and finished_at >= created_at always.
# The hop functions (sql/functions.py) write now() as it is: each is the first statement of
# its transaction, about a run the worker read before, so their now() is after its creation.
RUN_FINISHED_AT = "GREATEST(now(), created_at)"


def _run_set(value: Callable[[str], str]) -> str:
    """The SET list of a walk's update of its run: its values as the walk leaves them
    (Walk._run_update's parameters), each read by ``value(name)``; the JSON columns merged
    into the run's (a walk writes the keys it changed)."""
    return f"""
   SET vars = r.vars || {value("vars")}, outputs = r.outputs || {value("outputs")},
       entered = r.entered || {value("entered")},
       steps_executed = {value("steps")}, status = {value("status")},
       output = {value("output")}, error = {value("error")},
       finished_at = CASE WHEN {value("finished")} THEN {RUN_FINISHED_AT} ELSE NULL END"""


# The walk's one write to the run: what changed of its template data (merged, never rewritten
# whole), its budget and, when it ends, its outcome. The caller holds the row lock (LOCK_RUN)
# and guards on the status it read under it.
UPDATE_RUN = f"""
UPDATE workflows_run r{_run_set(lambda name: f"%({name})s")}
 WHERE r.id = %(id)s AND r.status = %(expected)s AND r.status IN ('running', 'paused')
"""

# Several runs' UPDATE_RUN in one statement (waits.wake_steps_together: a batch of timers
# each ending its own run's wait): %(runs)s is a JSON array of UPDATE_RUN's parameters
# (rows.json_params: a missing key is SQL NULL). Its row count says how many it updated.
UPDATE_RUNS = f"""
UPDATE workflows_run r{_run_set(lambda name: f"u.{name}")}
  FROM jsonb_to_recordset(%(runs)s::jsonb) AS u(
       id bigint, vars jsonb, outputs jsonb, entered jsonb, steps integer, status text,
       output jsonb, error text, finished boolean, expected text)
 WHERE r.id = u.id AND r.status = u.expected AND r.status IN ('running', 'paused')
"""

# Sagas (engine/compensation.py): the completed executions of the run, in the order they
# completed (a walk's own rows are not written yet: the walk adds them); the plan its
# compensation was begun with (the latest run.compensating event: an operator's retry
# continues it) and the position in it entered last (compensation.entered events record it).
COMPLETED_STEPS = """
SELECT step_id, iteration FROM workflows_step
 WHERE run_id = %(run)s AND status = 'done'
 ORDER BY finished_at, id
"""

# A code run's compensations, as its function registered them (ctx.compensate_with: steps of
# their own, engine/decided.py), in the order registered; found by the (org_id, run_id, ...)
# index every step lookup of a run uses.
RECORDED_COMPENSATIONS = """
SELECT iteration, output::text AS output FROM workflows_step
 WHERE org_id = %(org)s AND run_id = %(run)s AND step_id = %(record)s AND status = 'done'
 ORDER BY id
"""

# A re-run (services/rerun.py) ends whatever compensation went before it: a plan counts only
# when it is newer than the run's last run.rerun event.
COMPENSATION_PLAN = """
SELECT plan.detail,
       (SELECT max((entered.detail ->> 'position')::int) FROM workflows_runevent entered
         WHERE entered.run_id = %(run)s AND entered.kind = 'compensation.entered'
           AND entered.id > plan.id) AS position
  FROM workflows_runevent plan
 WHERE plan.run_id = %(run)s AND plan.kind = 'run.compensating'
   AND plan.id > COALESCE((SELECT max(rerun.id) FROM workflows_runevent rerun
                            WHERE rerun.run_id = %(run)s AND rerun.kind = 'run.rerun'), 0)
 ORDER BY plan.id DESC
 LIMIT 1
"""

# The execution a compensation step's row undoes (its compensation.entered event names it)
# and that execution's output: a compensation's template context (``compensating``).
COMPENSATED_EXECUTION = """
SELECT entered.detail ->> 'compensates' AS step,
       (entered.detail ->> 'compensates_iteration')::int AS iteration, done.output
  FROM workflows_runevent entered
  LEFT JOIN workflows_step done
    ON done.run_id = entered.run_id AND done.step_id = entered.detail ->> 'compensates'
   AND done.iteration = (entered.detail ->> 'compensates_iteration')::int
 WHERE entered.run_id = %(run)s AND entered.kind = 'compensation.entered'
   AND entered.step_id = %(step)s AND entered.iteration = %(iteration)s
 ORDER BY entered.id DESC
 LIMIT 1
"""

# One step execution's output (a compensation entered inline reads the one it undoes).
STEP_OUTPUT = """
SELECT output FROM workflows_step
 WHERE run_id = %(run)s AND step_id = %(step_id)s AND iteration = %(iteration)s
"""

# A code run's re-run (services/rerun.py): the steps entered before the step it re-runs from
# (its first row of that iteration; every row when it has none: the call the run was making
# when it ended), in whatever place, in the order entered, each with the join row its output
# names (a fork's: its branches' place). The re-run keeps the effects of those its replay
# still reads: the top level's kept steps, and the branches of the forks among them.
STEPS_ENTERED_BEFORE = """
SELECT step_id, iteration, type, fork_join_id, (output -> 'join_row')::text AS join_row
  FROM workflows_step
 WHERE run_id = %(run)s
   AND id < COALESCE((SELECT min(id) FROM workflows_step
                       WHERE run_id = %(run)s AND step_id = %(step)s
                         AND iteration = %(iteration)s), 9223372036854775807)
 ORDER BY id
"""

# The compensations a run's plans entered (engine/compensation.py, the compensation.entered
# event): each entry's step, whether its row completed, and the execution it undoes. A code
# run's re-run reads what its compensations undid here: its plan came from the code, not
# from its definition's ``compensate`` fields.
COMPENSATIONS_ENTERED = """
SELECT entered.step_id, entered.detail ->> 'compensates' AS compensates,
       (entered.detail ->> 'compensates_iteration')::int AS compensates_iteration,
       COALESCE(done.status = 'done', false) AS completed
  FROM workflows_runevent entered
  LEFT JOIN workflows_step done
    ON done.run_id = entered.run_id AND done.step_id = entered.step_id
   AND done.iteration = entered.iteration
 WHERE entered.run_id = %(run)s AND entered.kind = 'compensation.entered'
 ORDER BY entered.id
"""

# A code run's re-run may not start from a step entered only in ctx.parallel branches: the
# top-level join its first such row is under (up through the joins of nested parallels; a
# join row's own place is its parallel's), whose step id names the parallel
# (``<parallel>.join``).
TOP_JOIN_ABOVE_STEP = """
WITH RECURSIVE up(join_row) AS (
    (SELECT fork_join_id FROM workflows_step
      WHERE run_id = %(run)s AND step_id = %(step)s AND fork_join_id IS NOT NULL
      ORDER BY id LIMIT 1)
    UNION ALL
    SELECT j.fork_join_id FROM up JOIN workflows_step j ON j.id = up.join_row
     WHERE j.fork_join_id IS NOT NULL
)
SELECT s.step_id FROM up JOIN workflows_step s ON s.id = up.join_row
 WHERE s.fork_join_id IS NULL
"""

# Whether an entry of a code run's step was its compensation plan's (not one a re-run may
# start from), and the execution it undid.
COMPENSATION_ENTRY = """
SELECT detail ->> 'compensates' AS compensates FROM workflows_runevent
 WHERE run_id = %(run)s AND kind = 'compensation.entered' AND step_id = %(step)s
   AND iteration = %(iteration)s
 LIMIT 1
"""

# The executions of a run that took an older effect's answer (effects/reruns.py, the
# effect.reused event): which key each took. A re-run counts that key as theirs.
EFFECTS_REUSED = """
SELECT DISTINCT step_id, iteration, detail ->> 'reused' AS reused FROM workflows_runevent
 WHERE run_id = %(run)s AND kind = 'effect.reused'
"""

# The newest row of a step (a retry of a compensating run resumes the plan from it).
LATEST_ROW_OF = """
SELECT id, step_id, iteration, status, lane, fork_join_id, branch FROM workflows_step
 WHERE run_id = %(run)s AND step_id = %(step_id)s
 ORDER BY iteration DESC
 LIMIT 1
"""

# Compensation begins: the run's live forward steps end (parallel branches still ready,
# running or waiting, a continuation, a join still waiting), so none completes forward work
# after the plan was made; a running one's worker learns at its next heartbeat and its late
# settle is fenced out. The plan's own steps (``compensators``) are spared.
CANCEL_FORWARD_STEPS = """
UPDATE workflows_step
   SET status = 'cancelled', owner = NULL, lease_until = NULL, wait_kind = '', wake_at = NULL,
       finished_at = now()
 WHERE run_id = %(run)s AND status IN ('ready', 'running', 'waiting')
   AND NOT (step_id = ANY(%(compensators)s))
RETURNING step_id, iteration, attempt
"""

# The id of the step the walk just wrote already claimed for the settling worker (unique
# (run, step_id, iteration)); nothing if the same walk ended it again (its join completed).
STEP_ID_OF = """
SELECT id, step_id, iteration FROM workflows_step
 WHERE run_id = %(run)s AND step_id = %(step_id)s AND iteration = %(iteration)s
   AND status = 'running'
"""


class TakenStepRow(TypedDict):
    """STEP_ID_OF's row, and the walk's steps' INSERT's when it returns them."""

    id: int
    step_id: str
    iteration: int


LIVE_STEPS = """
SELECT count(*) AS live FROM workflows_step
 WHERE run_id = %(run)s AND status IN ('ready', 'running', 'waiting')
"""

# A run of this organisation (another organisation's is unknown to it).
RUN_OF_ORG = "SELECT id FROM workflows_run WHERE id = %(id)s AND org_id = %(org)s"

# Run control: one guarded status change of a run (the caller holds its lock).
SET_RUN_STATUS = f"""
UPDATE workflows_run
   SET status = %(status)s, error = %(error)s,
       finished_at = CASE WHEN %(finished)s THEN {RUN_FINISHED_AT} ELSE NULL END
 WHERE id = %(id)s AND status = ANY(%(sources)s)
RETURNING id
"""  # noqa: S608 (this module's constant fragments)

# A run ended (finished, failed, cancelled): every live step of it ends too, so no sibling is
# claimed or settled afterwards. A running step's worker learns at its next heartbeat (the
# step is no longer running) and drops its result.
_CANCEL_LIVE_STEPS_OF = """
UPDATE workflows_step
   SET status = 'cancelled', owner = NULL, lease_until = NULL, wait_kind = '', wake_at = NULL,
       finished_at = now()
 WHERE run_id = {runs} AND status IN ('ready', 'running', 'waiting')
RETURNING org_id, run_id, step_id, iteration, attempt
"""
CANCEL_LIVE_STEPS = _CANCEL_LIVE_STEPS_OF.format(runs="%(run)s")

# The same, in the walk's batch (no results read back): the cancellations are logged here.
_LOG_ENDED = """)
INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration, attempt, worker,
                                detail, at)
SELECT org_id, run_id, 'step.cancelled', step_id, iteration, attempt, %(worker)s,
       '{"reason": "the run ended"}'::jsonb, now()
  FROM ended
"""
CANCEL_LIVE_STEPS_LOGGED = "WITH ended AS (" + CANCEL_LIVE_STEPS + _LOG_ENDED

# The same for several runs that ended (waits.wake_steps_together), by one worker.
CANCEL_LIVE_STEPS_OF_RUNS_LOGGED = (
    "WITH ended AS (" + _CANCEL_LIVE_STEPS_OF.format(runs="ANY(%(runs)s)") + _LOG_ENDED
)

# Several runs' new steps and events from one JSON array each (rows.json_rows: times as
# seconds from now()), in the array's order (the ids, so each run's history, follow it): the
# INSERTs of insert_statement, with one parameter each instead of one per cell (psycopg
# parsed a statement of 10,000 placeholders in Python each time: waits.wake_steps_together).
INSERT_STEPS_FROM_JSON = """
INSERT INTO workflows_step (
    org_id, run_id, step_id, iteration, type, lane, status, owner, attempt, release_count,
    series_offset, max_attempts, lease_until, wait_kind, wake_at, wait_detail, output, error,
    finished_at, fork_join_id, branch)
SELECT s.org_id, s.run_id, s.step_id, s.iteration, s.type, s.lane, s.status, s.owner,
       s.attempt, s.release_count, s.series_offset, s.max_attempts,
       now() + make_interval(secs => s.lease_until), s.wait_kind,
       now() + make_interval(secs => s.wake_at), s.wait_detail, s.output, s.error,
       now() + make_interval(secs => s.finished_at), s.fork_join_id, s.branch
  FROM ROWS FROM (jsonb_to_recordset(%(rows)s::jsonb) AS (
       org_id bigint, run_id bigint, step_id text, iteration integer, type text, lane text,
       status text, owner text, attempt integer, release_count integer,
       series_offset integer, max_attempts integer, lease_until float8, wait_kind text,
       wake_at float8, wait_detail jsonb, output jsonb, error text, finished_at float8,
       fork_join_id bigint, branch smallint)) WITH ORDINALITY AS s(
       org_id, run_id, step_id, iteration, type, lane, status, owner, attempt, release_count,
       series_offset, max_attempts, lease_until, wait_kind, wake_at, wait_detail, output,
       error, finished_at, fork_join_id, branch, n)
 ORDER BY s.n
"""

INSERT_EVENTS_FROM_JSON = """
INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration, attempt, worker,
                                detail, at)
SELECT e.org_id, e.run_id, e.kind, e.step_id, e.iteration, e.attempt, e.worker, e.detail, now()
  FROM ROWS FROM (jsonb_to_recordset(%(rows)s::jsonb) AS (
       org_id bigint, run_id bigint, kind text, step_id text, iteration integer,
       attempt integer, worker text, detail jsonb)) WITH ORDINALITY AS e(
       org_id, run_id, kind, step_id, iteration, attempt, worker, detail, n)
 ORDER BY e.n
"""

# Pause: ready steps are parked (running ones finish; the claim parks any it meets later).
PARK_READY_STEPS = """
UPDATE workflows_step
   SET status = 'waiting', wait_kind = 'paused', lease_until = NULL
 WHERE run_id = %(run)s AND status = 'ready'
RETURNING step_id, iteration
"""

# Resume: what the pause parked is ready again.
UNPARK_STEPS = """
UPDATE workflows_step
   SET status = 'ready', wait_kind = '', lease_until = now()
 WHERE run_id = %(run)s AND status = 'waiting' AND wait_kind = 'paused'
RETURNING step_id, iteration, lane
"""

# Retry: the newest failed row of each step that failed the run (the caller chooses them)
# starts a new series of attempts. The fencing token (attempt) keeps growing; only the
# attempts counted against max_attempts start again.
RETRY_FAILED_STEPS = """
UPDATE workflows_step
   SET status = 'ready', owner = NULL, lease_until = now(), error = '', finished_at = NULL,
       series_offset = attempt - release_count
 WHERE run_id = %(run)s AND id = ANY(%(ids)s) AND status = 'failed'
RETURNING step_id, iteration, lane, attempt
"""

# The run's failed steps an operator's retry may run again: not those a migration between
# versions found failed (its run.migrated event lists them: the run was live, so each had
# been followed by a failure path of its own, under the version it failed on), and only rows
# of the walk since the run's last re-run (rerun_floor): a step that failed before it belongs
# to a walk the operator replaced.
_RETRIABLE_FAILED = """
  FROM workflows_step s
 WHERE run_id = %(run)s AND status = 'failed'
   AND NOT EXISTS (SELECT 1 FROM workflows_runevent e
                    WHERE e.run_id = %(run)s AND e.kind = 'run.migrated'
                      AND e.detail->'failed_before' @> to_jsonb(s.id))
   AND s.id > COALESCE((SELECT rerun_floor FROM workflows_run WHERE id = %(run)s), 0)
"""
FAILED_STEPS = f"""
SELECT DISTINCT ON (step_id) id, step_id, iteration, lane, type, error, fork_join_id, branch
{_RETRIABLE_FAILED} ORDER BY step_id, iteration DESC
"""

# The same for a code run, by place: its ctx.parallel's branches may call steps of the same
# id (a step that failed the run on one branch, one whose failure the code caught on
# another), so the newest failed row of a step id is each place's own.
FAILED_STEPS_BY_PLACE = f"""
SELECT DISTINCT ON (step_id, fork_join_id, branch)
       id, step_id, iteration, lane, type, error, fork_join_id, branch
{_RETRIABLE_FAILED} ORDER BY step_id, fork_join_id, branch, iteration DESC
"""

# Re-run from a step (services/rerun.py): a finished run runs again, its input and vars as
# the operator left them, its outcome cleared, its budgets (max age, steps) counted afresh,
# with the effects its new walk reuses and the last step row of the walks before it. The
# caller holds the run's lock; %(sources)s: the declared sources of `running` that are
# finished (workflows.states).
RERUN_RUN = """
UPDATE workflows_run
   SET status = 'running', input = %(input)s, vars = %(vars)s, output = NULL, error = '',
       finished_at = NULL, steps_executed = 0,
       deadline_at = now() + make_interval(secs => %(max_age)s),
       rerun_reuse = %(reuse)s,
       rerun_floor = (SELECT max(id) FROM workflows_step WHERE run_id = %(id)s)
 WHERE id = %(id)s AND status = ANY(%(sources)s)
RETURNING id
"""

# The steps of the run that completed (each row), in the order they did, for what a
# re-run reuses: an effect step's settled effect counts unless a compensation undid it.
DONE_STEP_ROWS = """
SELECT step_id, iteration FROM workflows_step
 WHERE run_id = %(run)s AND status = 'done'
 ORDER BY finished_at, id
"""

# --- forks: parallel branches and their join ----------------------------------------------

# A fork's join: a waiting row created when the `parallel` is entered, before its branches,
# which point at it (fork_join_id). It waits for `need` branches to arrive. Its type is the
# join step's (a type that declares `joins`: workflows/steptypes.py); `joins` below is the
# list of those types' names (registry.joining()): the statements name no step type. Its
# wait_kind is `join_wait` (forks.JOIN_WAIT).
INSERT_JOIN_ROW = """
INSERT INTO workflows_step
    (org_id, run_id, step_id, iteration, type, lane, status, attempt, release_count, series_offset,
     max_attempts, wait_kind, wait_detail, error, created_at, fork_join_id, branch)
VALUES (%(org)s, %(run)s, %(step_id)s, %(iteration)s, %(type)s, 'inline', 'waiting', 0, 0, 0, 1,
        %(join_wait)s, %(detail)s, '', now(), %(fork_join)s, %(branch)s)
RETURNING id
"""

JOIN_ROW = """
SELECT step_id, iteration, fork_join_id, branch FROM workflows_step WHERE id = %(id)s
"""

# A branch arrives at its join: one guarded transition under the run's lock. The arrival
# that completes it (`need` branches in) turns it done; one arriving after that finds no
# waiting row and changes nothing, so the join continues exactly once.
JOIN_ARRIVE = """
UPDATE workflows_step
   SET wait_detail = jsonb_set(wait_detail, '{arrived}',
                               (wait_detail -> 'arrived') || to_jsonb(%(branch)s::int)),
       status = CASE WHEN jsonb_array_length(wait_detail -> 'arrived') + 1
                          >= (wait_detail ->> 'need')::int
                     THEN 'done' ELSE 'waiting' END,
       wait_kind = CASE WHEN jsonb_array_length(wait_detail -> 'arrived') + 1
                             >= (wait_detail ->> 'need')::int
                        THEN '' ELSE %(join_wait)s END,
       finished_at = CASE WHEN jsonb_array_length(wait_detail -> 'arrived') + 1
                               >= (wait_detail ->> 'need')::int
                          THEN now() END
 WHERE id = %(id)s AND status = 'waiting' AND wait_kind = %(join_wait)s
   -- A branch counts once: one that split into join-less parallel paths arrives with the
   -- first of them (a second arrival would complete the join without another branch).
   AND NOT (wait_detail -> 'arrived') @> to_jsonb(%(branch)s::int)
RETURNING status, step_id, iteration, fork_join_id, branch, wait_detail::json AS wait_detail
"""


class JoinArrivalRow(TypedDict):
    """JOIN_ARRIVE's row: the join as the arrival left it."""

    status: str
    step_id: str
    iteration: int
    fork_join_id: int | None
    branch: int | None
    wait_detail: dict[str, Any]  # INSERT_JOIN_ROW's detail: need, branches, arrived, fork


# The join completed before every branch arrived (`first`, or `n`): the rest of the fork,
# nested forks included, ends.
CANCEL_FORK = """
WITH RECURSIVE fork(id) AS (
    SELECT %(join)s::bigint
    UNION ALL
    SELECT s.id FROM workflows_step s JOIN fork f ON s.fork_join_id = f.id
     WHERE s.run_id = %(run)s AND s.type = ANY(%(joins)s::text[])
)
UPDATE workflows_step
   SET status = 'cancelled', owner = NULL, lease_until = NULL, wait_kind = '', wake_at = NULL,
       finished_at = now()
 WHERE run_id = %(run)s AND fork_join_id IN (SELECT id FROM fork)
   AND status IN ('ready', 'running', 'waiting')
RETURNING step_id, iteration, attempt
"""


class CancelledStepRow(TypedDict):
    step_id: str
    iteration: int
    attempt: int


# A failed run retried inside a parallel (services/control.py, forks.revive_forks): the join
# its failure cancelled (a cancelled row stays cancelled: a new join row continues it).
CANCELLED_JOIN = """
SELECT step_id, iteration, type, fork_join_id, branch, wait_detail::json AS wait_detail
  FROM workflows_step
 WHERE run_id = %(run)s AND id = %(id)s AND status = 'cancelled'
"""

# The fork's rows now meet at the join row that continues the cancelled one: every step of
# its branches (those that arrived, those entered again, the one retried), so the join
# counts them and a code run's replay reads its branches from one place.
MOVE_FORK = """
UPDATE workflows_step SET fork_join_id = %(new)s
 WHERE run_id = %(run)s AND fork_join_id = %(old)s
"""

# The parallel step that opened the fork names its join row (forks.fork, read by a code
# run's replay): it names the row that continues it.
MOVE_FORK_STEP = """
UPDATE workflows_step SET output = jsonb_set(output, '{join_row}', to_jsonb(%(new)s::bigint))
 WHERE run_id = %(run)s AND jsonb_typeof(output) = 'object'
   AND output ->> 'join_row' = %(old)s::text
"""

# Each branch's newest step in the fork of join row %(join)s: where the branch was.
BRANCH_HEADS = """
SELECT DISTINCT ON (branch) step_id, iteration, type, status, branch,
       output->'join_row' AS join_row
  FROM workflows_step
 WHERE run_id = %(run)s AND fork_join_id = %(join)s
 ORDER BY branch, id DESC
"""

# The places of a run's rows of some steps (a re-run's settled effects, services/rerun.py).
STEP_PLACES = """
SELECT step_id, iteration, fork_join_id, branch FROM workflows_step
 WHERE run_id = %(run)s AND step_id = ANY(%(ids)s)
"""

# Every join row the run's steps sit under (the rows their fork_join_id name, nested joins
# included: an inner join row sits on its outer branch), with its own place: what names a
# place by its branch path (forks.branch_paths).
JOIN_ROWS_OF_RUN = """
SELECT id, step_id, fork_join_id, branch FROM workflows_step
 WHERE id IN (SELECT DISTINCT fork_join_id FROM workflows_step
               WHERE run_id = %(run)s AND fork_join_id IS NOT NULL)
"""

JOIN_ROWS_UNDER = """
SELECT id FROM workflows_step
 WHERE run_id = %(run)s AND type = ANY(%(joins)s::text[]) AND fork_join_id = ANY(%(ids)s)
"""

# --- runs: starting ---------------------------------------------------------------------------

# What a start of (organisation, slug) runs: the automation and its current version (its
# definition comes from the process's cache of published versions).
START_TARGET = """
SELECT id AS automation_id, current_version_id AS version_id FROM workflows_automation
 WHERE org_id = %(org)s AND slug = %(slug)s
"""

# An organisation's running runs, counted no further than its quota (services/quotas.py):
# the cost is bounded by the quota, not by how many runs the organisation has.
RUNNING_RUNS_UP_TO = """
SELECT count(*) FROM (
    SELECT 1 FROM workflows_run WHERE org_id = %(org)s AND status = 'running' LIMIT %(limit)s
) running
"""

# The same for signals kept pending (the signal_pending index, which leads with org).
PENDING_SIGNALS_UP_TO = """
SELECT count(*) FROM (
    SELECT 1 FROM workflows_signal
     WHERE org_id = %(org)s AND consumed_at IS NULL AND dropped_at IS NULL
     LIMIT %(limit)s
) pending
"""

# --- quota admissions (services/quotas.py) ------------------------------------------------------

# The database's clock, for the decisions made in Python (engine/clock.py).
DATABASE_NOW = "SELECT now() AS now"

# The starts-per-minute window's minute (minutes since the epoch) on the database's clock,
# computed in the statement that counts in it: no round trip to read the clock first.
# %(window)s, when not NULL, is a minute the caller pinned (the tests).
QUOTA_MINUTE = """
SELECT COALESCE(%(window)s::bigint, floor(extract(epoch FROM now()) / 60)::bigint) AS minute
""".strip()

# One admission, in the admitted thing's transaction: the organisation's usage row locked and
# counted on, if it stays within the quota (%(limit)s) and this minute's rate (%(rate)s; 0:
# none); no row: refused here, the caller counts again. The minute counted in is
# QUOTA_MINUTE's; one older than the row's (a transaction that began before another's minute
# turned) counts in the row's.
QUOTA_ADMIT = f"""
UPDATE workflows_quotausage u
   SET bound = u.bound + 1,
       window_count = CASE WHEN m.minute <= u."window" THEN u.window_count + 1 ELSE 1 END,
       "window" = GREATEST(u."window", m.minute)
  FROM ({QUOTA_MINUTE}) m
 WHERE u.org_id = %(org)s AND u.kind = %(kind)s
   AND (%(limit)s = 0 OR u.bound < %(limit)s)
   AND (%(rate)s = 0 OR m.minute > u."window" OR u.window_count < %(rate)s)
RETURNING u.id
"""  # noqa: S608 (this module's constant fragments)

QUOTA_USAGE_CREATE = """
INSERT INTO workflows_quotausage (org_id, kind, bound, counted_at, "window", window_count)
VALUES (%(org)s, %(kind)s, NULL, NULL, 0, 0)
ON CONFLICT (org_id, kind) DO NOTHING
"""

# The row locked (every admission of the organisation waits for this transaction), with
# whether its count is recent.
QUOTA_USAGE_LOCK = """
SELECT bound, "window", window_count,
       counted_at > now() - make_interval(secs => %(fresh)s) AS fresh
  FROM workflows_quotausage
 WHERE org_id = %(org)s AND kind = %(kind)s
   FOR UPDATE
"""

QUOTA_USAGE_COUNTED = """
UPDATE workflows_quotausage SET bound = %(count)s, counted_at = now()
 WHERE org_id = %(org)s AND kind = %(kind)s
"""

# After a refusal rolled its transaction back: its count kept (not below what admissions
# since then added), so refusals do not count again until the count is no longer recent.
QUOTA_REMEMBER_COUNT = """
UPDATE workflows_quotausage
   SET bound = GREATEST(COALESCE(bound, 0), %(count)s), counted_at = now()
 WHERE org_id = %(org)s AND kind = %(kind)s
"""

QUOTA_FORGET = """
UPDATE workflows_quotausage SET bound = NULL, counted_at = NULL WHERE bound IS NOT NULL
"""

# A new run's row (INSERT_RUN, INSERT_RUN_IF_CURRENT): its columns and their values.
_RUN_COLUMNS = """
    (org_id, automation_id, version_id, start_key, start_key_derived, input, input_digest,
     status, vars, outputs, entered, error, steps_executed, max_steps, deadline_at, created_at,
     trace_context)
""".strip()
# %(trace)s: the start span's W3C traceparent, NULL while tracing is off (engine/tracing.py).
_RUN_VALUES = """
    %(org)s, %(automation)s, %(version)s, %(key)s, %(derived)s, %(input)s, %(digest)s,
    'running', '{}', '{}', '{}', '', 0, %(max_steps)s,
    now() + make_interval(secs => %(max_age)s), now(), %(trace)s
""".strip()

INSERT_RUN = f"""
INSERT INTO workflows_run {_RUN_COLUMNS}
VALUES ({_RUN_VALUES})
ON CONFLICT (org_id, start_key) DO NOTHING
RETURNING id, created_at
"""  # noqa: S608 (this module's constant fragments)

# A start as the automation's version it last saw (services/runs.py::_LastSeen): the run is
# inserted only if that version is still current, in one round trip instead of two. The row
# says what is current (no row: no such automation) and, when inserted, the run (else its
# start key was taken, or the guess was stale: the caller tells which).
INSERT_RUN_IF_CURRENT = f"""
WITH target AS ({START_TARGET}),
inserted AS (
    INSERT INTO workflows_run {_RUN_COLUMNS}
    SELECT {_RUN_VALUES}
      FROM target
     WHERE target.automation_id = %(automation)s AND target.version_id = %(version)s
    ON CONFLICT (org_id, start_key) DO NOTHING
    RETURNING id, created_at
)
SELECT target.automation_id, target.version_id, inserted.id, inserted.created_at
  FROM target LEFT JOIN inserted ON true
"""  # noqa: S608 (this module's constant fragments)

# A start in one statement (engine/starts.py): INSERT_RUN_IF_CURRENT with the run's row as its
# walk left it, and the walk's new steps, events and lane wake-ups, written only when the run
# was inserted (each joins `inserted`). In autocommit it is a transaction of its own. The
# walk ran before the run had an id: its rows carry none, each takes the inserted one. The
# JSON values come in one document (%(document)s: the run's input, vars, outputs and entered,
# its steps and events as arrays of objects keyed by column name, times as seconds from
# now(), the lanes to wake, and the start span's traceparent under "trace" only while
# tracing is on: no parameter of its own, so an untraced start sends nothing more). With
# %(admit)s, the start is admitted under the
# organisation's start quotas in the same statement (as QUOTA_ADMIT, services/quotas.py): the
# usage row is locked for this statement alone. Not admitted (no usage row yet, or the bound
# at the quota), it writes nothing and says so (`admitted` false): the caller admits the
# ordinary way, counting the runs.
START_RUN = f"""
WITH target AS ({START_TARGET}),
doc AS (SELECT %(document)s::jsonb AS d),
admitted AS (
    UPDATE workflows_quotausage u
       SET bound = u.bound + 1,
           window_count = CASE WHEN m.minute <= u."window" THEN u.window_count + 1 ELSE 1 END,
           "window" = GREATEST(u."window", m.minute)
      FROM ({QUOTA_MINUTE}) m
     WHERE %(admit)s AND u.org_id = %(org)s AND u.kind = 'starts'
       AND (%(limit)s = 0 OR u.bound < %(limit)s)
       AND (%(rate)s = 0 OR m.minute > u."window" OR u.window_count < %(rate)s)
    RETURNING u.id
),
inserted AS (
    INSERT INTO workflows_run {_RUN_COLUMNS}
    SELECT %(org)s, %(automation)s, %(version)s, %(key)s, %(derived)s, doc.d->'input',
           %(digest)s, %(status)s, doc.d->'vars', doc.d->'outputs', doc.d->'entered', '',
           %(steps)s, %(max_steps)s, now() + make_interval(secs => %(max_age)s), now(),
           doc.d->>'trace'
      FROM target CROSS JOIN doc
     WHERE target.automation_id = %(automation)s AND target.version_id = %(version)s
       AND (NOT %(admit)s OR EXISTS (SELECT FROM admitted))
    ON CONFLICT (org_id, start_key) DO NOTHING
    RETURNING id
),
steps AS (
    INSERT INTO workflows_step (
        org_id, run_id, step_id, iteration, type, lane, status, owner, attempt, release_count,
        series_offset, max_attempts, lease_until, wait_kind, wake_at, wait_detail, output,
        error, finished_at, fork_join_id, branch)
    SELECT %(org)s, i.id, s.step_id, s.iteration, s.type, s.lane, s.status, s.owner,
           s.attempt, s.release_count, s.series_offset, s.max_attempts,
           now() + make_interval(secs => s.lease_until), s.wait_kind,
           now() + make_interval(secs => s.wake_at), s.wait_detail, s.output, s.error,
           now() + make_interval(secs => s.finished_at), s.fork_join_id, s.branch
      FROM inserted i CROSS JOIN doc CROSS JOIN jsonb_to_recordset(doc.d->'new_steps') AS s(
           step_id text, iteration integer, type text, lane text, status text, owner text,
           attempt integer, release_count integer, series_offset integer,
           max_attempts integer, lease_until float8, wait_kind text, wake_at float8,
           wait_detail jsonb, output jsonb, error text, finished_at float8,
           fork_join_id bigint, branch smallint)
),
events AS (
    INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration, attempt, worker,
                                    detail, at)
    SELECT %(org)s, i.id, e.kind, e.step_id, e.iteration, e.attempt, e.worker, e.detail, now()
      FROM inserted i CROSS JOIN doc CROSS JOIN ROWS FROM (
           jsonb_to_recordset(doc.d->'events') AS (kind text, step_id text, iteration integer,
           attempt integer, worker text, detail jsonb))
           WITH ORDINALITY AS e(kind, step_id, iteration, attempt, worker, detail, n)
     ORDER BY e.n
),
woken AS (
    INSERT INTO workflows_outbox (org_id, topic, payload, created_at)
    SELECT %(org)s, 'lane.wake', jsonb_build_object('lane', w.lane, 'run', i.id), now()
      FROM inserted i CROSS JOIN doc CROSS JOIN jsonb_array_elements_text(doc.d->'lanes') AS w(lane)
    RETURNING payload->>'lane' AS lane
)
SELECT target.automation_id, target.version_id, inserted.id,
       (NOT %(admit)s OR EXISTS (SELECT FROM admitted)) AS admitted,
       -- As rows.wakes_statement: a lane with an idle worker listed is notified at commit.
       (SELECT count(pg_notify('{LANE_CHANNEL_PREFIX}' || idle.lane, '')) FROM (
            SELECT DISTINCT lane FROM workflows_idleworker
             WHERE lane IN (SELECT lane FROM woken) AND idle_until > now()) idle) AS notified
  FROM target LEFT JOIN inserted ON true
"""  # noqa: S608 (this module's constant fragments)

EXISTING_RUN = """
SELECT id, automation_id, version_id, input_digest, status FROM workflows_run
 WHERE org_id = %(org)s AND start_key = %(key)s
"""

# --- the API's authentication -----------------------------------------------------------------

# A key by its public prefix, with its organisation (services/tenancy.api_key_authenticate),
# on every API request. Prepared, and built into models by rows.model_from_row: the ORM's
# select_related get cost 1.2 ms of CPU per request, this 0.15 ms. The organisation's columns
# are named org_<field>; its id is the key's org_id.
API_KEY_WITH_ORG = """
SELECT k.id, k.org_id, k.name, k.prefix, k.key_hash, k.created_at, k.revoked_at,
       k.last_used_at, k.read_only, k.expires_at, k.scopes,
       -- On the database's clock, not the web process's: a key expires at the same instant
       -- for every process.
       COALESCE(k.expires_at <= now(), false) AS expired_now,
       (k.last_used_at IS NULL
        OR k.last_used_at < now() - make_interval(secs => %(touch_every)s)) AS touch_due,
       o.slug AS org_slug, o.name AS org_name, o.created_at AS org_created_at,
       o.quota_automations AS org_quota_automations, o.quota_versions AS org_quota_versions,
       o.quota_running_runs AS org_quota_running_runs,
       o.quota_starts_per_minute AS org_quota_starts_per_minute,
       o.quota_schedules AS org_quota_schedules,
       o.quota_pending_signals AS org_quota_pending_signals
  FROM workflows_apikey k JOIN workflows_organisation o ON o.id = k.org_id
 WHERE k.prefix = %(prefix)s
"""

# A published definition (cached for the life of the process: it never changes).
PUBLISHED_DEFINITION = """
SELECT definition::json AS definition FROM workflows_automationversion
 WHERE id = %(id)s AND published_at IS NOT NULL
"""

# What a version is called in a trace (engine/tracing.py): its automation's slug and its
# number. Read once per version and process, and only while tracing is on.
VERSION_LABEL = """
SELECT a.slug, v.number FROM workflows_automationversion v
  JOIN workflows_automation a ON a.id = v.automation_id
 WHERE v.id = %(id)s
"""

# Relay: a batch of unsent intents, locked so two relays never take the same rows, each with
# its age (the relay's lag, metrics.RELAY_LAG).
RELAY_BATCH = """
SELECT id, topic, payload::json AS payload,
       EXTRACT(EPOCH FROM now() - created_at)::float8 AS age_seconds
  FROM workflows_outbox
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

# --- retention ---------------------------------------------------------------------------------

# A batch of runs that finished before the retention horizon, oldest first (run_finished).
# The sweeper's lease: taken when free or lapsed, renewed by its holder. One row per name.
TAKE_LEASE = """
INSERT INTO workflows_sweeplease (name, holder, lease_until)
VALUES (%(name)s, %(holder)s, now() + make_interval(secs => %(lease)s))
ON CONFLICT (name) DO UPDATE
   SET holder = EXCLUDED.holder, lease_until = EXCLUDED.lease_until
 WHERE workflows_sweeplease.holder = EXCLUDED.holder
    OR workflows_sweeplease.lease_until <= now()
RETURNING holder
"""

RELEASE_LEASE = """
UPDATE workflows_sweeplease SET lease_until = now()
 WHERE name = %(name)s AND holder = %(holder)s
"""

FINISHED_RUNS_BEFORE = """
SELECT id FROM workflows_run
 WHERE finished_at < now() - make_interval(secs => %(age)s)
   AND status IN ('succeeded', 'failed', 'cancelled', 'compensated')
 ORDER BY finished_at
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED
"""

# Their history, steps, then the runs (one transaction per batch). A failed run may still be
# retried until it is purged; the status guard keeps a run retried meanwhile.
PURGE_RUN_EVENTS = "DELETE FROM workflows_runevent WHERE run_id = ANY(%(ids)s)"
PURGE_RUN_STEPS = "DELETE FROM workflows_step WHERE run_id = ANY(%(ids)s)"
PURGE_RUNS = """
DELETE FROM workflows_run
 WHERE id = ANY(%(ids)s) AND status IN ('succeeded', 'failed', 'cancelled', 'compensated')
"""

# The audit log's retention (services/audit.py::purge_audit): the purge says, for its own
# transaction only, before which instant entries may go (the append-only trigger lets those
# go and nothing else), then deletes a batch of them, oldest first (index audit_at).
AUDIT_PURGE_BEFORE = """
SELECT set_config('waymark.audit_purge_before',
                  (now() - make_interval(secs => %(age)s))::text, true)
"""
PURGE_AUDIT = """
DELETE FROM workflows_auditentry
 WHERE id = ANY(ARRAY(
       SELECT id FROM workflows_auditentry
        WHERE at < current_setting('waymark.audit_purge_before')::timestamptz
        ORDER BY at LIMIT %(batch)s))
"""

# The last resort when the walk itself fails on a settled step (an engine bug, a step type
# missing in this process, an output that is not JSON): fail the step and its run without
# walking, so the step is not re-run until poisoned, and a person sees the error.
FAIL_STEP_AND_RUN = f"""
WITH step AS (
    UPDATE workflows_step
       SET status = 'failed', error = %(error)s, owner = NULL, lease_until = NULL,
           finished_at = now()
     WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
 RETURNING run_id
)
UPDATE workflows_run r
   SET status = 'failed', error = %(error)s, finished_at = {RUN_FINISHED_AT}
  FROM step
 WHERE r.id = step.run_id AND r.status IN ('running', 'paused')
RETURNING r.id
"""  # noqa: S608 (this module's constant fragments)

# --- signals ------------------------------------------------------------------------------------

# A signal arrives: stored under its identity first (a duplicate inserts nothing and reads
# back the first one).
SIGNAL_INSERT = """
INSERT INTO workflows_signal
    (org_id, name, correlation, correlations, run_id, identity, payload, source,
     received_at, consumed_by)
VALUES (%(org_id)s, %(name)s, %(correlation)s, %(correlations)s, %(run_id)s, %(identity)s,
        %(payload)s, %(source)s, now(), '')
ON CONFLICT (org_id, identity) DO NOTHING
RETURNING id
"""

SIGNAL_BY_IDENTITY = """
SELECT id, name, correlation, run_id, consumed_at, consumed_by, dropped_at, received_at,
       received_at < now() - make_interval(secs => %(dedup)s) AS past_dedup
  FROM workflows_signal
 WHERE org_id = %(org_id)s AND identity = %(identity)s
"""

# A content-identified signal long since consumed or dropped: its identity is retired, so
# the same content sent again now is a new signal (a later run waiting on the same key).
SIGNAL_RETIRE_IDENTITY = """
UPDATE workflows_signal SET identity = left(identity, 150) || '@' || id::text
 WHERE id = %(id)s AND (consumed_at IS NOT NULL OR dropped_at IS NOT NULL)
"""

# The steps waiting for a signal like this one (step_awaits_signal index), oldest first.
SIGNAL_WAITERS = """
SELECT id, run_id, step_id, iteration
  FROM workflows_step
 WHERE status = 'waiting' AND wait_kind = 'external' AND org_id = %(org_id)s
   AND wait_detail->>'signal' = %(name)s
   AND (CASE WHEN %(run_id)s::bigint IS NULL
             THEN wait_detail->>'correlation'
                  = ANY(%(correlations)s::text[] || %(correlation)s::text)
             ELSE run_id = %(run_id)s::bigint END)
 ORDER BY id
 LIMIT 10
"""


class SignalWaiterRow(TypedDict):
    id: int
    run_id: int
    step_id: str
    iteration: int


SIGNAL_CONSUMED = """
UPDATE workflows_signal
   SET consumed_at = now(), consumed_by = %(by)s
 WHERE id = %(id)s AND consumed_at IS NULL AND dropped_at IS NULL
RETURNING id
"""

# A step entering a wait takes the oldest pending signal meant for it, if one came first,
# skipping one that another transaction is consuming. As SIGNALS_MATCHED_LATE, by the wait's
# key (signal_pending_keys) and by its run (signal_pending_run): it reads only the signals of
# that key, not every pending signal of the organisation with the name (a flood of 300,000
# nobody waited for cost each new wait 35 ms). The candidates are read unlocked and only the
# one taken is locked: a probe that locked the oldest of each kind held the one it did not
# take until its commit, so another wait for that key entering meanwhile skipped it and
# parked, and the pair, the signal long pending, was left to the sweep's next full pass.
# ("s.id + 0": no walk of the primary key in order; the few candidates are sorted.)
PENDING_SIGNAL_FOR = """
WITH candidates AS (
    SELECT k.id FROM workflows_signal k
     WHERE waymark_signal_keys_v1(k.org_id, k.name::text, k.correlation::text,
                                  k.correlations::text[])
           @> ARRAY[%(org_id)s::text || '/' || %(name)s || '/' || %(correlation)s]
       AND k.consumed_at IS NULL AND k.dropped_at IS NULL AND k.run_id IS NULL
    UNION ALL
    SELECT k.id FROM workflows_signal k
     WHERE k.run_id = %(run_id)s AND k.name = %(name)s
       AND k.consumed_at IS NULL AND k.dropped_at IS NULL AND k.run_id IS NOT NULL
)
SELECT s.id, s.payload::json AS payload, s.identity
  FROM workflows_signal s
 WHERE s.id IN (SELECT id FROM candidates)
   AND s.consumed_at IS NULL AND s.dropped_at IS NULL
 ORDER BY s.id + 0
 LIMIT 1
   FOR UPDATE OF s SKIP LOCKED
"""

# The sweep's backstop: pending signals that a waiting step matches (a signal and a wait
# that committed at the same moment each missed the other), a bounded batch. It goes from the
# waiting steps (step_awaits_signal) to the oldest signal each one matches: by its keys
# (signal_pending_keys, a GIN index over sql/functions.SIGNAL_KEYS_V1) or, for a signal sent
# to the step's run, by the run (signal_pending_run). Each probe reads only the signals of
# that exact key, so signals nobody waits for cost nothing however many there are. ("k.id +
# 0": the planner must not walk the signals' primary key in order, filtering, to find the
# oldest: that is every pending signal of every organisation.) While no signal is pending at
# all, the usual case, it reads no wait: the oldest pending signal is one probe of
# signal_pending_age (min(): not EXISTS, which the planner may answer by a sequential scan),
# checked once before the waits are read (without it, 100,000 runs waiting for a signal cost every
# sweep tick 100,000 probes, 2.9 s; benchmarks/scale.py).
SIGNALS_MATCHED_LATE = """
SELECT g.id, g.org_id, g.name, g.correlation, g.correlations, g.run_id, g.identity,
       g.payload::json AS payload
  FROM workflows_signal g
 WHERE g.id IN (
       SELECT m.id
         FROM workflows_step s
        CROSS JOIN LATERAL (
              (SELECT k.id FROM workflows_signal k
                WHERE waymark_signal_keys_v1(k.org_id, k.name::text, k.correlation::text,
                                             k.correlations::text[])
                      @> ARRAY[s.org_id::text || '/' || (s.wait_detail->>'signal') || '/'
                               || (s.wait_detail->>'correlation')]
                  AND k.consumed_at IS NULL AND k.dropped_at IS NULL AND k.run_id IS NULL
                ORDER BY k.id + 0
                LIMIT 1)
              UNION ALL
              (SELECT k.id FROM workflows_signal k
                WHERE k.run_id = s.run_id AND k.name = s.wait_detail->>'signal'
                  AND k.consumed_at IS NULL AND k.dropped_at IS NULL AND k.run_id IS NOT NULL
                ORDER BY k.id
                LIMIT 1)
        ) m
        WHERE s.status = 'waiting' AND s.wait_kind = 'external'
          AND s.wait_detail->>'signal' IS NOT NULL
          AND (SELECT min(p.received_at) FROM workflows_signal p
                WHERE p.consumed_at IS NULL AND p.dropped_at IS NULL) IS NOT NULL)
 ORDER BY g.id
 LIMIT %(n)s
"""

# The sweep's backstop, each tick between full passes (signals.LateMatching): only the
# pending signals received since the previous pass began, less a margin, each probed against
# the waits it could answer (step_awaits_signal by key; by run, step_run_id_iteration). A pair
# that missed each other had overlapping transactions, so its signal is that recent: the tick
# costs the signals just received, not every wait (100,000 runs waiting while one old signal
# nobody waits for stays pending made SIGNALS_MATCHED_LATE read every wait each tick).
SIGNALS_MATCHED_SINCE = """
SELECT g.id, g.org_id, g.name, g.correlation, g.correlations, g.run_id, g.identity,
       g.payload::json AS payload
  FROM workflows_signal g
 WHERE g.consumed_at IS NULL AND g.dropped_at IS NULL AND g.received_at >= %(since)s
   AND ((g.run_id IS NULL
         AND EXISTS (SELECT 1 FROM workflows_step s
                      WHERE s.status = 'waiting' AND s.wait_kind = 'external'
                        AND s.wait_detail->>'signal' = g.name
                        AND s.wait_detail->>'correlation'
                            = ANY(g.correlations::text[] || g.correlation::text)
                        AND s.org_id = g.org_id))
        OR (g.run_id IS NOT NULL
            AND EXISTS (SELECT 1 FROM workflows_step s
                         WHERE s.run_id = g.run_id AND s.status = 'waiting'
                           AND s.wait_kind = 'external'
                           AND s.wait_detail->>'signal' = g.name)))
 ORDER BY g.id
 LIMIT %(n)s
"""

# Unmatched signals past retention are dropped: the row stays as the record, its payload
# goes.
SIGNALS_DROP_OLD = """
UPDATE workflows_signal
   SET dropped_at = now(), payload = NULL
 WHERE id IN (SELECT id FROM workflows_signal
               WHERE consumed_at IS NULL AND dropped_at IS NULL
                 AND received_at < now() - make_interval(secs => %(age)s)
               ORDER BY received_at
               LIMIT 1000
                 FOR UPDATE SKIP LOCKED)  -- one being consumed now is not dropped
   AND consumed_at IS NULL AND dropped_at IS NULL
"""


# The settles' first statement: the run locked and the step's fenced transition, one round
# trip (steps._settling).
SETTLE_DONE_LOCKED = locked_run_then(SETTLE_DONE)
SETTLE_FAILED_LOCKED = locked_run_then(SETTLE_FAILED)

# A hop: a successful step's settle and its walk in one statement, when the run is still the
# version of its row the walk started from (functions.SETTLE_HOP_V1, hops.py). %(hop)s is one
# JSON object keyed by the function's parameter names, as each member of SETTLE_HOPS (a
# missing key is SQL NULL): the run's values are UPDATE_RUN's parameters (Walk._update_run),
# the settled step's are step_*. One document, encoded once: psycopg dumps a JSON parameter
# in Python, and a hop has seven.
SETTLE_HOP = """
SELECT r.outcome, r.run_xmin, r.taken_id
  FROM (SELECT %(hop)s::jsonb AS h) p,
       waymark_settle_hop_v1(
           (h->>'id')::bigint, (h->>'seen')::xid, (h->>'step')::bigint,
           (h->>'attempt')::integer, h->'step_output', h->'vars', h->'outputs',
           h->'entered', (h->>'steps')::integer, h->>'status', h->'output', h->>'error',
           h->'new_steps', h->'events', h->>'worker', h->>'taken_step',
           (h->>'taken_iteration')::integer) r
"""


class HopAnswerRow(TypedDict):
    """SETTLE_HOP's row: functions.SETTLE_HOP_V1's answer."""

    outcome: str  # 'settled'; 'fenced' or 'run_changed': nothing was written
    run_xmin: str | None  # the run row's version the hop wrote
    taken_id: int | None  # the step the hop wrote claimed for its worker


# Hops that finish together, as one statement (sql.functions.SETTLE_HOPS_V3): %(hops)s is a
# JSON array of SETTLE_HOP's parameters (hops.hops_together).
SETTLE_HOPS = """
SELECT n, outcome, run_xmin, taken_id FROM waymark_settle_hops_v3(%(hops)s) ORDER BY n
"""


class HopsAnswerRow(HopAnswerRow):
    """SETTLE_HOPS's row: a member's answer, as SETTLE_HOP's ('busy' too: see SETTLE_HOPS_V3)."""

    n: int  # the hop's place in the group, from 1


# --- scrape-time gauges (scrape.py) -------------------------------------------------------------
# Read when /metrics is scraped, each under a short statement_timeout. None counts history:
# finished runs and done steps grow without bound and are never counted.

# Per lane, its ready steps and how long the oldest has been claimable: the partial index
# step_claimable holds only ready steps (index-only once vacuumed).
METRICS_READY_STEPS = """
SELECT lane, count(*) AS ready,
       GREATEST(0, EXTRACT(EPOCH FROM now() - min(lease_until)))::float8 AS oldest_seconds
  FROM workflows_step
 WHERE status = 'ready'
 GROUP BY lane
"""

# Runs not finished, by status: from run_org_status_id (PostgreSQL 18 skips through its
# leading org column, reading only these statuses' entries; 25 ms at 1,000,000 runs).
METRICS_LIVE_RUNS = """
SELECT status, count(*) AS runs
  FROM workflows_run
 WHERE status IN ('running', 'paused')
 GROUP BY status
"""

# How long the oldest unsent outbox row has waited for the relay: one probe of outbox_unsent.
METRICS_OUTBOX_OLDEST = """
SELECT GREATEST(0, EXTRACT(EPOCH FROM now() - created_at))::float8 AS seconds
  FROM workflows_outbox
 WHERE sent_at IS NULL
 ORDER BY id
 LIMIT 1
"""
