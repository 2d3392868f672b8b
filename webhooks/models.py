"""Webhook subscriptions and their deliveries (the webhooks' outbox).

A subscription is an organisation's HTTPS endpoint and the event types it wants; its signing
secret is stored encrypted, like connection secrets, and shown once. A delivery is one event
for one subscription, written by a trigger on the run history in the transaction of the
event itself (``sql.ENQUEUE_V2``): an event that commits has its deliveries, one that rolls
back has none. The leading sweeper sends them (``delivery.py``), at least once each, and
retries with backoff until ``WAYMARK_WEBHOOK_MAX_ATTEMPTS``; then the delivery is failed.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models.functions import Now


class Subscription(models.Model):
    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.CASCADE, related_name="webhook_subscriptions",
        db_index=False,
    )  # fmt: skip
    url = models.CharField(max_length=2000)
    description = models.CharField(max_length=200, blank=True, default="")
    event_types = ArrayField(models.CharField(max_length=40))
    secret_encrypted = models.TextField(editable=False)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The trigger's probe, at each event that can be delivered: this organisation's
            # active subscriptions (a handful at most).
            models.Index(
                fields=["org"], name="webhook_sub_active", condition=models.Q(active=True)
            ),
        ]

    def __str__(self) -> str:
        # The admin keeps this in its history (django_admin_log): the origin, never the path
        # or query, which often carry the receiver's token.
        return f"webhook {self.pk} {url_origin(self.url)}"


def url_origin(url: str) -> str:
    """``scheme://host[:port]`` of an endpoint's URL: what the audit log and the admin's
    history keep of it. The path and query (where receivers put their tokens) are left out,
    as a connection's audit entries name its fields, never their values."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(not a URL)"
    host = parts.netloc.rpartition("@")[2]  # (credentials are refused; never shown)
    return f"{parts.scheme}://{host}" if parts.scheme and host else "(not a URL)"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # to be sent (again) from next_at; in flight while lease_until is ahead
    DELIVERED = "delivered"  # the endpoint answered 2xx
    FAILED = "failed"  # attempts used up, or refused for good (egress, an inactive subscription)


class Delivery(models.Model):
    # Written by the trigger in hot transactions (a run's settle): no foreign-key checks, which
    # would share-lock the organisation's and the subscription's rows for every delivery (as
    # the engine's own rows do not). Deleting a subscription deletes its deliveries (Django).
    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.DO_NOTHING, db_index=False,
        db_constraint=False, related_name="+",
    )  # fmt: skip
    subscription = models.ForeignKey(
        Subscription, on_delete=models.CASCADE, db_index=False, db_constraint=False,
        related_name="deliveries",
    )  # fmt: skip
    event_id = models.BigIntegerField()  # the run event it reports (workflows_runevent.id)
    event_type = models.CharField(max_length=40)
    run_id = models.BigIntegerField(null=True)
    payload = models.JSONField()  # the event's `data`, as the trigger built it
    occurred_at = models.DateTimeField()
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)  # claims so far (a crashed one counts)
    next_at = models.DateTimeField()  # claimable from then (a retry's backoff, a lease)
    lease_until = models.DateTimeField(null=True, blank=True)  # in flight until
    token = models.CharField(max_length=32, blank=True, default="")  # the attempt in flight
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveIntegerField(null=True, blank=True)  # the endpoint's answer
    last_error = models.TextField(blank=True, default="")
    last_response = models.TextField(blank=True, default="")  # its first 500 characters
    created_at = models.DateTimeField(db_default=Now())
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "deliveries"
        constraints = [
            # One delivery per event and subscription: the trigger runs once per event row.
            models.UniqueConstraint(fields=["subscription", "event_id"], name="webhook_once"),
        ]
        indexes = [
            models.Index(fields=["org", "-id"], name="webhook_delivery_org"),
            models.Index(fields=["subscription", "-id"], name="webhook_delivery_sub"),
            # The claim: organisations with pending deliveries, then each one's due ones.
            models.Index(
                fields=["org", "next_at"],
                name="webhook_pending",
                condition=models.Q(status="pending"),
            ),
            # An organisation's deliveries in flight (its concurrency cap).
            models.Index(
                fields=["org", "lease_until"],
                name="webhook_in_flight",
                condition=models.Q(status="pending", lease_until__isnull=False),
            ),
            # Retention: finished deliveries, oldest first.
            models.Index(
                fields=["created_at"],
                name="webhook_finished",
                condition=~models.Q(status="pending"),
            ),
        ]

    def __str__(self) -> str:
        return f"delivery {self.pk} {self.event_type} ({self.status})"
