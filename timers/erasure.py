"""Erasing a person from the timers app's rows: their runs' timers (the intent as written,
an error) and the organisation's schedules whose input names them (a schedule keeps starting
runs, now without the value)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workflows.plugins.erasure import Counts, Erasing, add_counts, scrub_rows

from . import sql


def erase_timers(cursor: Any, erasing: Erasing) -> Mapping[str, int]:
    params = erasing.params()
    counts: Counts = {}
    if erasing.run_ids:
        add_counts(
            counts,
            scrub_rows(
                cursor,
                erasing.matcher,
                table="timers_timer",
                columns=["intent", "error"],
                where=sql.TIMERS_OF_RUNS,
                params=params,
                widen=erasing.widen,
            ),
        )
    if erasing.org_wide:
        add_counts(
            counts,
            scrub_rows(
                cursor,
                erasing.matcher,
                table="timers_schedule",
                columns=["input", "last_error"],
                where=sql.SCHEDULES_OF_ORG,
                params=params,
                widen=erasing.widen,
            ),
        )
    return counts
