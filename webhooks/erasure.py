"""Erasing a person from the webhooks app's rows: the deliveries of their runs' events (the
payload, including the run's start key; what the endpoint answered), and any other delivery
of the organisation whose payload names them. A delivery still pending is sent with the
values removed; one already delivered cannot be called back (the endpoint has it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workflows.plugins.erasure import Counts, Erasing, add_counts, scrub_rows

from . import sql

DELIVERY_COLUMNS = ["payload", "last_error", "last_response"]


def erase_deliveries(cursor: Any, erasing: Erasing) -> Mapping[str, int]:
    params = erasing.params()
    counts: Counts = {}
    wheres = [sql.DELIVERIES_OF_RUNS] if erasing.run_ids else []
    if erasing.org_wide:
        wheres.append(sql.DELIVERIES_OF_ORG)
    for where in wheres:
        add_counts(counts, scrub_rows(cursor, erasing.matcher, table="webhooks_delivery",
                                      columns=DELIVERY_COLUMNS, where=where, params=params,
                                      widen=erasing.widen))  # fmt: skip
    return counts
