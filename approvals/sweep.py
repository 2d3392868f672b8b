"""Housekeeping the elected sweeper runs about once a minute (registered in steptypes.py):

- ``wake_decided``: a request decided while its step was not parked (``wake_owed``) whose
  step has parked since without seeing it: wake the step with the decision now.
- ``close_orphans``: pending requests whose step ended another way (its run cancelled,
  failed, migrated): ``cancelled``, so nobody decides them any more.
- ``send_reminders``: a reminder (a Slack thread reply) for requests whose next reminder is
  due; claimed before it is sent, so a crash loses at most that reminder, never repeats it.
- ``update_slack``: request messages that still show an old state (``chat.update``).
- ``slack_clicks``: Slack clicks received but not yet decided (their web process died after
  the answer, or their try failed), replies still owed to the people who clicked, and old
  clicks deleted (approvals/inbox.py).
"""

from __future__ import annotations

import logging

from django.db import connection, transaction

from workflows.plugins.engine import (
    StepStatus,
    Wake,
    crash_point,
    database_now,
    fetch_dicts,
    log_failure,
    wake_step,
)

from . import sql
from .models import ApprovalRequest, RequestStatus

logger = logging.getLogger(__name__)

BATCH = 100


def wake_decided(by: str = "sweep") -> int:
    woken = 0
    ids = list(
        ApprovalRequest.objects.filter(wake_owed=True)
        .order_by("decided_at")
        .values_list("pk", flat=True)[:BATCH]
    )
    from workflows.models import Step

    from .services import outcome_of, output_of

    for approval_id in ids:
        try:
            with transaction.atomic(durable=True):
                approval = ApprovalRequest.objects.select_for_update().get(pk=approval_id)
                status = (
                    Step.objects.filter(pk=approval.step_row_id)
                    .values_list("status", flat=True)
                    .first()
                )
                if status in (StepStatus.READY, StepStatus.RUNNING):
                    continue  # its executor is on it, and reads the decision
                if status == StepStatus.WAITING:
                    woke = wake_step(
                        step_pk=approval.step_row_id,
                        wake=Wake(
                            outcome=outcome_of(approval),
                            output=output_of(approval),
                            reason="approval",
                            by=by,
                        ),
                    )
                    if not woke:
                        # Waiting out a retry's backoff (or its paused run): its executor
                        # reads the decision when it runs; owed until then.
                        continue
                    woken += 1
                ApprovalRequest.objects.filter(pk=approval_id).update(wake_owed=False)
                crash_point("approval.after_decision")  # woken with it, not committed
        except Exception as exc:
            log_failure(logger, exc, "waking the step of approval %s failed", approval_id)
    return woken + close_orphans(by)


def close_orphans(by: str = "sweep") -> int:
    finished = [StepStatus.DONE, StepStatus.FAILED, StepStatus.CANCELLED]
    with connection.cursor() as cursor:
        cursor.execute(sql.CLOSE_ORPHANS, {"finished": finished, "batch": BATCH})
        return int(cursor.rowcount)


def send_reminders(by: str = "sweep") -> int:
    from .slack import connection_for, slack_call, slack_escape
    from .steptypes import next_reminder

    sent = 0
    with connection.cursor() as cursor:
        cursor.execute(sql.DUE_REMINDERS, {"batch": BATCH})
        ids = [row["id"] for row in fetch_dicts(cursor)]
    for approval_id in ids:
        with transaction.atomic(durable=True):
            approval = (
                ApprovalRequest.objects.select_for_update(skip_locked=True)
                .filter(pk=approval_id, status=RequestStatus.PENDING)
                .first()
            )
            if approval is None or approval.next_reminder_at is None:
                continue
            now = database_now()  # the transaction's start, as the claim's query saw it
            if approval.next_reminder_at > now:
                continue
            later = next_reminder(now, approval.expires_at, list(approval.reminders or []))
            ApprovalRequest.objects.filter(pk=approval_id).update(
                next_reminder_at=later, reminders_sent=approval.reminders_sent + 1
            )
        # Claimed (committed): now send it, at most once.
        messages = [m for m in approval.slack_messages or [] if m.get("level") == approval.level]
        conn = connection_for(approval) if messages else None
        if conn is None:
            continue
        text = (
            f"Reminder: this {approval.kind} needs an answer by "
            f"{approval.expires_at:%Y-%m-%d %H:%M} UTC: {slack_escape(approval.message[:200])}"
        )
        try:
            slack_call(
                conn,
                "chat_postMessage",
                channel=messages[0]["channel"],
                thread_ts=messages[0]["ts"],
                text=text,
            )
            sent += 1
        except Exception:
            logger.warning("approval %s: the reminder was not posted", approval_id, exc_info=True)
    return sent


def update_slack(by: str = "sweep") -> int:
    from .slack import update_stale_messages

    return update_stale_messages(by)


def slack_clicks(by: str = "sweep") -> int:
    from .inbox import apply_received

    return apply_received(by)


def run_all(by: str = "test") -> int:
    """Every pass once (tests, and ``manage.py`` shells)."""
    return slack_clicks(by) + wake_decided(by) + send_reminders(by) + update_slack(by)
