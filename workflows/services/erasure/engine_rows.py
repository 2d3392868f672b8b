"""The engine's own eraser: runs, steps, history, signals, the outbox, migration jobs and the
audit log (registered by WorkflowsConfig.ready like any app's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...engine.sql import erasure as sql
from .registry import Erasing
from .scrub import Column, Counts, add_counts, scrub_rows


def _unique(prefix: str) -> Column:
    """A text column unique per organisation (a start key, a signal's identity): a scrubbed
    row gets ``erased:<id>`` instead of the marker, so it stays unique."""
    return Column(prefix, replace=lambda row: f"erased:{row['id']}")


RUN_COLUMNS: list[Column | str] = [
    _unique("start_key"),
    "input",
    "vars",
    "outputs",
    "output",
    "error",
]
STEP_COLUMNS: list[Column | str] = ["output", "wait_detail", "error"]
SIGNAL_COLUMNS: list[Column | str] = ["payload", "correlation", "correlations", _unique("identity")]


def erase_engine_rows(cursor: Any, erasing: Erasing) -> Mapping[str, int]:
    params = {**erasing.params(), "run_texts": [str(r) for r in erasing.run_ids]}
    matcher = erasing.matcher
    counts: Counts = {}
    if erasing.run_ids:
        for table, columns, where in (
            ("workflows_run", RUN_COLUMNS, sql.RUNS_ERASED),
            ("workflows_step", STEP_COLUMNS, sql.STEPS_OF_RUNS),
            ("workflows_runevent", ["detail"], sql.EVENTS_OF_RUNS),
            ("workflows_signal", SIGNAL_COLUMNS, sql.SIGNALS_OF_RUNS),
        ):
            add_counts(
                counts,
                scrub_rows(
                    cursor,
                    matcher,
                    table=table,
                    columns=columns,
                    where=where,
                    params=params,
                    widen=erasing.widen,
                ),
            )
    if erasing.org_wide:
        # Rows of the organisation tied to no run, or not through a run: a signal not yet
        # matched, wake messages, migration reports, and the audit log (its erasure
        # exception is on for this organisation, for this transaction: sql.AUDIT_ERASURE_ORG).
        for table, columns in (
            ("workflows_signal", SIGNAL_COLUMNS),
            ("workflows_outbox", ["payload"]),
            ("workflows_runmigration", ["plan", "planned", "report"]),
            ("workflows_auditentry", ["target_id", "detail"]),
        ):
            add_counts(
                counts,
                scrub_rows(
                    cursor,
                    matcher,
                    table=table,
                    columns=columns,
                    where=sql.OF_ORG,
                    params=params,
                    widen=erasing.widen,
                ),
            )
    return counts
