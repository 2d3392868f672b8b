"""Erasing a person from the webhooks app's rows: the deliveries of their runs' events (the
payload, including the run's start key; what the endpoint answered), and any other delivery
of the organisation whose payload names them. A delivery still pending is sent with the
values removed; one already delivered cannot be called back (the endpoint has it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workflows.plugins.erasure import Counts, Erasing, scrub_rows

from . import sql

DELIVERY_COLUMNS = ["payload", "last_error", "last_response"]


def erase_deliveries(cursor: Any, erasing: Erasing) -> Mapping[str, int]:
    params = erasing.params()
    counts: Counts = {}
    if erasing.run_ids:
        counts.update(
            scrub_rows(
                cursor,
                erasing.matcher,
                table="webhooks_delivery",
                columns=DELIVERY_COLUMNS,
                where=sql.DELIVERIES_OF_RUNS,
                params=params,
                widen=erasing.widen,
            )
        )
    if erasing.org_wide:
        for key, n in scrub_rows(
            cursor,
            erasing.matcher,
            table="webhooks_delivery",
            columns=DELIVERY_COLUMNS,
            where=sql.DELIVERIES_OF_ORG,
            params=params,
            widen=erasing.widen,
        ).items():
            counts[key] = counts.get(key, 0) + n
    return counts
