"""Every SQL statement of timers and the due sweep, kept together.

Time is the database's now(). Rows are read by column name (the due batch's typed as
DueTimerRow). A timer is pending while it is neither fired nor cancelled (``fired_at IS NULL
AND cancelled_at IS NULL``, the predicate of both partial indexes).

Lock order. A batch takes its timers FOR UPDATE SKIP LOCKED (never waiting for anyone),
then their runs in run id order, each run before its steps (the engine's one lock order,
``waits.wake_step``): two batches that meet on the same runs queue behind each other, never
in a cycle. Whoever cancels a step holds its run already and wants its timer after it: the
other way round, so it skips a timer a batch holds (SKIP LOCKED), and that batch, getting
the run next, finds the step cancelled and records the timer so (MARK_FIRED).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict

# Enter a wait: the timer, written in the walk's transaction. When it is due before the
# sweeper's next look (one sweep interval), the sweeper is told at commit (the fast path);
# otherwise it finds it when it next reads the earliest instant.
INSERT_TIMER = """
WITH timer AS (
    INSERT INTO timers_timer
        (org_id, run_id, step_id, iteration, kind, intent, zone, spread_seconds,
         offset_seconds, due_at, error, created_at)
    VALUES (%(org_id)s, %(run_id)s, %(step_id)s, %(iteration)s, %(kind)s, %(intent)s,
            %(zone)s, %(spread)s, %(offset)s, %(due_at)s, '', now())
    ON CONFLICT (run_id, step_id, iteration) DO UPDATE
       SET intent = EXCLUDED.intent, zone = EXCLUDED.zone,
           spread_seconds = EXCLUDED.spread_seconds, offset_seconds = EXCLUDED.offset_seconds,
           due_at = EXCLUDED.due_at, fired_at = NULL, cancelled_at = NULL, error = ''
    RETURNING id, due_at
)
SELECT timer.id, timer.due_at,
       CASE WHEN timer.due_at < now() + make_interval(secs => %(soon)s)
            THEN pg_notify('waymark_timers', '') END AS told
  FROM timer
"""

# Seconds until the earliest pending timer of one part (negative: overdue; NULL: none). A
# sweeper's firing threads each serve one part of the timers (mod(run_id, parts) = part; one
# part: all of them), so one thread's batch never delays a timer another is free to fire.
# A part is a set of runs, not of timers: all the timers of one run are one thread's, so two
# threads never lock the same run (split by timer id, two batches took the same runs'
# locks in opposite orders and deadlocked).
# From the clock, not now(): read at the end of a batch, in its transaction, now() would be
# the batch's start and the sweeper would oversleep by the batch's length.
NEXT_DUE = """
SELECT EXTRACT(EPOCH FROM min(due_at) - clock_timestamp())::float AS seconds
  FROM timers_timer
 WHERE fired_at IS NULL AND cancelled_at IS NULL
   AND org_id > 0  -- the timer_next_due index (see its comment)
   AND mod(run_id, %(parts)s) = %(part)s
"""

# One fair batch of due timers, locked (FOR UPDATE SKIP LOCKED: a second sweeper, or a
# batch still committing, is skipped, never waited for):
#  1. `orgs` walks the organisations with pending timers with a loose index scan (one
#     index probe per organisation, whatever its backlog), keeping those whose earliest
#     timer is due, at most %(scan)s organisations;
#  2. `chosen` takes the %(orgs)s least recently served of them;
#  3. each gets an equal share of the batch, read by a bounded LATERAL scan of its own
#     (org_id, due_at) index range, earliest first.
# All of it within one part of the timers (see NEXT_DUE).
# So one organisation's 200,000 due timers cannot delay another's ten: the cost of a batch
# grows with the batch, not with the backlog.
DUE_BATCH = """
WITH RECURSIVE orgs(org_id, depth) AS (
    (SELECT org_id, 1 FROM timers_timer
      WHERE fired_at IS NULL AND cancelled_at IS NULL AND mod(run_id, %(parts)s) = %(part)s
      ORDER BY org_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.org_id FROM timers_timer t
             WHERE t.fired_at IS NULL AND t.cancelled_at IS NULL AND t.org_id > orgs.org_id
               AND mod(t.run_id, %(parts)s) = %(part)s
             ORDER BY t.org_id LIMIT 1),
           orgs.depth + 1
      FROM orgs WHERE orgs.org_id IS NOT NULL AND orgs.depth < %(scan)s
),
due_orgs AS (
    -- Ordered by (org_id, due_at) so that only the organisation's own index range
    -- (timer_pending) can serve it, even with statistics taken before a backlog grew.
    SELECT orgs.org_id FROM orgs
     WHERE orgs.org_id IS NOT NULL
       AND (SELECT t.due_at FROM timers_timer t
             WHERE t.org_id = orgs.org_id AND t.fired_at IS NULL AND t.cancelled_at IS NULL
               AND mod(t.run_id, %(parts)s) = %(part)s
             ORDER BY t.org_id, t.due_at LIMIT 1) <= now()
),
chosen AS (
    SELECT d.org_id
      FROM due_orgs d LEFT JOIN timers_orgsweep s ON s.org_id = d.org_id
     ORDER BY s.served_at NULLS FIRST, d.org_id
     LIMIT %(orgs)s
),
share AS (
    SELECT GREATEST(1, %(batch)s / NULLIF(count(*), 0)) AS n FROM chosen
),
batch AS (
    SELECT t.*
      FROM chosen
     CROSS JOIN share
     CROSS JOIN LATERAL (
          SELECT id, org_id, run_id, step_id, iteration, kind, intent, zone, offset_seconds,
                 created_at, due_at
            FROM timers_timer
           WHERE org_id = chosen.org_id AND fired_at IS NULL AND cancelled_at IS NULL
             AND due_at <= now() AND mod(run_id, %(parts)s) = %(part)s
           ORDER BY org_id, due_at
           LIMIT share.n
             FOR UPDATE SKIP LOCKED
     ) t
)
SELECT t.id, t.org_id, t.run_id, t.step_id, t.iteration, t.kind, t.intent::json AS intent,
       t.zone, t.offset_seconds, t.created_at, t.due_at,
       EXTRACT(EPOCH FROM now() - t.due_at)::float AS late_seconds,
       step.id AS step_pk,  -- the waiting step (NULL: its walk failed before writing it)
       -- When the sweeper looks next: seconds from the clock to the part's earliest timer
       -- left pending by this batch (as NEXT_DUE; NULL: none), read here so the batch's end
       -- needs no query of its own (it is sent with the last wake's writes).
       (SELECT EXTRACT(EPOCH FROM min(x.due_at) - clock_timestamp())::float
          FROM timers_timer x
         WHERE x.fired_at IS NULL AND x.cancelled_at IS NULL AND x.org_id > 0
           AND mod(x.run_id, %(parts)s) = %(part)s
           AND x.id NOT IN (SELECT id FROM batch)) AS next_seconds
  FROM batch t
  LEFT JOIN workflows_step step
         ON step.run_id = t.run_id AND step.step_id = t.step_id AND step.iteration = t.iteration
 -- The order the batch wakes its timers in, so the order it locks their runs in: by run id,
 -- as every path that locks several runs does (a group settle too).
 ORDER BY t.run_id, t.id
"""


class DueTimerRow(TypedDict):
    """DUE_BATCH's row: a due timer, its waiting step, and when the sweeper looks next."""

    id: int
    org_id: int
    run_id: int
    step_id: str
    iteration: int
    kind: str  # the step type: wait, wait_until
    intent: dict[str, Any]  # what the step asked, as written (free-form per kind: models.Timer)
    zone: str
    offset_seconds: float
    created_at: datetime
    due_at: datetime
    late_seconds: float
    step_pk: int | None  # the waiting step (None: its walk failed before writing it)
    next_seconds: float | None


# The batch's timers spent: fired (with an error when firing raised), or cancelled when
# their step was cancelled before the batch got its run (a cancel that skipped the timer,
# locked by this batch; see the lock order above). A timer the batch cancelled itself (its
# walk ended the run: the step's cancel cancelled its timer) is left as it is.
MARK_FIRED = """
WITH spent AS (
    SELECT data.id, data.error,
           EXISTS (SELECT 1 FROM workflows_step s
                    WHERE s.run_id = t.run_id AND s.step_id = t.step_id
                      AND s.iteration = t.iteration AND s.status = 'cancelled') AS cancelled
      FROM unnest(%(ids)s::bigint[], %(errors)s::text[]) AS data(id, error)
      JOIN timers_timer t ON t.id = data.id
)
UPDATE timers_timer
   -- The moment it was fired, not the batch transaction's start (now()).
   SET fired_at = CASE WHEN spent.cancelled THEN NULL ELSE clock_timestamp() END,
       cancelled_at = CASE WHEN spent.cancelled THEN clock_timestamp() END,
       error = spent.error
  FROM spent
 WHERE timers_timer.id = spent.id
   AND timers_timer.fired_at IS NULL AND timers_timer.cancelled_at IS NULL
"""

MARK_SERVED = """
INSERT INTO timers_orgsweep (org_id, served_at)
SELECT DISTINCT unnest(%(orgs)s::bigint[]), now()
ON CONFLICT (org_id) DO UPDATE SET served_at = EXCLUDED.served_at
"""

# Recomputing: the pending timers (for a tz database update), a bounded page at a time.
PENDING_PAGE = """
SELECT t.id, t.org_id, t.run_id, t.step_id, t.iteration, t.kind,
       t.intent::json AS intent, t.zone, t.spread_seconds, t.offset_seconds, t.due_at,
       t.created_at
  FROM timers_timer t
 WHERE t.fired_at IS NULL AND t.cancelled_at IS NULL AND t.id > %(after)s
 ORDER BY t.id
 LIMIT %(n)s
   FOR UPDATE SKIP LOCKED
"""


# What a timer's zone template reads: the run's data now.
RUN_DATA = """
SELECT id, input::json AS input, vars::json AS vars, outputs::json AS outputs, created_at
  FROM workflows_run
 WHERE id = %(run_id)s
"""

RECOMPUTED = """
UPDATE timers_timer SET due_at = %(due_at)s, zone = %(zone)s
 WHERE id = %(id)s AND fired_at IS NULL AND cancelled_at IS NULL
RETURNING id
"""


# A waiting step cancelled (its run cancelled, failed or ended by another branch, its fork
# completed without it): its pending timer is cancelled with it, in the same transaction, by
# a trigger the timers app installs on the engine's steps (the engine knows nothing of
# timers). It skips a timer a firing batch holds: that batch waits for the run this
# transaction holds, then finds the step cancelled and marks the timer so itself.
# Its current text: migration 0005 installed it with its own frozen copy, and
# tests/test_schema_functions.py checks the migrated database holds exactly this. A shipped
# version is never edited: a change is a new version (``_v2``) and a migration.
CANCEL_WITH_STEP_V1 = """
CREATE OR REPLACE FUNCTION timers_cancel_with_step_v1() RETURNS trigger
LANGUAGE plpgsql AS $function$
BEGIN
    UPDATE timers_timer SET cancelled_at = clock_timestamp()
     WHERE id IN (SELECT t.id FROM timers_timer t
                   WHERE t.run_id = NEW.run_id AND t.step_id = NEW.step_id
                     AND t.iteration = NEW.iteration
                     AND t.fired_at IS NULL AND t.cancelled_at IS NULL
                     FOR UPDATE SKIP LOCKED);
    RETURN NULL;
END
$function$;

CREATE TRIGGER timers_cancel_with_step
 AFTER UPDATE OF status ON workflows_step
 FOR EACH ROW WHEN (OLD.status = 'waiting' AND NEW.status = 'cancelled')
 EXECUTE FUNCTION timers_cancel_with_step_v1();
"""


# --- health checks (timers/health.py) ------------------------------------------------------------

# The timers' answer for the waits they park steps on (workflows.plugins.register_wait_answer):
# a boolean over the waiting step `s`, true while its timer is pending (the unique index on
# run, step and iteration). False: the row is gone, or it was fired or cancelled without
# waking the step, and nothing else will.
TIMER_HOLDS_WAIT = """
EXISTS (SELECT 1 FROM timers_timer t
         WHERE t.run_id = s.run_id AND t.step_id = s.step_id AND t.iteration = s.iteration
           AND t.fired_at IS NULL AND t.cancelled_at IS NULL)
""".strip()

# Pending timers due more than %(late)s seconds ago: the due sweep fires them on time, so
# these mean no sweeper leads, or its firing fails. The timer_next_due index, from its
# earliest end (its predicate, org_id > 0, is named to match it), up to %(cap)s.
OVERDUE_TIMERS = """
WITH overdue AS (
    SELECT id, org_id, run_id, step_id, iteration, kind, due_at
      FROM timers_timer
     WHERE fired_at IS NULL AND cancelled_at IS NULL AND org_id > 0
       AND due_at < now() - make_interval(secs => %(late)s)
       AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))
     ORDER BY due_at
     LIMIT %(cap)s
)
SELECT (SELECT count(*) FROM overdue) AS total, o.id, o.org_id, o.run_id, o.step_id,
       o.iteration, o.kind, EXTRACT(EPOCH FROM now() - o.due_at)::float AS late_seconds
  FROM (SELECT * FROM overdue ORDER BY due_at LIMIT %(examples)s) o
 ORDER BY o.due_at
"""

# Steps waiting on a timer (wait_detail.parked_on "timer:<id>", no deadline of their own)
# whose timer is not pending: nothing will ever wake them. From the waiting steps without a
# wake time, each checked by the unique index; with what became of its timer, if it is there.
WAITS_WITHOUT_TIMER = f"""
WITH lost AS (
    SELECT s.id, s.org_id, s.run_id, s.step_id, s.iteration
      FROM workflows_step s
     WHERE s.status = 'waiting' AND s.wait_kind = 'external' AND s.wake_at IS NULL
       AND split_part(s.wait_detail->>'parked_on', ':', 1) = 'timer'
       AND NOT {TIMER_HOLDS_WAIT}
       AND (%(orgs)s::bigint[] IS NULL OR s.org_id = ANY(%(orgs)s::bigint[]))
     LIMIT %(cap)s
)
SELECT (SELECT count(*) FROM lost) AS total, l.org_id, l.run_id, l.step_id, l.iteration,
       t.id AS timer_id, t.fired_at IS NOT NULL AS fired, t.cancelled_at IS NOT NULL AS cancelled,
       left(t.error, 200) AS error
  FROM (SELECT * FROM lost ORDER BY id LIMIT %(examples)s) l
  LEFT JOIN timers_timer t
         ON t.run_id = l.run_id AND t.step_id = l.step_id AND t.iteration = l.iteration
 ORDER BY l.id
"""  # noqa: S608 (this module's constant fragments)

# --- the control room (timers/control_room.py) ---------------------------------------------------

# The earliest pending timer of the staff member's organisations (%(orgs)s), and how late it
# is (negative: not due yet): one probe of timer_pending (org, due_at) per organisation.
EARLIEST_PENDING_TIMER = """
SELECT t.id, t.org_id, t.run_id, t.step_id, t.iteration, t.kind,
       EXTRACT(EPOCH FROM now() - t.due_at)::float AS late_seconds
  FROM unnest(%(orgs)s::bigint[]) o(id)
 CROSS JOIN LATERAL (
       SELECT id, org_id, run_id, step_id, iteration, kind, due_at FROM timers_timer
        WHERE org_id = o.id AND fired_at IS NULL AND cancelled_at IS NULL
        ORDER BY due_at
        LIMIT 1) t
 ORDER BY t.due_at
 LIMIT 1
"""

# --- scrape-time gauge (timers/metrics.py) -------------------------------------------------------

# How late the earliest pending timer is (0: none is due): one probe of timer_next_due. It
# grows while no sweeper fires, which the lateness of fired timers cannot show.
METRICS_OVERDUE = """
SELECT GREATEST(0, EXTRACT(EPOCH FROM now() - min(due_at)))::float8 AS seconds
  FROM timers_timer
 WHERE fired_at IS NULL AND cancelled_at IS NULL
   AND org_id > 0  -- the timer_next_due index (see its comment)
"""

# A migration between versions renamed the waiting step (workflows.plugins.StepRename): its
# timer follows it, fired or not, so the sweep still finds the step its timer wakes. The
# migration holds the run's lock and its lock waits are bounded (a batch firing this timer
# holds the row and waits for the run: the migration gives way and tries again later).
RENAME_TIMER = """
UPDATE timers_timer
   SET step_id = %(new_step_id)s, iteration = %(new_iteration)s
 WHERE run_id = %(run)s AND step_id = %(step_id)s AND iteration = %(iteration)s
"""

# --- erasing a person (erasure.py): conditions for workflows.plugins.erasure.scrub_rows --------

TIMERS_OF_RUNS = "org_id = %(org)s AND run_id = ANY(%(runs)s)"
SCHEDULES_OF_ORG = "org_id = %(org)s"
