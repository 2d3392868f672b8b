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

from .egress import NotAllowable, allowable_entry, normalized_entry
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


def allow_add(org: Organisation, raw: str, note: str = "") -> EgressAllow:
    """Allowlist ``raw`` for the organisation: 409 ``already_exists`` when it is listed."""
    if len(note) > NOTE_CHARS:
        raise InvalidInput(reason=f"the note is longer than {NOTE_CHARS} characters")
    row = EgressAllow(org=org, entry=stored_entry(raw), note=note)
    try:
        with transaction.atomic():
            row.save()
    except IntegrityError as exc:
        held = EgressAllow.objects.filter(org=org, entry=row.entry).first()
        raise AlreadyExists(
            what=f"The egress allowlist entry {row.entry}", id=held.pk if held else None
        ) from exc
    return row


def allow_list(org: Organisation) -> QuerySet[EgressAllow]:
    return EgressAllow.objects.filter(org=org)


def allow_get(org: Organisation, entry_id: int) -> EgressAllow:
    found = EgressAllow.objects.filter(org=org, pk=entry_id).first()
    if found is None:
        raise UnknownEgressEntry(entry=entry_id)
    return found


def allow_remove(org: Organisation, raw: str) -> int:
    """Remove the entry written ``raw`` (as typed, or in its stored form, so an entry saved
    before entries were normalised is found too); how many rows went."""
    forms = {raw.strip()}
    with contextlib.suppress(ValueError):  # no valid entry: only its exact text can match
        forms.add(normalized_entry(raw))
    deleted, _ = EgressAllow.objects.filter(org=org, entry__in=forms).delete()
    if not deleted:
        raise UnknownEgressEntry(entry=repr(raw.strip()))
    return deleted
