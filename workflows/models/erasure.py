"""Erasures of a person: the tombstone each one leaves (``workflows/services/erasure/``).

It says who erased, when, by what kind of identifier, which runs were cancelled, left to
finish or scrubbed, and how many rows of which table and column changed; never the value. It
keeps the value's keyed hash (``subject_digest``: HMAC-SHA256 under a key derived from
SECRET_KEY), so a later request for the same person is recognised (``repeat_of``) without the
tombstone holding who it was. Never changed once written (the admin shows it read-only).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class Erasure(models.Model):
    org = models.ForeignKey("workflows.Organisation", on_delete=models.PROTECT, db_index=False)
    at = models.DateTimeField(db_default=Now())
    # Who erased: the audit log's actor (``workflows.services.audit.Actor``).
    actor_kind = models.CharField(max_length=16)
    actor_id = models.CharField(max_length=150)
    actor_display = models.CharField(max_length=150)
    subject_kind = models.CharField(max_length=16)  # email, phone, identifier
    subject_digest = models.CharField(max_length=80)  # keyed hash, not the value
    # The earlier erasure of the same person in this organisation, when there was one.
    repeat_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        db_index=False,
    )  # fmt: skip
    runs_cancelled = models.JSONField(default=list)  # run ids
    runs_finishing = models.JSONField(default=list)  # run ids left to finish without the data
    runs_scrubbed = models.JSONField(default=list)  # every run a value was removed from
    values_removed = models.PositiveIntegerField(default=0)  # how many distinct values
    # Rows changed per "table.column" ({"workflows_run.input": 2, ...}).
    counts = models.JSONField(default=dict)

    class Meta:
        ordering = ["-id"]
        # Erasing is its own permission (the admin's "Add erasure" asks for it, not for
        # add_erasure): a staff member given every permission of the app by habit should not
        # erase people by accident.
        permissions = [("erase_person", "Can erase a person")]
        indexes = [
            models.Index(fields=["org", "-id"], name="erasure_org_id"),
            models.Index(fields=["org", "subject_digest"], name="erasure_org_subject"),
        ]

    def __str__(self) -> str:
        return f"erasure {self.pk} ({self.subject_kind})"

    @property
    def rows_changed(self) -> int:
        return sum(self.counts.values())
