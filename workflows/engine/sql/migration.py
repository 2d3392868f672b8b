"""The statements of a migration of runs between versions (services/run_migration/).

Which runs a plan matches and what would become of each is one statement (``_VERDICTS``):
the runs of the filter (on the old version, in the statuses asked, at one of the steps asked)
by the index ``run_org_automation_id``, their live steps by the steps' ``(run, step id,
iteration)`` key, each step classified by the plan (the mapping as one JSON object, so the
statement's text never depends on the plan), each run by its steps. The dry run counts it
(``DRY_RUN``: cheap at thousands of runs, nothing locked); the job reads the runs to try from
it (``CANDIDATES``) and then moves each one under its lock, where the same rules are checked
again in Python (services/run_migration/move.py) on the rows as they are then.

Shared parameters: %(org)s, %(automation)s, %(from)s (the old version's id), %(statuses)s
(run statuses), %(steps)s (the current-step filter; empty: any), %(targets)s (JSON: old step
id -> new step id), %(unmapped)s (JSON: old step id -> why it has no new one), %(move_to)s
(the removed-step rule's step, or NULL: stay), %(decided)s (code runs between versions of
their code: every live step keeps its id, the one its code asked for), %(continuation)s (the
walk's continuation row's step id), %(join_wait)s (a fork's join row's wait_kind),
%(sagas)s (whether the old version declares compensations: only then can a run of it be
compensating), %(after)s (only runs with a greater id).
"""

from __future__ import annotations

# Why a run is not moved now but may be later in the same job (its step settles, its walk's
# continuation runs): the job tries such runs again. Every other reason is final for the plan.
BUSY_REASONS = ("step_running", "mid_walk")

# A run whose saga is being undone (it has a run.compensating event and is still live): the
# plan of its compensation names the old version's step ids, and the steps it undoes are the
# old version's. It is never moved (a final reason: the same whatever the job retries).
COMPENSATING = "compensating"

_VERDICTS = """
WITH runs AS (
    SELECT r.id,
           %(sagas)s::boolean AND EXISTS (
               SELECT 1 FROM workflows_runevent e
                WHERE e.run_id = r.id AND e.kind = 'run.compensating') AS compensating
      FROM workflows_run r
     WHERE r.org_id = %(org)s AND r.automation_id = %(automation)s
       AND r.version_id = %(from)s AND r.status = ANY(%(statuses)s::text[])
       AND r.id > %(after)s
       AND (cardinality(%(steps)s::text[]) = 0 OR EXISTS (
            SELECT 1 FROM workflows_step f
             WHERE f.run_id = r.id AND f.status IN ('ready', 'running', 'waiting')
               AND f.step_id = ANY(%(steps)s::text[])))
),
live AS (
    SELECT s.run_id, s.step_id,
           CASE WHEN s.step_id = %(continuation)s THEN NULL
                WHEN %(targets)s::jsonb ? s.step_id OR %(decided)s THEN 'mapped'
                WHEN %(move_to)s::text IS NOT NULL THEN 'move_to' END AS how,
           CASE WHEN s.step_id = %(continuation)s THEN NULL
                ELSE coalesce(%(targets)s::jsonb ->> s.step_id,
                              CASE WHEN %(decided)s THEN s.step_id END,
                              %(move_to)s::text) END AS target,
           -- A run is never moved mid-step: a running step (claimed by a worker) or the
           -- walk's continuation (its next steps not entered yet) puts it off.
           CASE WHEN s.step_id = %(continuation)s THEN 'mid_walk'
                -- A fork's join row, removed: its branches would arrive nowhere.
                WHEN s.wait_kind = %(join_wait)s
                     AND NOT (%(targets)s::jsonb ? s.step_id OR %(decided)s)
                    THEN 'join_removed'
                WHEN s.status = 'running' THEN 'step_running'
                WHEN %(targets)s::jsonb ? s.step_id OR %(decided)s
                     OR %(move_to)s::text IS NOT NULL THEN NULL
                ELSE coalesce(%(unmapped)s::jsonb ->> s.step_id, 'step_removed') END AS reason
      FROM runs JOIN workflows_step s ON s.run_id = runs.id
     WHERE s.status IN ('ready', 'running', 'waiting')
),
-- Why each run is not moved (NULL: it is): a final reason before a passing one; a run whose
-- saga is being undone, whatever its steps.
verdicts AS (
    SELECT runs.id AS run_id,
           CASE WHEN runs.compensating THEN 'compensating' ELSE
           (array_agg(l.reason ORDER BY l.reason IN ('step_running', 'mid_walk'), l.reason)
                FILTER (WHERE l.reason IS NOT NULL))[1] END AS reason
      FROM runs LEFT JOIN live l ON l.run_id = runs.id
     GROUP BY runs.id, runs.compensating
)
"""

# The dry run: per current step, where its runs go (or why they stay, which may be another of
# their steps), and per outcome, how many runs, each with a bounded sample of run ids.
DRY_RUN = (
    _VERDICTS  # noqa: S608 (constant SQL joined with constant SQL)
    + """
SELECT
    (SELECT coalesce(json_agg(json_build_object(
                'step_id', g.step_id, 'to', g.target, 'how', g.how, 'cannot', g.reason,
                'runs', g.runs, 'sample', g.sample)
            ORDER BY g.step_id, g.reason NULLS FIRST, g.target), '[]'::json)
       FROM (SELECT l.step_id, l.target, l.how, v.reason, count(*) AS runs,
                    (array_agg(l.run_id ORDER BY l.run_id))[1:%(sample)s] AS sample
               FROM live l JOIN verdicts v ON v.run_id = l.run_id
              GROUP BY l.step_id, l.target, l.how, v.reason) g) AS steps,
    (SELECT coalesce(json_agg(json_build_object(
                'cannot', o.reason, 'runs', o.runs, 'sample', o.sample)
            ORDER BY o.reason NULLS FIRST), '[]'::json)
       FROM (SELECT v.reason, count(*) AS runs,
                    (array_agg(v.run_id ORDER BY v.run_id))[1:%(sample)s] AS sample
               FROM verdicts v GROUP BY v.reason) o) AS outcomes
"""
)

# The job's next runs to try, in id order: those the plan moves, and those put off for now
# (a running step, a continuation), which the move itself checks again under the run's lock.
CANDIDATES = (
    _VERDICTS
    + """
SELECT run_id, reason FROM verdicts
 WHERE reason IS NULL OR reason IN ('step_running', 'mid_walk')
 ORDER BY run_id
 LIMIT %(n)s
"""
)

# --- one run's move, under its lock (the run locked first: LOCK_RUN) -------------------------

# A lock the move waits for longer than this is someone else's work in progress (a timer
# batch firing the run's timer, a decision on its request, a settle of a step): they want the
# run's lock next, which the move holds. The move gives way (its transaction rolls back, the
# job tries the run again later) instead of waiting for a deadlock to be detected.
LOCK_TIMEOUT = "SET LOCAL lock_timeout = '250ms'"

# The run's live steps, locked (after the run: the one lock order). A worker's claim skips
# locked rows, so no step of the run can be claimed while it moves.
LIVE_STEPS_LOCKED = """
SELECT id, step_id, iteration, type, status, wait_kind, fork_join_id, branch
  FROM workflows_step
 WHERE run_id = %(run)s AND status IN ('ready', 'running', 'waiting')
 ORDER BY id
   FOR UPDATE
"""

# Whether the run's saga is being undone (its compensation began: a run.compensating event).
RUN_COMPENSATING = """
SELECT id FROM workflows_runevent
 WHERE run_id = %(run)s AND kind = 'run.compensating'
 LIMIT 1
"""

# What migrations did to the run since this job was made (and ever, by this job): each
# run.migrated event, and each run.migration_skipped this job recorded, with its job. A job
# checks it before anything else, the version filter included: a run it moved and another job
# moved back is on the old version again, and is still never moved twice.
MOVES_SINCE_JOB = """
SELECT e.kind, e.detail->>'migration' AS migration
  FROM workflows_runevent e
  JOIN workflows_runmigration m ON m.id = %(migration)s
 WHERE e.run_id = %(run)s AND e.kind IN ('run.migrated', 'run.migration_skipped')
   AND (e.at >= m.created_at OR e.detail->>'migration' = %(migration)s::text)
 ORDER BY e.id
"""

# The rows of the run (finished ones too) of the step ids a move renames, or renames onto:
# every row of a renamed step takes its new id, and an iteration no row of that id keeps.
STEP_ROWS = """
SELECT id, step_id, iteration, status FROM workflows_step
 WHERE run_id = %(run)s AND step_id = ANY(%(ids)s::text[])
 ORDER BY step_id, iteration
"""

# The run's failed steps when it moves: a live run's failures were all followed by a path of
# their own (the run went on), so an operator's retry never runs one of them again (the
# run.migrated event lists them: services/control.py).
FAILED_STEP_IDS = """
SELECT id FROM workflows_step WHERE run_id = %(run)s AND status = 'failed' ORDER BY id
"""

# The run onto the new version, with its template data's step ids renamed (outputs, entered:
# computed under the run's lock from the row LOCK_RUN read, with no step running, so nothing
# can have merged into them meanwhile). Guarded on the version and status it was read with.
MIGRATE_RUN = """
UPDATE workflows_run
   SET version_id = %(to)s, outputs = %(outputs)s, entered = %(entered)s
 WHERE id = %(id)s AND version_id = %(from)s AND status IN ('running', 'paused')
RETURNING id
"""

# A decided run's deciders deferred for want of its version's code (a worker without it
# defers the turn, 30 s at a time: workflows/code, workflow_version_missing): due now, so
# the turns run on the version the run has just moved to. The run's decider and its
# branches' (a ctx.parallel's, each a step of the decider's type). Only a deferral that is
# the step's latest event (its code, as the step type gave it: never its message's text): a
# ctx.run's retry backoff keeps its own time.
WAKE_DEFERRED_DECIDER = """
UPDATE workflows_step s
   SET wake_at = now()
 WHERE s.run_id = %(run)s AND s.type = %(decider_type)s AND s.status = 'waiting'
   AND s.wait_kind = 'retry' AND s.wake_at > now()
   AND (SELECT e.kind = 'step.deferred' AND e.detail->>'code' = 'workflow_version_missing'
          FROM workflows_runevent e
         WHERE e.run_id = s.run_id AND e.step_id = s.step_id AND e.iteration = s.iteration
         ORDER BY e.id DESC LIMIT 1)
"""

# A step row (live but not running, or finished) takes its new id, and iteration. A live
# one's wait (wait_kind, wake_at, wait_detail: a deadline, a signal's name and key) stays as
# it was made; a finished one keeps its outcome. No step of the run runs (checked under the
# run's lock, its live steps locked); a finished row changes only by an operator's retry,
# which takes the run's lock first.
RENAME_STEP = """
UPDATE workflows_step
   SET step_id = %(new_step_id)s, iteration = %(new_iteration)s
 WHERE id = %(step_pk)s AND run_id = %(run)s AND step_id = %(step_id)s
   AND status IN ('ready', 'waiting', 'done', 'failed', 'cancelled')
RETURNING id
"""

# A live step on a removed step, under the rule move_to: cancelled (its timer with it: the
# timers app's trigger; an approval's request is closed by approvals' sweep), and the walk
# enters the rule's step in its place.
CANCEL_MOVED_STEPS = """
UPDATE workflows_step
   SET status = 'cancelled', owner = NULL, lease_until = NULL, wait_kind = '', wake_at = NULL,
       finished_at = now()
 WHERE run_id = %(run)s AND id = ANY(%(ids)s::bigint[]) AND status IN ('ready', 'waiting')
RETURNING id, step_id, iteration, attempt, fork_join_id, branch
"""

# The job's count, in the transaction of each move: exact whatever stops the job.
COUNT_MOVED = """
UPDATE workflows_runmigration SET moved = moved + 1, updated_at = now() WHERE id = %(id)s
"""
