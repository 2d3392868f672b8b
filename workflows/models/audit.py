"""The audit log: who did what, from the admin, the API and the command line.

One row per action a person, an API key or a command took (a run cancelled, an approval
decided, a connection changed, a key revoked, ...), written in the transaction of the action
itself (``workflows.plugins.record_audit``), so an action and its record commit together or
not at all. Rows are never changed or deleted: the model refuses, and so does the database
(the trigger ``workflows_audit_append_only``, migration 0022), except the retention purge
(``services/audit.py::purge_audit``), which deletes only entries older than the retention it
announces in its own transaction. ``detail`` never holds a secret (``record_audit`` refuses
keys that name one).
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.functions import Now


class ActorKind(models.TextChoices):
    USER = "user"  # a person signed in to the admin (id: the user's id)
    API_KEY = "api_key"  # an organisation's API key (id: its public prefix)
    SLACK_USER = "slack_user"  # a Slack user (id: team:user), acting as the linked person
    COMMAND = "command"  # a management command (id: the operating-system user)
    SYSTEM = "system"  # Waymark itself, or code that named nobody


class AuditEntry(models.Model):
    # Every read is one organisation's newest first (index audit_org_id); no index of its own.
    org = models.ForeignKey("workflows.Organisation", on_delete=models.PROTECT, db_index=False)
    at = models.DateTimeField(db_default=Now())
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor_id = models.CharField(max_length=150)
    actor_display = models.CharField(max_length=150)
    action = models.CharField(max_length=64)  # a stable code: "run.cancel", "api_key.revoke"
    target_type = models.CharField(max_length=40)  # "run", "connection", "api_key", ...
    target_id = models.CharField(max_length=200)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["org", "-id"], name="audit_org_id"),
            # What happened to one thing: a run's, a connection's, a key's entries.
            models.Index(fields=["org", "target_type", "target_id", "-id"], name="audit_target"),
            # Retention: the oldest entries first.
            models.Index(fields=["at"], name="audit_at"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.target_type}:{self.target_id} by {self.actor_display}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise TypeError("audit entries are append-only: an entry is never changed")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("audit entries are append-only: an entry is never deleted")
