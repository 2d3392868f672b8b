"""The admin's control room (workflows/admin/control_room.py): what it reads of the runs.

Both statements are given the organisations the staff member sees, as %(orgs)s (every
organisation's id for a superuser), and read each one's own range of an index: their cost
follows what happened in the window, capped, never the size of the history.
"""

from __future__ import annotations

# Runs created in the last hour and the last day, by their status now: one capped count per
# (status, window), each an index-only read of run_org_status_created (org, status,
# created_at): the window's range of each organisation in turn, stopped at %(cap)s rows (one
# past the cap: "10,000+") however many organisations there are. The windows end at the
# database's now().
RUNS_BY_STATUS = """
SELECT w.name AS window, st.status,
       (SELECT count(*) FROM (
            SELECT 1 FROM workflows_run r
             WHERE r.org_id = ANY(%(orgs)s::bigint[]) AND r.status = st.status
               AND r.created_at >= now() - w.span
             LIMIT %(cap)s) counted) AS runs
  FROM unnest(%(statuses)s::text[]) st(status)
 CROSS JOIN (VALUES ('hour', interval '1 hour'), ('day', interval '1 day')) w(name, span)
"""

# The newest failed runs: each organisation's newest %(limit)s by run_org_status_id (org,
# status, -id), then the newest of those: at most %(limit)s rows read per organisation,
# however many runs failed before.
NEWEST_FAILED_RUNS = """
SELECT f.id, f.org_id, f.automation_id, a.slug AS automation, f.error, f.finished_at
  FROM unnest(%(orgs)s::bigint[]) o(id)
 CROSS JOIN LATERAL (
       SELECT r.id, r.org_id, r.automation_id, left(r.error, 300) AS error, r.finished_at
         FROM workflows_run r
        WHERE r.org_id = o.id AND r.status = 'failed'
        ORDER BY r.id DESC
        LIMIT %(limit)s) f
  JOIN workflows_automation a ON a.id = f.automation_id
 ORDER BY f.id DESC
 LIMIT %(limit)s
"""
