"""Erasing a person from the effects app's rows (docs/how-to/erase-a-person.md).

The effects of their runs lose every value (what was sent, what the provider answered, the
last response, the error); an effect still in flight is fenced (its attempt read their data
and can no longer record an answer). Their suppression entries stay, as the keyed hash of the
address: the check at send time matches it (``consent.erased_address``), so they stay
suppressed and the address is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workflows.plugins.engine import fetch_dict, fetch_dicts
from workflows.plugins.erasure import Counts, Erasing, add_counts, scrub_rows

from . import sql
from .consent import erased_address

EFFECT_COLUMNS = ["request", "result", "last_response", "error"]


def erase_effects(cursor: Any, erasing: Erasing) -> Mapping[str, int]:
    params = erasing.params()
    counts: Counts = {}
    if erasing.run_ids and not erasing.org_wide:
        # The person's own runs: cancelled or handed back, so their calls in flight are too.
        cursor.execute(sql.FENCE_IN_FLIGHT, params)
        fenced = len(fetch_dicts(cursor))
        if fenced:
            counts["effects_effect.state"] = fenced
    if erasing.run_ids:
        add_counts(
            counts,
            scrub_rows(
                cursor,
                erasing.matcher,
                table="effects_effect",
                columns=EFFECT_COLUMNS,
                where=sql.EFFECTS_OF_RUNS,
                params=params,
                widen=erasing.widen,
            ),
        )
    if erasing.org_wide:
        add_counts(counts, _hash_suppressions(cursor, erasing))
        add_counts(
            counts,
            scrub_rows(
                cursor,
                erasing.matcher,
                table="effects_suppression",
                columns=["reason"],
                where=sql.SUPPRESSIONS_OF_ORG,
                params=params,
                widen=erasing.widen,
            ),
        )
    return counts


def _hash_suppressions(cursor: Any, erasing: Erasing) -> Counts:
    """Each entry whose address holds one of the values keeps its keyed hash instead; one
    whose hash is listed already (an earlier erasure) goes."""
    cursor.execute(
        sql.SUPPRESSIONS_HOLDING, {"org": erasing.org_id, "like": erasing.matcher.like_patterns()}
    )
    changed = 0
    for row in fetch_dicts(cursor):
        if not erasing.matcher.holds(row["address"]):
            continue
        hashed = erased_address(row["address"])
        cursor.execute(
            sql.SUPPRESSION_HASHED,
            {"org": erasing.org_id, "channel": row["channel"], "hashed": hashed},
        )
        if fetch_dict(cursor) is None:
            cursor.execute(sql.SUPPRESSION_REPLACE, {"id": row["id"], "hashed": hashed})
        else:
            cursor.execute(sql.SUPPRESSION_DROP, {"id": row["id"]})
        changed += 1
    return {"effects_suppression.address": changed} if changed else {}
