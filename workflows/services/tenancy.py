"""Organisations and API keys."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Now

from ..engine import sql
from ..engine.sql.rows import model_from_row, query_prepared
from ..errors import ApiKeyExpired, ApiKeyRevoked, InvalidApiKey, InvalidInput, NotFound
from ..models import ApiKey, Organisation
from ..models.tenancy import API_KEY_SCOPES, KEY_PREFIX, hash_key, new_raw_key
from .audit import Actor, record_audit
from .naming import check_slug_and_name


def organisation_ensure(*, slug: str, name: str = "") -> Organisation:
    """The organisation with ``slug``, created (named ``name``, or its slug) when missing. The
    slug names it in commands (``--org``) and the admin: checked as the admin's form checks
    it, so no command makes an organisation the admin could not."""
    check_slug_and_name(Organisation, slug=slug, name=name)
    org, _ = Organisation.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    return org


def api_key_create(
    *,
    org: Organisation,
    name: str,
    read_only: bool = False,
    expires_at: datetime | None = None,
    actor: Actor | None = None,
    scopes: Sequence[str] = (),
) -> tuple[ApiKey, str]:
    """Create a key and return it with its secret; the secret is never stored or shown again.
    ``scopes``: what it may do beyond reading and writing (API_KEY_SCOPES; an unknown one is
    InvalidInput). Audited (``api_key.create``) as ``actor``; None: Waymark itself (the demo,
    scripts)."""
    unknown = sorted(set(scopes) - set(API_KEY_SCOPES))
    if unknown:
        raise InvalidInput(reason=f"unknown scope(s) {', '.join(unknown)}; "
                           f"known: {', '.join(sorted(API_KEY_SCOPES))}")  # fmt: skip
    prefix, raw = new_raw_key()
    with transaction.atomic():
        key = ApiKey.objects.create(
            org=org, name=name, prefix=prefix, key_hash=hash_key(raw), read_only=read_only,
            expires_at=expires_at, scopes=sorted(set(scopes)),
        )  # fmt: skip
        record_audit(
            org=org, actor=actor or Actor.system(), action="api_key.create",
            target_type="api_key", target_id=prefix,
            detail={"name": name, "read_only": read_only, "scopes": key.scopes,
                    "expires_at": expires_at.isoformat() if expires_at else None},
        )  # fmt: skip
    return key, raw


def api_key_revoke(*, prefix: str, actor: Actor | None = None) -> ApiKey:
    """Revoke the key now (again: nothing changes, nothing is audited). Audited
    (``api_key.revoke``) as ``actor``; None: Waymark itself."""
    with transaction.atomic():
        try:
            key = ApiKey.objects.select_for_update().get(prefix=prefix)
        except ApiKey.DoesNotExist as exc:
            raise NotFound(f'No API key with prefix "{prefix}".') from exc
        if key.revoked_at is None:
            ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=Now())
            key.refresh_from_db()
            record_audit(
                org=key.org_id, actor=actor or Actor.system(), action="api_key.revoke",
                target_type="api_key", target_id=prefix, detail={"name": key.name},
            )  # fmt: skip
    return key


def api_key_authenticate(raw: str) -> ApiKey:
    """Resolve a presented key. The lookup is by public prefix, the check in constant time."""
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX:
        raise InvalidApiKey()
    found = _key_with_org(parts[1])
    if found is None or not found[0].matches(raw):
        raise InvalidApiKey()
    key, row = found
    if key.is_revoked:
        raise ApiKeyRevoked()
    if row["expired_now"]:
        raise ApiKeyExpired()
    if row["touch_due"]:
        _touch(key)
    return key


def _key_with_org(prefix: str) -> tuple[ApiKey, dict[str, Any]] | None:
    """The key with this prefix and its organisation, in one prepared statement; and the
    row, which says whether the key has expired and its use is due to be recorded (both on
    the database's clock)."""
    params = {"prefix": prefix, "touch_every": TOUCH_EVERY.total_seconds()}
    with connection.cursor() as cursor:
        rows = query_prepared(cursor, sql.API_KEY_WITH_ORG, params)
    if not rows:
        return None
    key = model_from_row(ApiKey, rows[0])
    key.org = model_from_row(Organisation, rows[0], "org_")  # its id: the key's org_id
    return key, rows[0]


TOUCH_EVERY = timedelta(minutes=5)


def _touch(key: ApiKey) -> None:
    """Record use at most every few minutes (the caller checks the row it read, so most
    requests write nothing; the guard here keeps concurrent requests from writing twice)."""
    stale = Now() - TOUCH_EVERY
    ApiKey.objects.filter(pk=key.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale)
    ).update(last_used_at=Now())
