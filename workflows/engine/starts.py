"""A start in one statement: the new run's walk first, then the run and what its walk wrote.

The ordinary start (services/runs.py) takes three round trips: BEGIN, the run's INSERT, and
the walk's writes sent with COMMIT; psycopg's work per statement is most of a start's client
CPU. When the start's walk only enters steps that workers run and reads nothing of the run
(the first step a worker's, as a provider call usually is), it can be computed before the run
exists.
Its writes then go with the run's INSERT in one statement (sql.START_RUN), which in
autocommit is a transaction of its own: it commits before it answers, so no start is
acknowledged before its commit.

The statement inserts the run only if the version the process last saw is still the
automation's current one (as sql.INSERT_RUN_IF_CURRENT) and the start key is free; the walk's
rows are written only with the run. Otherwise it writes nothing and says what it found, and
the caller proceeds as the ordinary start does.

The walk runs before the run has an id or a start time, so what would see them goes the
ordinary way before any round trip: whatever reads the run's context (an inline step's
expressions, a wait's duration), and what a walk does only in flush (a path's end, the run's
end, a continuation); so does a walk that touches the database (forks and joins).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.db import connection

from ..definitions.registry import StepType
from ..states import RunStatus
from . import sql
from .speculative import NeedsTransaction, NoDatabase, walked_ahead
from .sql.rows import dumps_cells, query_prepared
from .walk import RunState, Walk

# What the walk is given for the run's id and start time, which it must not read (see
# _NewRunWalk): the statement writes the real ones.
_NO_ID = 0
_NO_TIME = datetime.min.replace(tzinfo=UTC)


class _NewRunWalk(Walk):
    """A new run's walk before its row exists: reading the run's context (which has its id
    and start time), as an inline step or a wait's duration does, ends it (the start goes
    the ordinary way)."""

    def context(self, step_type: StepType, compensating: Any = None) -> Any:
        raise NeedsTransaction("the run's context")


def start_in_one_trip(
    run_row: dict[str, Any],
    *,
    org_id: int,
    version_id: int,
    run_input: Any,
    max_steps: int,
    definition: Mapping[str, Any],
    admission: Mapping[str, Any],
) -> list[dict[str, Any]] | None:
    """Start the run ``run_row`` describes (sql.START_RUN's parameters for the run's
    INSERT; its ``input`` is ``run_input``, the input as stored) with its walk, in one
    statement, admitted under the start quotas as ``admission`` says
    (services/quotas.start_admission); its rows (as INSERT_RUN_IF_CURRENT's, without
    created_at, with ``admitted``), or None when the walk cannot go in it (nothing was
    sent)."""
    state = RunState(
        id=_NO_ID, org_id=org_id, version_id=version_id, status=RunStatus.RUNNING,
        input=run_input, vars={}, outputs={}, entered={}, steps_executed=0,
        max_steps=max_steps, expired=False, created_at=_NO_TIME,
    )  # fmt: skip
    walk = _NewRunWalk(NoDatabase(), state, definition, speculative=True)
    if not walked_ahead(walk.start, run_id=_NO_ID):
        return None
    writes = walk.start_writes()
    if writes is None:
        return None
    scalars, document = writes
    # The JSON values go as one document, encoded once: a parameter each (and psycopg's
    # JSON dumper for each) was a quarter of a start's client CPU.
    params = {key: value for key, value in run_row.items() if key not in ("input", "trace")}
    if run_row.get("trace"):
        # Only while tracing is on: an untraced start's document is as it was.
        document = {**document, "trace": run_row["trace"]}
    params["document"] = dumps_cells({"input": run_input, **document})
    with connection.cursor() as cursor:
        return query_prepared(cursor, sql.START_RUN, {**params, **scalars, **admission})
