"""A migration of runs from one version of an automation to another: one job row.

The plan (which runs, the step mapping, the rule for a removed step) is fixed when the job is
created; the job then moves its runs one by one, each in a transaction of its own, and each
move is a ``run.migrated`` event in the run's history naming this job. ``moved`` grows in the
transaction of each move, so it is exact whatever stops the job. A job that was stopped (its
process killed, its API call's batch used up) is ``running`` until someone resumes it with its
id: the runs it moved are on the target version already and are not moved again. See
``workflows/services/run_migration/``.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class MigrationStatus(models.TextChoices):
    RUNNING = "running"  # moving runs, or stopped before the end: resume it by its id
    FINISHED = "finished"  # every run it could move moved; ``report`` says what was left


class RunMigration(models.Model):
    # Read by (org, automation, id) only (the index below); the versions are never deleted
    # once published, so their references need no index of their own.
    org = models.ForeignKey("workflows.Organisation", on_delete=models.PROTECT, db_index=False)
    automation = models.ForeignKey("workflows.Automation", on_delete=models.PROTECT, db_index=False)
    from_version = models.ForeignKey(
        "workflows.AutomationVersion", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    to_version = models.ForeignKey(
        "workflows.AutomationVersion", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    # What was asked, normalised: {"map": {old: new}, "removed": "stay" | {"move_to": id},
    # "steps": [...], "statuses": [...]} (services/run_migration/plan.py).
    plan = models.JSONField()
    status = models.CharField(
        max_length=16, choices=MigrationStatus.choices, default=MigrationStatus.RUNNING
    )
    # The dry run taken when the job was made (what it expected to do), and once it finished,
    # the same report over the runs it left on the old version (what it could not move, why).
    planned = models.JSONField(null=True, blank=True)
    report = models.JSONField(null=True, blank=True)
    moved = models.PositiveIntegerField(default=0)  # grows with each move, in its transaction
    created_by = models.CharField(max_length=150)  # api_key:<prefix>, admin:<user>, command:<user>
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["org", "automation", "-id"], name="migration_org_auto")]

    def __str__(self) -> str:
        return f"migration {self.pk}"
