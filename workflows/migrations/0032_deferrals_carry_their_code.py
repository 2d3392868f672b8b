"""A code step deferred for want of its workflow's version (``workflow_version_missing``)
says so in its ``step.deferred`` event's detail as data (``code``, ``workflow``, ``version``)
beside its message, and the doctor's check and a migration's wake of the decider match that,
never the message's text. The deferrals already waiting get the same keys here, read from
their message, so nothing deferred before this migration is missed: the latest deferral of
each code step waiting to be tried again (the only ones read). Backwards, nothing to undo:
the keys are extra data the earlier code never reads."""

from django.db import migrations

STRUCTURE_WAITING_DEFERRALS = r"""
WITH latest AS (
    SELECT DISTINCT ON (e.run_id, e.step_id, e.iteration) e.id, e.kind, e.detail
      FROM workflows_step s
      JOIN workflows_runevent e
        ON e.run_id = s.run_id AND e.step_id = s.step_id AND e.iteration = s.iteration
     WHERE s.status = 'waiting' AND s.wait_kind = 'retry' AND s.type = 'code'
     ORDER BY e.run_id, e.step_id, e.iteration, e.id DESC
),
parsed AS (
    SELECT id, regexp_match(detail->>'error',
                            '^workflow_version_missing: ''(.*)'' version (\d+) is not') AS m
      FROM latest
     WHERE kind = 'step.deferred' AND NOT detail ? 'code'
)
UPDATE workflows_runevent e
   SET detail = e.detail || jsonb_build_object(
           'code', 'workflow_version_missing', 'workflow', p.m[1], 'version', p.m[2]::integer)
  FROM parsed p
 WHERE e.id = p.id AND p.m IS NOT NULL
"""


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0031_run_org_status_created"),
    ]

    operations = [
        migrations.RunSQL(STRUCTURE_WAITING_DEFERRALS, reverse_sql=migrations.RunSQL.noop),
    ]
