"""The statements of a person's erasure (workflows/services/erasure/): finding their runs,
handing back a running step of a run that finishes without their data. Each app's own rows
are scrubbed by its own eraser. The audit log is never changed by an erasure: it keeps who
did what, and no person's data is put there.
"""

from __future__ import annotations

# The run columns a person's values may be stored in (the start key, the input, what steps
# wrote, the outcome), as text: each candidate's are checked in Python.
_RUN_TEXTS = ("start_key", "input::text", "vars::text", "outputs::text", "output::text", "error")


def person_candidates(*, phones: bool) -> str:
    """The organisation's runs whose text columns may hold one of the values: ILIKE against
    ``%(erasure_like)s`` (and, with ``phones``, the digits of the text against
    ``%(erasure_digits)s``). One pass over the organisation's runs (run_org_id): an erasure
    is rare, and a value may be anywhere in a run."""
    tests = [f"{column} ILIKE ANY(%(erasure_like)s)" for column in _RUN_TEXTS]
    if phones:
        tests += [
            f"regexp_replace({column}, '[^0-9]', '', 'g') LIKE ANY(%(erasure_digits)s)"
            for column in _RUN_TEXTS
        ]
    return f"""
SELECT id, version_id, status, start_key, input::text AS input, vars::text AS vars,
       outputs::text AS outputs, output::text AS output, error
  FROM workflows_run
 WHERE org_id = %(org)s AND ({" OR ".join(tests)})
 ORDER BY id
"""  # noqa: S608 (composed of this module's constants)


# A run that finishes without the person's data (``on_erasure: finish``): its running steps
# are handed back, as at a worker's shutdown (not counted against max_attempts), so the
# attempt in flight, which read the values before they were removed, is fenced out (its
# settle and its effect's record change nothing) and the step runs again on what is left.
# The caller holds the run's lock.
RELEASE_RUNNING_STEPS = """
UPDATE workflows_step
   SET status = 'ready', owner = NULL, lease_until = now(), release_count = release_count + 1
 WHERE run_id = %(run)s AND status = 'running'
RETURNING org_id, run_id, step_id, iteration, attempt, lane
"""

# An erasure waits this long at most for a row another transaction holds (a worker's settle,
# a sender's claim); past it, nothing is applied and the caller is told to try again.
LOCK_TIMEOUT = "SET LOCAL lock_timeout = '10s'"

# --- the engine's own rows (services/erasure/engine_rows.py) -----------------------------------
# Conditions for scrub_rows (workflows.plugins.erasure), over %(org)s and %(runs)s.

RUNS_ERASED = "org_id = %(org)s AND id = ANY(%(runs)s)"
STEPS_OF_RUNS = "run_id = ANY(%(runs)s) AND org_id = %(org)s"
EVENTS_OF_RUNS = "run_id = ANY(%(runs)s) AND org_id = %(org)s"
# A signal a run took (consumed_by: "<run>/<step>/<iteration>") or was sent to.
SIGNALS_OF_RUNS = (
    "org_id = %(org)s AND (run_id = ANY(%(runs)s)"
    " OR split_part(consumed_by, '/', 1) = ANY(%(run_texts)s::text[]))"
)
OF_ORG = "org_id = %(org)s"
# The admin's change log entries of one model's objects of the organisation ({table}: the
# model's, from the models' registry, never from input).
ADMIN_LOG_OF_ORG = (
    "content_type_id = %(content_type)s AND object_id IN ("
    "SELECT id::text FROM {table} WHERE org_id = %(org)s)"
)
# A run-tied table's rows of the organisation's runs: reached through its run_id index from
# the organisation's run ids (a table such as the history has no org_id index: by org_id
# alone, a small organisation's erasure would read every organisation's history; measured in
# docs/how-to/erase-a-person.md).
OF_ORG_WITH_RUN = (
    "org_id = %(org)s AND run_id = ANY(ARRAY(SELECT id FROM workflows_run WHERE org_id = %(org)s))"
)
RUNS_OF_ORG = "SELECT id FROM workflows_run WHERE org_id = %(org)s AND id = ANY(%(runs)s)"

# Whether any published definition of the organisation declares personal_data.identifiers:
# an erasure by identifier means nothing where none does.
ORG_DECLARES_IDENTIFIERS = """
SELECT EXISTS (
    SELECT FROM workflows_automationversion
     WHERE org_id = %(org)s AND published_at IS NOT NULL
       AND jsonb_typeof(definition #> '{personal_data,identifiers}') = 'array'
       AND definition #> '{personal_data,identifiers}' <> '[]'::jsonb
)
"""

# Every table whose rows belong to a run of an organisation (it has run_id and org_id), but
# the runs themselves, with its text, JSON and array columns: where a run that mentions a
# person is looked for (find.py), whichever app's table it is. Not its varchar columns:
# those hold the engine's own words (a status, a kind, a step id, a key), which an
# identifier must not be mistaken for; the text a run was given or told is text or JSON.
RUN_TIED_TEXT_COLUMNS = """
SELECT c.table_name::text AS table_name,
       array_agg(c.column_name::text ORDER BY c.column_name) AS columns
  FROM information_schema.columns c
  JOIN information_schema.tables t
    ON t.table_schema = c.table_schema AND t.table_name = c.table_name
   AND t.table_type = 'BASE TABLE'
 WHERE c.table_schema = current_schema()
   AND c.data_type IN ('text', 'json', 'jsonb', 'ARRAY')
   AND c.table_name <> 'workflows_run'
   AND EXISTS (SELECT FROM information_schema.columns r
                WHERE r.table_schema = c.table_schema AND r.table_name = c.table_name
                  AND r.column_name = 'run_id')
   AND EXISTS (SELECT FROM information_schema.columns o
                WHERE o.table_schema = c.table_schema AND o.table_name = c.table_name
                  AND o.column_name = 'org_id')
 GROUP BY c.table_name
 ORDER BY c.table_name
"""
