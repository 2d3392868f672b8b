"""Signals: messages from outside that waiting steps wait for.

A signal is stored before anything else happens, under a unique identity per organisation
(the sender's id, or a digest of its content), so a transport's duplicate is applied once. It
is matched to a `wait_signal` step by name and correlation key (or to one run, for
signal-with-start); one that arrives before its run waits is kept until the run gets there.
Consuming it and moving the run on commit together. See workflows/services/signals.py.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models.functions import Now


class Signal(models.Model):
    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.CASCADE, related_name="signals"
    )
    name = models.CharField(max_length=100)
    correlation = models.CharField(max_length=500, blank=True, default="")
    # Every key it may answer, the correlation first (an email reply: its In-Reply-To and
    # References), so a reply that came first still meets the step that waits on any of them.
    correlations = ArrayField(models.CharField(max_length=500), default=list, blank=True)
    # For signal-with-start: this run's waiting step takes it, whatever its correlation.
    run = models.ForeignKey(
        "workflows.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        db_constraint=False,
    )  # fmt: skip
    identity = models.CharField(max_length=200)
    payload = models.JSONField(null=True, blank=True)
    source = models.CharField(max_length=40, default="api")  # api, email, ...
    received_at = models.DateTimeField(db_default=Now())
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by = models.CharField(max_length=120, blank=True, default="")  # run/step/iteration
    dropped_at = models.DateTimeField(null=True, blank=True)  # unmatched past retention

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["org", "identity"], name="signal_org_identity"),
        ]
        indexes = [
            # Pending signals by what they match: a step entering a wait looks here.
            models.Index(
                fields=["org", "name", "correlation", "id"],
                name="signal_pending",
                condition=models.Q(consumed_at__isnull=True, dropped_at__isnull=True),
            ),
            models.Index(
                fields=["received_at"],
                name="signal_pending_age",
                condition=models.Q(consumed_at__isnull=True, dropped_at__isnull=True),
            ),
            # Pending signals for one run (signal-with-start): the sweep's late matching
            # probes it per waiting step. (Those matched by correlation: the GIN index
            # signal_pending_keys, migration 0020, over sql/functions.SIGNAL_KEYS_V1.)
            models.Index(
                fields=["run", "id"],
                name="signal_pending_run",
                condition=models.Q(
                    consumed_at__isnull=True, dropped_at__isnull=True, run__isnull=False
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"signal {self.name} ({self.correlation or self.run_id})"
