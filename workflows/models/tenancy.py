"""Organisations and their API keys.

Every domain table carries ``org`` so each hot query can filter on it (and the schema can be
distributed by organisation later). API keys are shown once and stored as a SHA-256 digest:
they are 256-bit random secrets, so a slow password hash would add nothing but latency.
"""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

KEY_PREFIX = "wmk"


class Organisation(models.Model):
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    # Quotas of this organisation; empty: the defaults in settings (WAYMARK_QUOTA_*), 0: none.
    quota_automations = models.PositiveIntegerField(null=True, blank=True)
    quota_versions = models.PositiveIntegerField(null=True, blank=True)
    quota_running_runs = models.PositiveIntegerField(null=True, blank=True)
    quota_starts_per_minute = models.PositiveIntegerField(null=True, blank=True)
    quota_schedules = models.PositiveIntegerField(null=True, blank=True)
    quota_pending_signals = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class QuotaUsage(models.Model):
    """What an organisation holds of one quota, as the admissions see it (services/quotas.py):
    every admission (a run's start, a signal kept pending) locks this row in its own
    transaction, so two cannot both take the last unit.

    ``bound`` is not below the true count: each admission adds one, nothing that ends (a
    run finishing, a signal consumed) takes one off (a run an operator resumes or retries is
    not a start: it is in the next count). When it reaches the quota the things themselves
    are counted again (no further than the quota) under the same lock, so the count is
    exact; NULL: not counted yet. ``window``/``window_count``: the starts of the
    current minute (kind "starts")."""

    # (org, kind) is unique: that index serves every lookup.
    org = models.ForeignKey(
        Organisation, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    kind = models.CharField(max_length=20)  # "starts", "pending_signals"
    bound = models.PositiveIntegerField(null=True)
    counted_at = models.DateTimeField(null=True)
    window = models.BigIntegerField(default=0)  # minutes since the epoch
    window_count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "kind"], name="quota_usage_org_kind"),
        ]

    def __str__(self) -> str:
        return f"{self.org_id} {self.kind}: {self.bound}"


class Membership(models.Model):
    """A person's access to one organisation in the admin. Staff users who are not superusers
    see and act on only the objects of the organisations they are members of."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    org = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="memberships")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["org", "user"]
        constraints = [
            models.UniqueConstraint(fields=["user", "org"], name="membership_user_org"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.org}"


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def new_raw_key() -> tuple[str, str]:
    """Return (lookup prefix, full key). The prefix is public and indexed; the rest is secret."""
    prefix = secrets.token_hex(6)
    return prefix, f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"


API_KEY_SCOPES = {"erasure": "erase a person (POST /api/v1/erasures, dry runs included)"}


class ApiKey(models.Model):
    org = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # A read-only key may read everything of its organisation and change nothing.
    read_only = models.BooleanField(default=False)
    # What a key may do beyond reading and writing (API_KEY_SCOPES): "erasure", erasing a
    # person (POST /api/v1/erasures), which no key may do unless given it.
    scopes = ArrayField(models.CharField(max_length=32), default=list, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["org", "created_at"])]

    def __str__(self) -> str:
        return f"{self.name} ({KEY_PREFIX}_{self.prefix}_…)"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def matches(self, raw_key: str) -> bool:
        return secrets.compare_digest(self.key_hash, hash_key(raw_key))
