"""The doctor's check for code runs that wait for their workflow's code: a run whose
workflow version is not registered in the workers' processes (a deploy that dropped it, or
one that has not reached them yet) has its ``decide`` step deferred (steptypes.decide)
until one that has it takes it. The deferral is a durable way forward (a wake time the
sweep fires), so such a run is not stranded; but it moves only once someone deploys the
code, so it is reported as broken, naming the run and the missing name and version.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import connection

from ..engine.health import Example, Finding, Limits, Severity, counted, how_many, step_label
from ..engine.sql.rows import fetch_dicts

CHECK = "workflows.workflow_version_missing"
MISSING = "workflow_version_missing"

# The decide steps waiting to be tried again (by the step_wake_due index: a deferred step
# waits for its wake time) whose latest deferral of this iteration was for a missing
# version, read backwards through the run's events (event_run_order). A step a worker has
# just claimed again is not listed for the moment it runs: it is deferred again, or goes
# on. The name and version are the run's definition's (its one step).
DEFERRED_FOR_MISSING_VERSION = """
WITH missing AS (
    SELECT s.id, s.org_id, s.run_id, s.step_id, s.iteration
      FROM workflows_step s
     WHERE s.status = 'waiting' AND s.wake_at IS NOT NULL AND s.wait_kind = 'retry'
       AND s.type = 'code' AND (%(orgs)s::bigint[] IS NULL OR s.org_id = ANY(%(orgs)s::bigint[]))
       AND (SELECT e.detail FROM workflows_runevent e
             WHERE e.run_id = s.run_id AND e.kind = 'step.deferred'
               AND e.step_id = s.step_id AND e.iteration = s.iteration
             ORDER BY e.id DESC LIMIT 1) @> (
           -- the version the run has now (a migration may have moved it to a registered one),
           -- as the deferral's code and detail name it (steptypes.decide), never its text
           SELECT jsonb_build_object(
                      'code', %(missing)s::text, 'workflow', v.definition->'steps'->0->'workflow',
                      'version', v.definition->'steps'->0->'version')
             FROM workflows_run r JOIN workflows_automationversion v ON v.id = r.version_id
            WHERE r.id = s.run_id)
     ORDER BY s.id
     LIMIT %(cap)s
)
SELECT (SELECT count(*) FROM missing) AS total, m.org_id, m.run_id, m.step_id, m.iteration,
       v.definition->'steps'->0->>'workflow' AS workflow,
       v.definition->'steps'->0->>'version' AS version
  FROM (SELECT * FROM missing ORDER BY id LIMIT %(examples)s) m
  JOIN workflows_run r ON r.id = m.run_id
  JOIN workflows_automationversion v ON v.id = r.version_id
 ORDER BY m.id
"""


def missing_versions(limits: Limits) -> Iterator[Finding]:
    with connection.cursor() as cursor:
        cursor.execute(DEFERRED_FOR_MISSING_VERSION, {**limits.params(), "missing": MISSING})
        rows = fetch_dicts(cursor)
    count, at_least = counted(rows, limits)
    if not count:
        yield Finding(check=CHECK, severity=Severity.OK,
                      summary="every code run's workflow version is registered")  # fmt: skip
        return
    yield Finding(
        check=CHECK, severity=Severity.BROKEN, count=count, at_least=at_least,
        summary=f"{how_many(count, at_least, 'code run waits', 'code runs wait')} for a "
        "workflow version no worker has registered: deploy the code that registers it "
        "(@workflow), or cancel the run",
        examples=tuple(_example(row) for row in rows),
    )  # fmt: skip


def _example(row: dict[str, Any]) -> Example:
    return Example(
        run_id=row["run_id"], org_id=row["org_id"], step=step_label(row),
        why=f"{MISSING}: {row['workflow']!r} version {row['version']} is not registered in "
        "the worker that took its decide step (deferred, tried again every 30 s)",
    )  # fmt: skip
