"""Consent at send time: is this address on the organisation's suppression list now?

Checked by the ledger just before a call that would contact a person is begun, in the same
transaction as its claim, never at enrolment (someone who unsubscribed on Sunday gets no
email on Monday), and never for an effect already made (its stored answer stands).
"""

from __future__ import annotations

from email.errors import HeaderParseError
from email.headerregistry import Address
from email.utils import getaddresses
from typing import Any

from workflows.plugins.engine import fetch_dict

from . import sql


class NotOneAddress(ValueError):
    """What a step would send to is not exactly one well-formed email address."""


def canonical_email(text: str) -> str:
    """The one mailbox ``text`` names, as the suppression list stores it (``local@domain``,
    lowercased, quotes and display name gone): ``Friend <Unsub@Victim.example>``,
    ``<unsub@victim.example>`` and ``"unsub"@victim.example`` are all ``unsub@victim.example``,
    the mailbox the mail server is given. Parsed as Django's mail delivery parses it, so what
    is checked is what is sent to. Raises NotOneAddress for none, several or a malformed one."""
    found = [(name, spec) for name, spec in getaddresses([text]) if name or spec]
    if len(found) != 1:
        raise NotOneAddress(f"{len(found)} addresses, not one")
    try:
        address = Address(addr_spec=found[0][1])
    except (HeaderParseError, ValueError, IndexError) as exc:
        raise NotOneAddress("not an email address") from exc
    if not address.username or not address.domain:
        raise NotOneAddress("not an email address")
    return f"{address.username}@{address.domain}".lower()


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


def suppression(cursor: Any, org_id: int, channel: str, address: str) -> str | None:
    """Why ``address`` must not be contacted on ``channel``, or None when it may be."""
    params: dict[str, Any] = {"org_id": org_id, "channel": channel, "address": address.lower()}
    cursor.execute(sql.SUPPRESSED, params)
    row = fetch_dict(cursor)
    return None if row is None else (row["reason"] or "suppressed")
