"""Requests to people (approvals and tasks), the audit of every decision attempt, and the
mapping of Slack users to Django users.

An ``ApprovalRequest`` is one step execution's question (unique on run, step, iteration and
``series``), bound to the exact content under review by ``digest`` (sha256 of its canonical
JSON). A retry or a crash finds the same request; only an operator's retry of a step whose
request ended without a decision (expired with ``on_timeout: fail``, closed after the Slack
post failed for good) opens a new one, in the step's new series of attempts. Its status
moves once, from ``pending``, by a guarded UPDATE (``WHERE status = 'pending'``):

    pending -> approved | rejected   a person decided (Slack, the admin, the API)
    pending -> submitted             a person answered a task
    pending -> expired               the deadline passed (the step's executor, when woken)
    pending -> cancelled             its run or step ended another way (the sweep's tidy-up)

Escalation keeps it ``pending`` and raises ``level`` (new approvers, a new deadline).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models.functions import Now


class RequestStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    SUBMITTED = "submitted"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


REQUEST_TRANSITIONS: dict[str, frozenset[str]] = {
    RequestStatus.PENDING: frozenset(
        {
            RequestStatus.APPROVED,
            RequestStatus.REJECTED,
            RequestStatus.SUBMITTED,
            RequestStatus.EXPIRED,
            RequestStatus.CANCELLED,
        }
    ),
    RequestStatus.APPROVED: frozenset(),
    RequestStatus.REJECTED: frozenset(),
    RequestStatus.SUBMITTED: frozenset(),
    RequestStatus.EXPIRED: frozenset(),
    RequestStatus.CANCELLED: frozenset(),
}


class RequestKind(models.TextChoices):
    APPROVAL = "approval"
    TASK = "task"


class ApprovalRequest(models.Model):
    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.PROTECT, db_index=False, db_constraint=False
    )
    run = models.ForeignKey("workflows.Run", on_delete=models.CASCADE, related_name="+")
    # The step row of this execution: what a decision wakes (wake_step).
    step_row = models.ForeignKey(
        "workflows.Step", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    step_id = models.CharField(max_length=63)
    iteration = models.PositiveIntegerField()
    # The step's series of attempts (``Step.series_offset``) this request asks in: an
    # operator's retry starts a new series, and a request that ended without a decision is
    # then asked again as a new row (see approvals/steptypes.py).
    series = models.PositiveIntegerField(default=0)
    kind = models.CharField(max_length=10, choices=RequestKind.choices)
    status = models.CharField(
        max_length=10, choices=RequestStatus.choices, default=RequestStatus.PENDING
    )
    # What is under review: {"message": str, "content": any} for an approval, plus "form"
    # for a task. ``digest``: sha256 of its canonical JSON; a decision binds to it.
    content = models.JSONField()
    digest = models.CharField(max_length=64)
    # Who may decide now ("group:NAME", "user:USERNAME"); replaced on escalation.
    approvers = models.JSONField(default=list)
    level = models.PositiveSmallIntegerField(default=0)  # 1 once escalated
    expires_at = models.DateTimeField()
    # What the step said about its deadline and reminders (see approvals/steptypes.py).
    on_timeout = models.CharField(max_length=16, default="timed_out")
    escalate_to = models.JSONField(default=list, blank=True)
    escalate_seconds = models.FloatField(null=True, blank=True)
    reminders = models.JSONField(default=list, blank=True)  # seconds before the deadline
    next_reminder_at = models.DateTimeField(null=True, blank=True)
    reminders_sent = models.PositiveIntegerField(default=0)
    # The decision, once taken.
    decided_by = models.CharField(max_length=150, blank=True, default="")
    decided_via = models.CharField(max_length=10, blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True, default="")
    answer = models.JSONField(null=True, blank=True)  # a task's validated answer
    # Slack: where the request was posted (connection, channel, workspace), the messages
    # posted for it ([{"channel", "ts", "level"}]) and whether they show the current state.
    slack_connection = models.CharField(max_length=100, blank=True, default="")
    slack_channel = models.CharField(max_length=200, blank=True, default="")
    slack_team_id = models.CharField(max_length=32, blank=True, default="")
    slack_messages = models.JSONField(default=list, blank=True)
    slack_stale = models.BooleanField(default=False)  # messages still show an old state
    # Decided while its step was not parked (its executor was running): the sweep wakes
    # the step if it parks without having seen the decision.
    wake_owed = models.BooleanField(default=False)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "step_id", "iteration", "series"],
                name="approval_run_step_iteration_series",
            ),
        ]
        indexes = [
            models.Index(fields=["org", "status", "-id"], name="approval_org_status"),
            models.Index(
                fields=["next_reminder_at"],
                name="approval_reminder_due",
                condition=models.Q(status="pending", next_reminder_at__isnull=False),
            ),
            models.Index(
                fields=["decided_at"],
                name="approval_wake_owed",
                condition=models.Q(wake_owed=True),
            ),
            models.Index(
                fields=["updated_at"],
                name="approval_slack_stale",
                condition=models.Q(slack_stale=True),
            ),
        ]
        permissions = [
            ("decide_approvalrequest", "Can decide approvals and answer tasks"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.pk} ({self.status})"

    @property
    def message(self) -> str:
        content = self.content if isinstance(self.content, dict) else {}
        return str(content.get("message", ""))

    @property
    def form(self) -> dict[str, Any] | None:
        content = self.content if isinstance(self.content, dict) else {}
        form = content.get("form")
        return form if isinstance(form, dict) else None


class DecisionAttempt(models.Model):
    """Every verified attempt to decide or answer, accepted or refused, from wherever it came.
    A Slack interaction whose signature verifies but that cannot be tied to an approval (a
    payload that cannot be read, an unknown action, a bad token) is recorded with no approval
    and no organisation. Requests that do not verify (a bad signature, outside the 5-minute
    window, no signing secret configured) are not recorded here, since anyone can send them:
    they are logged as one WARNING line each (approvals/slack.py)."""

    org = models.ForeignKey(
        "workflows.Organisation",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        db_index=False,
        db_constraint=False,
    )
    approval = models.ForeignKey(
        ApprovalRequest,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="attempts",
    )
    via = models.CharField(max_length=10)  # slack, admin, api
    actor = models.CharField(max_length=150, blank=True, default="")  # a username, a key
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    ip = models.GenericIPAddressField(null=True, blank=True)
    slack_team_id = models.CharField(max_length=32, blank=True, default="")
    slack_user_id = models.CharField(max_length=32, blank=True, default="")
    decision = models.CharField(max_length=16, blank=True, default="")  # approve, reject, submit
    accepted = models.BooleanField(default=False)
    reason = models.CharField(max_length=32)  # "accepted" or why it was refused
    detail = models.TextField(blank=True, default="")
    at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["org", "-id"], name="attempt_org_id")]

    def __str__(self) -> str:
        verdict = "accepted" if self.accepted else f"refused ({self.reason})"
        return f"{self.decision or 'attempt'} by {self.actor or '?'} via {self.via}: {verdict}"


class SlackUser(models.Model):
    """Which Django user a Slack user is, in one organisation's workspace. A click is checked
    against this user's permissions at the moment it arrives."""

    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    team_id = models.CharField(max_length=32)
    slack_user_id = models.CharField(max_length=32)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_accounts"
    )
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["org", "team_id", "slack_user_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["org", "team_id", "slack_user_id"], name="slack_user_org_team_user"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.slack_user_id} -> {self.user}"


class SlackInteraction(models.Model):
    """A verified Slack button click, recorded the moment it arrives and decided after the
    answer (approvals/inbox.py): Slack wants its answer within 3 seconds, and the decision
    may wait on the request's row lock (another decision, the deadline, an escalation).

    ``approval_id`` is a plain column, not a foreign key: inserting a row with a foreign key
    takes a key-share lock on the row it references, so the insert would wait for whoever
    holds the request's row, which is what this table exists to avoid. The button's token
    was verified before the row was written; ``token`` keeps what it said.

    ``applied_at`` is set in the decision's own transaction (first write wins, as for any
    decision), with ``outcome`` (``accepted`` or the refusal's code) and the ``reply`` shown
    to the person. ``replied_at``: the reply was claimed for sending to ``response_url``
    (claimed before it is sent, so it is sent at most once)."""

    org = models.ForeignKey(
        "workflows.Organisation",
        on_delete=models.DO_NOTHING,
        null=True,
        blank=True,
        db_index=False,
        db_constraint=False,
        related_name="+",
    )
    approval_id = models.BigIntegerField()
    decision = models.CharField(max_length=16)  # approve, reject
    token = models.JSONField()  # the verified button token's payload
    block_id = models.CharField(max_length=255, blank=True, default="")
    team_id = models.CharField(max_length=32)
    slack_user_id = models.CharField(max_length=32)
    ip = models.GenericIPAddressField(null=True, blank=True)
    response_url = models.TextField(blank=True, default="")
    received_at = models.DateTimeField(db_default=Now())
    attempts = models.PositiveSmallIntegerField(default=0)  # failed tries to apply it
    applied_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=32, blank=True, default="")
    reply = models.TextField(blank=True, default="")
    replied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(
                fields=["id"],
                name="slack_interaction_pending",
                condition=models.Q(applied_at__isnull=True),
            ),
            models.Index(fields=["applied_at"], name="slack_interaction_applied"),
        ]

    def __str__(self) -> str:
        state = self.outcome or "received"
        return f"Slack {self.decision} of approval {self.approval_id} ({state})"
