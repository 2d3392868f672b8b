"""Subscriptions and deliveries as people change them (the API and the admin alike): each
change in one transaction with its audit entry; a subscription's secret made here, stored
encrypted, and returned once. The audit keeps an endpoint's origin (``url_origin``:
scheme://host[:port]), never its path or query, which often carry the receiver's token."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection, transaction

from effects.public import encrypt
from workflows.errors import Conflict, InvalidInput, NotFound, QuotaExceeded
from workflows.models import Organisation
from workflows.plugins.audit import Actor, record_audit
from workflows.plugins.runs import quotas

from . import sql
from .events import EVENT_TYPES
from .models import Delivery, Subscription, url_origin

SIGNING_PREFIX = "whsec_"
URL_CHARS = 2000


class UnknownWebhook(NotFound):
    code = "unknown_webhook"
    default_detail = "No webhook subscription {webhook_id} in this organisation."


class UnknownDelivery(NotFound):
    code = "unknown_delivery"
    default_detail = "No delivery {delivery_id} of this webhook."


class NotFailed(Conflict):
    code = "delivery_not_failed"
    default_detail = "Delivery {delivery_id} is {status}: only a failed delivery is sent again."


def new_secret() -> str:
    return SIGNING_PREFIX + secrets.token_urlsafe(32)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an endpoint, or None. Where it may point is the egress guard's
    to say when it is called (a name's addresses can change)."""
    if len(url) > URL_CHARS:
        return f"is longer than {URL_CHARS} characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError:
        return "is not a URL"
    schemes = ("https", "http") if settings.WEBHOOKS["ALLOW_HTTP"] else ("https",)
    if parts.scheme not in schemes:
        return "must be an https:// URL" + (
            "" if settings.WEBHOOKS["ALLOW_HTTP"] else " (WAYMARK_WEBHOOK_ALLOW_HTTP allows http)"
        )
    if not parts.hostname:
        return "has no host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (the signature proves who sends)"
    if parts.fragment:
        return "must not have a fragment"
    if any(ord(ch) < 33 or ord(ch) == 127 for ch in url):
        return "must not contain spaces or control characters"
    return None


def checked_url(url: str) -> str:
    problem = url_problem(url)
    if problem is not None:
        raise InvalidInput(reason=f"url: the URL {problem}.")
    return url


def checked_event_types(event_types: Iterable[str]) -> list[str]:
    chosen = list(dict.fromkeys(event_types))
    unknown = [name for name in chosen if name not in EVENT_TYPES]
    if unknown or not chosen:
        why = (
            f"unknown event type(s) {', '.join(map(repr, unknown))}" if unknown
            else "at least one event type is needed"
        )  # fmt: skip
        known = ", ".join(EVENT_TYPES)
        raise InvalidInput(reason=f"event_types: {why}; one of: {known}.")
    return chosen


def webhook_get(org: Organisation, webhook_id: int) -> Subscription:
    found = Subscription.objects.filter(org=org, pk=webhook_id).first()
    if found is None:
        raise UnknownWebhook(webhook_id=webhook_id)
    return found


def webhook_create(
    *,
    org: Organisation,
    url: str,
    event_types: Iterable[str],
    description: str = "",
    active: bool = True,
    actor: Actor,
) -> tuple[Subscription, str]:
    """A new subscription and its signing secret, shown this once (stored encrypted)."""
    url, types = checked_url(url), checked_event_types(event_types)
    secret = new_secret()
    with transaction.atomic():
        quotas.lock_organisation(org)  # two creations cannot both take the last one
        limit = int(settings.WEBHOOKS["MAX_SUBSCRIPTIONS"])
        if Subscription.objects.filter(org=org).count() >= limit:
            raise QuotaExceeded(limit=limit, what="webhook subscriptions")
        subscription = Subscription.objects.create(
            org=org, url=url, event_types=types, description=description, active=active,
            secret_encrypted=encrypt(secret),
        )  # fmt: skip
        audit(subscription, actor, "webhook.create", url=url_origin(url), event_types=types,
              active=active)  # fmt: skip
    return subscription, secret


def webhook_update(subscription: Subscription, *, actor: Actor, **changes: Any) -> Subscription:
    """Change its url, event types, description or active flag (what ``changes`` names)."""
    if "url" in changes:
        changes["url"] = checked_url(changes["url"])
    if "event_types" in changes:
        changes["event_types"] = checked_event_types(changes["event_types"])
    changed = sorted(name for name, value in changes.items()
                     if getattr(subscription, name) != value)  # fmt: skip
    if not changed:
        return subscription
    with transaction.atomic():
        for name, value in changes.items():
            setattr(subscription, name, value)
        subscription.save(update_fields=[*changes, "updated_at"])
        shown = {name: changes[name] for name in changed if name != "description"}
        if "url" in shown:
            shown["url"] = url_origin(shown["url"])
        audit(subscription, actor, "webhook.update", fields=changed, **shown)
    return subscription


def webhook_delete(subscription: Subscription, *, actor: Actor) -> None:
    """Delete it with its deliveries: what was pending is never sent."""
    with transaction.atomic():
        audit(subscription, actor, "webhook.delete", url=url_origin(subscription.url))
        subscription.delete()


def webhook_rotate_secret(subscription: Subscription, *, actor: Actor) -> str:
    """A new signing secret, shown this once; every attempt from now on is signed with it."""
    secret = new_secret()
    with transaction.atomic():
        subscription.secret_encrypted = encrypt(secret)
        subscription.save(update_fields=["secret_encrypted", "updated_at"])
        audit(subscription, actor, "webhook.rotate_secret")
    return secret


def delivery_get(subscription: Subscription, delivery_id: int) -> Delivery:
    found = Delivery.objects.filter(subscription=subscription, pk=delivery_id).first()
    if found is None:
        raise UnknownDelivery(delivery_id=delivery_id)
    return found


def delivery_redeliver(delivery: Delivery, *, actor: Actor) -> Delivery:
    """Send a failed delivery again: a new series of attempts, the same delivery id (the
    endpoint never acknowledged it). 409 ``delivery_not_failed`` otherwise."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.REDELIVER, {"id": delivery.pk})
        if cursor.fetchone() is None:
            delivery.refresh_from_db(fields=["status"])
            raise NotFailed(delivery_id=delivery.pk, status=delivery.status)
        detail = {"delivery": delivery.pk, "event_type": delivery.event_type}
        record_audit(org=delivery.org_id, actor=actor, action="webhook.redeliver",
                     target_type="webhook", target_id=delivery.subscription_id,
                     detail=detail)  # fmt: skip
    delivery.refresh_from_db()
    return delivery


def audit(subscription: Subscription, actor: Actor, action: str, **detail: Any) -> None:
    record_audit(org=subscription.org_id, actor=actor, action=action, target_type="webhook",
                 target_id=subscription.pk, detail=detail)  # fmt: skip


def purge_finished(*, batch: int = 5_000, max_batches: int = 20) -> int:
    """Delete delivered and failed deliveries older than ``WAYMARK_WEBHOOK_RETENTION_DAYS``
    (0 keeps them); how many went. A sweep task, about once a minute."""
    age = float(settings.WEBHOOKS["RETENTION_DAYS"]) * 86_400
    if age <= 0:
        return 0
    purged = 0
    for _ in range(max_batches):
        with connection.cursor() as cursor:
            cursor.execute(sql.PURGE_FINISHED, {"age": age, "batch": batch})
            deleted = cursor.rowcount
        purged += deleted
        if deleted < batch:
            break
    return purged
