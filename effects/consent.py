"""Consent at send time: is this address on the organisation's suppression list now?

Checked by the ledger just before a call that would contact a person is begun, in the same
transaction as its claim, never at enrolment (someone who unsubscribed on Sunday gets no
email on Monday), and never for an effect already made (its stored answer stands).
"""

from __future__ import annotations

from typing import Any

from workflows.plugins.engine import fetch_dict
from workflows.plugins.erasure import NotOneAddress, canonical_email, keyed_hash

from . import sql

__all__ = [
    "NotOneAddress",
    "address_refused",
    "canonical_email",
    "erased_address",
    "stored_address",
    "suppression",
]


def stored_address(text: str) -> str:
    """An address as the suppression list keeps and looks it up: an email address as the
    mailbox it names (``Name <A@B.example>`` is ``a@b.example``, as the check at send time
    sees it), anything else (a Slack channel) stripped and lowercased."""
    if "@" in text:
        try:
            return canonical_email(text)
        except NotOneAddress:
            pass  # kept as written: it matches only a recipient written the same way
    return text.strip().lower()


def address_refused(channel: str, text: str) -> str | None:
    """Why ``text`` cannot be suppressed on ``channel``, or None when it can. On ``email`` it
    must be one email address; on ``any``, text with an ``@`` must be one too (no recipient
    is written so: it would match nothing), and text without one is a Slack channel. On
    ``slack``, any text is a channel."""
    if channel == "slack" or (channel == "any" and "@" not in text):
        return None
    try:
        canonical_email(text)
    except NotOneAddress as exc:
        where = "on channel email" if channel == "email" else "with an @"
        return f"An address {where} must be one email address ({exc})."
    return None


def erased_address(address: str) -> str:
    """What the suppression list keeps of an address once its person was erased: the keyed
    hash of the address as stored (``hmac-sha256:<hex>``, docs/how-to/erase-a-person.md). The check
    at send time looks for it too, so the person stays suppressed."""
    return keyed_hash(f"suppressed:{stored_address(address)}")


def suppression(cursor: Any, org_id: int, channel: str, address: str) -> str | None:
    """Why ``address`` must not be contacted on ``channel``, or None when it may be: listed
    as it is, or as its keyed hash (an erased person's address)."""
    params: dict[str, Any] = {"org_id": org_id, "channel": channel, "address": address.lower(),
                              "erased": erased_address(address)}  # fmt: skip
    cursor.execute(sql.SUPPRESSED, params)
    row = fetch_dict(cursor)
    return None if row is None else (row["reason"] or "suppressed")
