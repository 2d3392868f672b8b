"""Timers, the sweeper's lease, and which organisations the due sweep served last.

A timer is one durable wait of one step execution: the intent (a duration, a moment, a
weekly rule), the zone it is read in, the spread and the deterministic offset within it, and
the UTC instant it fires at (``due_at``, offset included). It is written in the same
transaction that enters its step, and fired by the due sweep in the same transaction that
moves its run on. See ``timers/sweep.py``.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class Timer(models.Model):
    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.PROTECT, db_index=False, db_constraint=False
    )
    run = models.ForeignKey("workflows.Run", on_delete=models.CASCADE, related_name="timers")
    # The waiting step, as the run knows it (the step row is written in the same transaction).
    step_id = models.CharField(max_length=63)
    iteration = models.PositiveIntegerField()
    kind = models.CharField(max_length=16)  # the step type: wait, wait_until
    intent = models.JSONField()  # {"duration": s} / {"at": text} / {"rule": {...}}, as written
    zone = models.CharField(max_length=64, blank=True, default="")
    spread_seconds = models.FloatField(default=0)
    offset_seconds = models.FloatField(default=0)  # hash(run id) mod spread: stable
    due_at = models.DateTimeField()
    fired_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["due_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "step_id", "iteration"], name="timer_run_step_iteration"
            ),
        ]
        indexes = [
            # The fair sweep: per organisation, earliest first, pending timers only. Fired
            # timers leave the index, so a backlog of history costs the sweep nothing.
            models.Index(
                fields=["org", "due_at"],
                name="timer_pending",
                condition=models.Q(fired_at__isnull=True),
            ),
            # The earliest pending instant of all (the sweeper sleeps until it).
            models.Index(
                fields=["due_at"], name="timer_next_due", condition=models.Q(fired_at__isnull=True)
            ),
        ]

    def __str__(self) -> str:
        return f"timer {self.run_id}/{self.step_id}/{self.iteration} at {self.due_at}"


class SweepLease(models.Model):
    """One sweeper works per tick: whoever holds this row's lease. Renewed every tick; a
    dead holder's lease lapses and another sweeper takes it."""

    name = models.CharField(max_length=32, primary_key=True)
    holder = models.CharField(max_length=100)
    lease_until = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder} until {self.lease_until}"


class OrgSweep(models.Model):
    """When the due sweep last served an organisation: the least recently served go first."""

    org_id = models.BigIntegerField(primary_key=True)
    served_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"org {self.org_id} served {self.served_at}"
