"""Consent at send time: is this address on the organisation's suppression list now?

Checked by the ledger just before a call that would contact a person is begun, in the same
transaction as its claim, never at enrolment (someone who unsubscribed on Sunday gets no
email on Monday), and never for an effect already made (its stored answer stands).
"""

from __future__ import annotations

from typing import Any

from workflows.engine.sql.rows import fetch_dict

from . import sql


def suppression(cursor: Any, org_id: int, channel: str, address: str) -> str | None:
    """Why ``address`` must not be contacted on ``channel``, or None when it may be."""
    params: dict[str, Any] = {"org_id": org_id, "channel": channel, "address": address.lower()}
    cursor.execute(sql.SUPPRESSED, params)
    row = fetch_dict(cursor)
    return None if row is None else (row["reason"] or "suppressed")
