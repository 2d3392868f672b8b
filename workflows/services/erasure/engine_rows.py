"""The engine's own eraser: runs, steps, history, signals, the outbox, migration jobs, and the
admin's change log of the organisation's objects (registered by WorkflowsConfig.ready like
any app's). Never the audit log: it keeps who did what, and no person's data is put there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.apps import apps
from django.contrib.contenttypes.models import ContentType

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
    # Keyed by step id; "~..." keys (no step takes one) are the engine's: a re-run's and a
    # retry's cuts (row ids and counts), which a numeric identifier must never rewrite.
    Column("outputs", engine_key=lambda key: key.startswith("~")),
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
        # matched, wake messages, migration reports.
        for table, columns in (
            ("workflows_signal", SIGNAL_COLUMNS),
            ("workflows_outbox", ["payload"]),
            ("workflows_runmigration", ["plan", "planned", "report"]),
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
        add_counts(counts, _admin_log(cursor, erasing))
    return counts


def _admin_log(cursor: Any, erasing: Erasing) -> Counts:
    """The admin's change log names an object by its display (a suppression by its address):
    the entries of this organisation's objects, model by model."""
    counts: Counts = {}
    for model in apps.get_models():
        if not any(f.name == "org" and f.is_relation for f in model._meta.concrete_fields):
            continue
        where = sql.ADMIN_LOG_OF_ORG.format(table=model._meta.db_table)
        params = {"org": erasing.org_id,
                  "content_type": ContentType.objects.get_for_model(model).pk}  # fmt: skip
        add_counts(counts, scrub_rows(cursor, erasing.matcher, table="django_admin_log",
                                      columns=["object_repr", "change_message"], where=where,
                                      params=params, widen=erasing.widen))  # fmt: skip
    return counts
