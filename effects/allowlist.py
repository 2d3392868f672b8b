"""An organisation's egress allowlist: what its outside calls may reach beyond public
addresses. Adding, removing and listing go through here from the API, the admin and the
``egress_allow`` command alike, so the operator's ceiling (``WAYMARK_EGRESS_ALLOWABLE``) is
checked the same way everywhere; ``effects/egress.py`` checks it again at each use."""

from __future__ import annotations

import contextlib

from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from workflows.errors import AlreadyExists, InvalidInput, NotFound, WaymarkError
from workflows.models import Organisation
from workflows.plugins.audit import Actor, record_audit

from .egress import Allowlist, NotAllowable, allowable_entry, normalized_entry
from .models import EgressAllow

NOTE_CHARS = 200  # EgressAllow.note


class UnknownEgressEntry(NotFound):
    code = "unknown_egress_entry"
    default_detail = "No egress allowlist entry {entry} in this organisation."


class EgressNotAllowable(WaymarkError):
    """Outside the operator's ceiling, or a metadata / link-local address (never)."""

    code = NotAllowable.code
    status = 400


def stored_entry(raw: str) -> str:
    """``raw`` as it is stored, or the error an organisation gets for it."""
    try:
        return allowable_entry(raw)
    except NotAllowable as exc:
        raise EgressNotAllowable(str(exc)) from None
    except ValueError as exc:
        raise InvalidInput(reason=str(exc)) from None


def allow_add(org: Organisation, raw: str, note: str = "", *, actor: Actor) -> EgressAllow:
    """Allowlist ``raw`` for the organisation: 409 ``already_exists`` when it is listed.
    Audited (``egress_allow.add``) as ``actor``."""
    if len(note) > NOTE_CHARS:
        raise InvalidInput(reason=f"the note is longer than {NOTE_CHARS} characters")
    row = EgressAllow(org=org, entry=stored_entry(raw), note=note)
    try:
        with transaction.atomic():
            row.save()
            audit_allow(row, actor, "egress_allow.add")
    except IntegrityError as exc:
        held = EgressAllow.objects.filter(org=org, entry=row.entry).first()
        raise AlreadyExists(
            what=f"The egress allowlist entry {row.entry}", id=held.pk if held else None
        ) from exc
    return row


def allowlist_in_force(org_id: int) -> Allowlist:
    """What the organisation's outside calls may reach beyond public addresses now: its
    entries that the operator's ceiling still covers, read at each call (a row saved before
    the ceiling was lowered opens nothing)."""
    entries = EgressAllow.objects.filter(org_id=org_id).values_list("entry", flat=True)
    return Allowlist.for_tenant(entries)


def allow_list(org: Organisation) -> QuerySet[EgressAllow]:
    return EgressAllow.objects.filter(org=org)


def allow_get(org: Organisation, entry_id: int) -> EgressAllow:
    found = EgressAllow.objects.filter(org=org, pk=entry_id).first()
    if found is None:
        raise UnknownEgressEntry(entry=entry_id)
    return found


def allow_remove(org: Organisation, raw: str, *, actor: Actor) -> int:
    """Remove the entry written ``raw`` (as typed, or in its stored form, so an entry saved
    before entries were normalised is found too); how many rows went. Audited
    (``egress_allow.remove``) as ``actor``."""
    forms = {raw.strip()}
    with contextlib.suppress(ValueError):  # no valid entry: only its exact text can match
        forms.add(normalized_entry(raw))
    with transaction.atomic():
        rows = list(EgressAllow.objects.select_for_update().filter(org=org, entry__in=forms))
        if not rows:
            raise UnknownEgressEntry(entry=repr(raw.strip()))
        for row in rows:
            allow_delete(row, actor=actor)
    return len(rows)


def allow_delete(row: EgressAllow, *, actor: Actor) -> None:
    """Remove one entry: the next call to it is refused again. Audited as ``actor``."""
    with transaction.atomic():
        audit_allow(row, actor, "egress_allow.remove")
        row.delete()


def audit_allow(row: EgressAllow, actor: Actor, action: str) -> None:
    """Record a change of the allowlist, in the caller's transaction (the admin's too)."""
    record_audit(org=row.org_id, actor=actor, action=action, target_type="egress_allow",
                 target_id=row.entry, detail={"note": row.note})  # fmt: skip
