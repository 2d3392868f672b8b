"""Every SQL statement of the approvals app, kept together (the ORM does the rest).

A request's state changes are guarded UPDATEs: the WHERE clause names the state the change
starts from (``status = 'pending'``, and the deadline where it matters), so a decision, a
deadline, an escalation and a cancel that race each other settle on one winner; callers
check the row count or read the row again. Time is the database's now(), never a process's
clock. Parameters are named (``%(name)s``); statements name every column they return, and
rows are read by name (``fetch_dict``/``fetch_dicts`` from the engine's door).

``slack_stale`` is set whenever the state a request's Slack messages show changes, so the
sweep's ``update_slack`` edits them (only when some were posted).
"""

from __future__ import annotations

# --- requests (approvals/services.py, approvals/steptypes.py, approvals/sweep.py) ------------

# A person's decision (approve, reject, a task's submitted answer). Guarded on pending and not
# yet expired: a deadline that passed or a decision that committed first wins; the caller
# holds the row's lock, so the guard only ever confirms what it checked.
DECIDE = """
UPDATE approvals_approvalrequest
   SET status = %(status)s, decided_by = %(decided_by)s, decided_via = %(decided_via)s,
       decided_at = now(), comment = %(comment)s, answer = %(answer)s::jsonb,
       updated_at = now(), slack_stale = slack_messages <> '[]'::jsonb,
       next_reminder_at = NULL
 WHERE id = %(approval_id)s AND status = 'pending' AND expires_at > now()
"""

# A request of an earlier series of attempts (an operator's retry started a new one) that is
# still pending: closed, so nobody decides it any more. A decision that commits first wins.
CANCEL_PENDING = """
UPDATE approvals_approvalrequest
   SET status = 'cancelled', updated_at = now(), next_reminder_at = NULL,
       slack_stale = slack_messages <> '[]'::jsonb
 WHERE id = %(approval_id)s AND status = 'pending'
"""

# The deadline passed and the step escalates: once (level 0 to 1), to the escalate_to people,
# with a new deadline and its reminders started over. Guarded on the deadline having passed
# by the database's clock, so a decision just before it wins.
ESCALATE = """
UPDATE approvals_approvalrequest
   SET level = 1, approvers = escalate_to, updated_at = now(),
       expires_at = now() + make_interval(secs => %(seconds)s),
       slack_stale = slack_messages <> '[]'::jsonb, reminders_sent = 0,
       next_reminder_at = NULL
 WHERE id = %(approval_id)s AND status = 'pending' AND level = 0 AND expires_at <= now()
"""

# The deadline passed with no decision and no escalation left: expired (the step's
# on_timeout decides what the run does next).
EXPIRE = """
UPDATE approvals_approvalrequest
   SET status = 'expired', decided_by = 'deadline', decided_via = 'deadline',
       decided_at = now(), updated_at = now(), next_reminder_at = NULL,
       slack_stale = slack_messages <> '[]'::jsonb
 WHERE id = %(approval_id)s AND status = 'pending' AND expires_at <= now()
"""

# The sweep: pending requests whose step ended another way (its run cancelled, failed,
# migrated) are cancelled, a bounded batch per pass. The step's status is checked again in
# the outer WHERE, on the rows the UPDATE locks, not only in the batch's subquery.
CLOSE_ORPHANS = """
UPDATE approvals_approvalrequest a
   SET status = 'cancelled', updated_at = now(), next_reminder_at = NULL,
       slack_stale = a.slack_messages <> '[]'::jsonb
  FROM workflows_step s
 WHERE a.id IN (SELECT a2.id FROM approvals_approvalrequest a2
                  JOIN workflows_step s2 ON s2.id = a2.step_row_id
                 WHERE a2.status = 'pending' AND s2.status = ANY(%(finished)s)
                 LIMIT %(batch)s)
   AND s.id = a.step_row_id AND a.status = 'pending' AND s.status = ANY(%(finished)s)
"""

# The sweep: requests whose next reminder is due, the most overdue first (each is then
# claimed under its row lock before the reminder is sent).
DUE_REMINDERS = """
SELECT id FROM approvals_approvalrequest
 WHERE status = 'pending' AND next_reminder_at <= now()
 ORDER BY next_reminder_at
 LIMIT %(batch)s
"""

# --- Slack clicks (approvals/inbox.py) --------------------------------------------------------

# A click's reply is claimed before it is sent: at most once, whoever sends it.
CLAIM_REPLY = """
UPDATE approvals_slackinteraction SET replied_at = now()
 WHERE id = %(interaction_id)s AND applied_at IS NOT NULL AND replied_at IS NULL
   AND response_url <> ''
RETURNING approval_id, response_url, reply
"""

# Replies still owed while Slack accepts them (a response_url lives 30 minutes).
OWED_REPLIES = """
SELECT id FROM approvals_slackinteraction
 WHERE applied_at > now() - interval '25 minutes' AND replied_at IS NULL
   AND response_url <> ''
 ORDER BY applied_at
 LIMIT %(batch)s
"""

# Applied clicks older than the retention are deleted, a bounded batch per pass.
PURGE_CLICKS = """
DELETE FROM approvals_slackinteraction WHERE id IN (
  SELECT id FROM approvals_slackinteraction
   WHERE applied_at < now() - make_interval(days => %(keep_days)s)
   LIMIT 1000)
"""

# A migration between versions renamed the step (workflows.plugins.StepRename): its requests
# follow it (the executor finds its request by run, step and iteration when it runs again).
# Buttons already posted name the old step in their token and are refused until the sweep
# updates the messages (``slack_stale``), which gives them new tokens. The migration holds the
# run's lock and bounds its lock waits: a decision that holds the request (and wants the run
# next) is not waited for into a deadlock; the migration gives way and tries again later.
RENAME_REQUESTS = """
UPDATE approvals_approvalrequest
   SET step_id = %(new_step_id)s, iteration = %(new_iteration)s, updated_at = now(),
       slack_stale = slack_messages <> '[]'::jsonb
 WHERE run_id = %(run)s AND step_id = %(step_id)s AND iteration = %(iteration)s
"""

# --- erasing a person (erasure.py): conditions for workflows.plugins.erasure.scrub_rows --------

REQUESTS_OF_RUNS = "org_id = %(org)s AND run_id = ANY(%(runs)s)"
ATTEMPTS_OF_RUNS = """
org_id = %(org)s AND approval_id IN (
    SELECT id FROM approvals_approvalrequest WHERE org_id = %(org)s AND run_id = ANY(%(runs)s))
"""
INTERACTIONS_OF_RUNS = """
approval_id IN (
    SELECT id FROM approvals_approvalrequest WHERE org_id = %(org)s AND run_id = ANY(%(runs)s))
"""
ATTEMPTS_OF_ORG = "org_id = %(org)s"
INTERACTIONS_OF_ORG = "org_id = %(org)s"
PENDING_CONTENT_OF_RUNS = """
SELECT id, content::text AS content, digest FROM approvals_approvalrequest
 WHERE org_id = %(org)s AND run_id = ANY(%(runs)s) AND status = 'pending'
 ORDER BY id FOR UPDATE
"""
REBIND_DIGEST = "UPDATE approvals_approvalrequest SET digest = %(digest)s WHERE id = %(id)s"
