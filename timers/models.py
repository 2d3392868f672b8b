"""Timers, the sweeper's lease, and which organisations the due sweep served last.

A timer is one durable wait of one step execution: the intent (a duration, a moment, a
weekly rule), the zone it is read in, the spread and the deterministic offset within it, and
the UTC instant it fires at (``due_at``, offset included). It is written in the same
transaction that enters its step, and fired by the due sweep in the same transaction that
moves its run on. See ``timers/sweep.py``. A timer whose step is cancelled first (its run
cancelled or ended, its fork completed without it) is cancelled with it, in the same
transaction (``cancelled_at``; ``sql.CANCEL_WITH_STEP_V1``), and never fires. Pending:
neither fired nor cancelled.

A schedule starts runs of an automation on a cron schedule in a zone (``timers/schedules.py``).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.functions import Now

from .cron import first_occurrence, schedule_problems


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
    cancelled_at = models.DateTimeField(null=True, blank=True)  # its step was cancelled first
    # What firing raised, when it was not the database's passing trouble (a deadlock, a lost
    # connection: those are retried, never recorded here).
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
            # and cancelled timers leave the index, so a backlog of history costs the sweep
            # nothing.
            models.Index(
                fields=["org", "due_at"],
                name="timer_pending",
                condition=models.Q(fired_at__isnull=True, cancelled_at__isnull=True),
            ),
            # The earliest pending instant of all (the sweeper sleeps until it). Its predicate
            # names `org_id > 0` on purpose: a query for one organisation's timers
            # (org_id = a parameter) cannot be proven to match it, so the planner can never
            # pick it over timer_pending for them, even with statistics taken before a
            # backlog grew (it then scanned the whole backlog once per organisation).
            models.Index(
                fields=["due_at"],
                name="timer_next_due",
                condition=models.Q(fired_at__isnull=True, cancelled_at__isnull=True, org_id__gt=0),
            ),
        ]

    def __str__(self) -> str:
        return f"timer {self.run_id}/{self.step_id}/{self.iteration} at {self.due_at}"


class OrgSweep(models.Model):
    """When the due sweep last served an organisation: the least recently served go first."""

    org_id = models.BigIntegerField(primary_key=True)
    served_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"org {self.org_id} served {self.served_at}"


class CatchUp(models.TextChoices):
    """What a schedule starts for the occurrences it missed (the sweep was down, or late)."""

    LATEST = "latest", "latest: start only the most recent missed occurrence"
    ALL = "all", "all: start every missed occurrence (at most 100 per sweep tick)"
    NONE = "none", "none: skip missed occurrences, start only the ones on time"


class Schedule(models.Model):
    """Starts runs of an automation on a cron schedule read in a time zone.

    ``next_at`` is the UTC instant of the next occurrence to start; the sweep starts each
    due occurrence with the start key ``schedule:<id>:<instant in UTC>`` (so an occurrence
    never starts twice) and then moves ``next_at`` on, following ``catch_up`` for the
    occurrences it missed. See ``timers/schedules.py``.
    """

    org = models.ForeignKey("workflows.Organisation", on_delete=models.CASCADE)
    automation = models.ForeignKey(
        "workflows.Automation", on_delete=models.CASCADE, related_name="schedules"
    )
    name = models.CharField(max_length=100)
    cron = models.CharField(
        max_length=100,
        help_text="5 fields: minute hour day-of-month month day-of-week, read in the time "
        "zone, such as '30 9 * * mon-fri'.",
    )
    timezone = models.CharField(
        max_length=64, default="UTC", help_text="An IANA time zone, such as 'Europe/Berlin'."
    )
    input = models.JSONField(default=dict, blank=True, help_text="Each run's input: an object.")
    enabled = models.BooleanField(default=True)
    catch_up = models.CharField(max_length=8, choices=CatchUp.choices, default=CatchUp.LATEST)
    # The next occurrence to start (UTC). Computed from now when the schedule is created,
    # enabled again, or its cron or zone changes.
    next_at = models.DateTimeField()
    last_started_at = models.DateTimeField(
        null=True, blank=True, help_text="The scheduled instant of the last occurrence started."
    )
    last_run_id = models.BigIntegerField(null=True, blank=True)  # not a key: runs are purged
    last_error = models.TextField(blank=True, default="")
    last_error_at = models.DateTimeField(null=True, blank=True)
    # While a sweeper starts this schedule's occurrences; a sweeper that died leaves it to
    # lapse, and the next one starts the same occurrences with the same keys.
    claimed_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["org", "name"]
        constraints = [
            models.UniqueConstraint(fields=["org", "name"], name="schedule_name_per_org"),
        ]
        indexes = [
            # The due scan: enabled schedules by their next occurrence.
            models.Index(fields=["next_at"], name="schedule_due", condition=models.Q(enabled=True)),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        problems: dict[str, str] = schedule_problems(
            cron=self.cron, timezone=self.timezone, run_input=self.input
        )
        if (
            self.automation_id is not None
            and self.org_id is not None
            and self.automation.org_id != self.org_id
        ):
            problems["automation"] = "the automation is another organisation's"
        if problems:
            raise ValidationError(problems)

    def save(self, *args: Any, **kwargs: Any) -> None:
        if getattr(self, "next_at", None) is None:  # new: its first occurrence from now
            self.next_at = first_occurrence(self.cron, self.timezone)
        super().save(*args, **kwargs)
