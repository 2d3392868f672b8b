"""Slack clicks: recorded when they arrive, answered at once, decided after the answer.

Slack shows the person an error unless the interaction is answered within 3 seconds, and a
decision may have to wait for the request's row lock (another decision, the deadline, an
escalation, an operator). So the click is split in two:

**Receiving** (``receive``, in the view, approvals/slack.py): once the signature, the
timestamp window, the payload, the action and the button's token are checked (none of them
waits on the request's row), the click is one INSERT into ``approvals_slackinteraction``
and the view answers ``received``. The insert cannot wait on the request's row lock: the
table has no foreign key to the request (a foreign key's check takes a key-share lock on
the row it references).

**Deciding** (``apply``): one transaction locks the click's row (SKIP LOCKED: a row locked
is being applied by someone else), checks what the view left for later because it reads
the request (the token is this request's, the workspace, the Slack user's Django user),
decides (``services.decide_within``: the rules and the first-write-wins of every decision,
a click racing a cancel or another decision included) and marks the row applied with the
outcome. A crash before that commit leaves the row as it was received; it is applied again
from the start. So every click is decided exactly once.

**Who applies it**: the web process that received it, on a thread started once the row is
committed (``apply_soon``, the answer does not wait for it); and the elected sweeper's
approvals pass (``apply_received``, about once a minute), for a click still unapplied
because its process died after the answer or its try failed.

**Feedback**, after the decision commits: the request's Slack messages (``update_messages``;
the sweep redoes them while the request is ``slack_stale``) and the reply to the person
through the click's ``response_url``, claimed (``replied_at``) before it is sent, so it is
sent at most once; the sweep sends a reply still owed while Slack accepts it (30 minutes).

**Failures**: a transient database error (a deadlock, a lost connection) leaves the click for
another try. Any other error counts (``attempts``); at MAX_ATTEMPTS the click is marked
``failed`` and the person is told to decide in Waymark. Applied clicks are deleted after
KEEP_DAYS; the audit (``DecisionAttempt``) keeps every attempt.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import connection, transaction
from django.db.models.functions import Now

from effects.public import load_connection
from workflows.plugins import StepFailure
from workflows.plugins.engine import fetch_dict, fetch_dicts, is_transient, lost_connection

from . import sql
from .models import ApprovalRequest, SlackInteraction, SlackUser
from .services import Actor, Outcome, decide_within, record_attempt
from .slack import PROVIDER, respond, update_messages

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 5  # failed tries (not transient errors) before a click is marked failed
FAST_TRIES = 3  # tries on the web process's thread when a transient error meets it
BATCH = 100  # clicks the sweep applies per pass
KEEP_DAYS = 7
MAX_RESPONSE_URL = 2000  # Slack's are about 100 characters
RECEIVED_TEXT = "Received: Waymark is recording your decision."
FAILED_TEXT = "Waymark could not record your decision; please decide in Waymark."


def receive(
    *,
    token: dict[str, Any],
    decision: str,
    block_id: str,
    team_id: str,
    slack_user_id: str,
    ip: str | None,
    response_url: str,
) -> SlackInteraction:
    """Record a verified click (its button's token read and checked). Its organisation is
    read with a plain SELECT, which never waits on a row lock."""
    approval_id = int(token["a"])
    org_id = ApprovalRequest.objects.filter(pk=approval_id).values_list("org_id", flat=True).first()
    if len(response_url) > MAX_RESPONSE_URL:
        response_url = ""  # not one of Slack's: no reply
    return SlackInteraction.objects.create(
        org_id=org_id,
        approval_id=approval_id,
        decision=decision,
        token=token,
        block_id=block_id[:255],
        team_id=team_id,
        slack_user_id=slack_user_id,
        ip=ip,
        response_url=response_url,
    )


def apply_soon(interaction_id: int) -> None:
    """Apply a received click on a thread of this process, so the answer does not wait for
    it. Should this process die first, the sweep applies it."""

    def work() -> None:
        try:
            for attempt in range(1, FAST_TRIES + 1):
                try:
                    apply(interaction_id)
                    return
                except Exception as exc:
                    if not is_transient(exc) or attempt == FAST_TRIES:
                        logger.exception("Slack click %s: not applied yet", interaction_id)
                        return
                    if lost_connection(exc):
                        connection.close()
        finally:
            connection.close()

    threading.Thread(target=work, name=f"slack-click-{interaction_id}", daemon=True).start()


def apply(interaction_id: int) -> Outcome | None:
    """Decide one received click and tell the person: its outcome, or None when it is
    applied already or being applied by another thread or process."""
    try:
        with transaction.atomic(durable=True):
            row = _unapplied_locked(interaction_id)
            if row is None:
                return None
            outcome = _settle(row)
            SlackInteraction.objects.filter(pk=row.pk).update(
                applied_at=Now(), outcome=outcome.code[:32], reply=_reply_text(outcome)
            )
    except Exception as exc:
        if not is_transient(exc):
            _count_failure(interaction_id)
        raise
    _feedback(interaction_id, outcome)
    return outcome


def apply_received(by: str = "sweep") -> int:
    """The sweep's pass: apply clicks still unapplied (oldest first, a bounded batch), send
    replies still owed, delete old applied clicks. How many clicks it applied."""
    ids = list(
        SlackInteraction.objects.filter(applied_at__isnull=True)
        .order_by("id")
        .values_list("pk", flat=True)[:BATCH]
    )
    applied = 0
    for interaction_id in ids:
        try:
            applied += apply(interaction_id) is not None
        except Exception as exc:
            transient = is_transient(exc)
            logger.warning("Slack click %s: not applied (%s); tried again later",
                           interaction_id, type(exc).__name__, exc_info=not transient)  # fmt: skip
            if lost_connection(exc):
                connection.close()
    with connection.cursor() as cursor:
        cursor.execute(sql.OWED_REPLIES, {"batch": BATCH})
        owed = [row["id"] for row in fetch_dicts(cursor)]
        cursor.execute(sql.PURGE_CLICKS, {"keep_days": KEEP_DAYS})
    for interaction_id in owed:
        _reply(interaction_id)
    return applied


# --- deciding ------------------------------------------------------------------------------------


def _settle(row: SlackInteraction) -> Outcome:
    """The checks that read the request, then the decision, in the caller's transaction."""
    token = row.token if isinstance(row.token, dict) else {}
    actor = Actor(
        via="slack",
        name=f"slack:{row.slack_user_id}",
        ip=row.ip,
        slack_team_id=row.team_id,
        slack_user_id=row.slack_user_id,
    )
    approval = ApprovalRequest.objects.filter(pk=row.approval_id).first()
    if (
        approval is None
        or token.get("v") != row.decision
        or row.block_id != f"waymark_approval:{approval.pk}"
        or (approval.run_id, approval.step_id, approval.iteration)
        != (token.get("r"), token.get("s"), token.get("i"))
    ):
        return _refused(actor, approval, row.decision, "token_mismatch",
                        "This button does not belong to this request.",
                        "the button's token is for another request, step or decision")  # fmt: skip
    team = approval.slack_team_id or _connection_team(approval)
    if not team or team != row.team_id:
        why = "from another Slack workspace" if team else "and the connection has no team_id"
        return _refused(actor, approval, row.decision, "wrong_workspace",
                        "This request does not belong to your Slack workspace.",
                        f"team {row.team_id!r} {why}")  # fmt: skip
    link = (
        SlackUser.objects.select_related("user")
        .filter(org_id=approval.org_id, team_id=row.team_id, slack_user_id=row.slack_user_id)
        .first()
    )
    if link is None:
        return _refused(actor, approval, row.decision, "unknown_slack_user",
                        "Your Slack account is not linked to a Waymark user, so you cannot "
                        "decide here.", "no Waymark user is linked to this Slack user")  # fmt: skip
    person = Actor(
        via="slack",
        name=link.user.get_username(),
        user=link.user,
        ip=row.ip,
        slack_team_id=row.team_id,
        slack_user_id=row.slack_user_id,
    )
    return decide_within(
        approval.pk,
        decision=row.decision,
        actor=person,
        digest=str(token.get("d")),
        level=int(token.get("l", -1)),
    )


def _connection_team(approval: ApprovalRequest) -> str:
    """The workspace of the connection the request is posted through (its vetted
    ``team_id``), for a click on a message whose post the request has not recorded yet: the
    message is in Slack as soon as Slack answered the post, a moment before the worker
    records it with the workspace it read from this same connection (steptypes._post)."""
    if not approval.slack_connection:
        return ""
    try:
        conn = load_connection(approval.org_id, approval.slack_connection, PROVIDER)
    except StepFailure:  # deleted or changed since: no workspace to match
        return ""
    return str(((conn.options or {}) if conn is not None else {}).get("team_id") or "")[:32]


def _refused(
    actor: Actor, approval: ApprovalRequest | None, decision: str, code: str, text: str, detail: str
) -> Outcome:
    record_attempt(actor, approval, decision, accepted=False, reason=code, detail=detail)
    return Outcome(False, code, text, approval)


def _reply_text(outcome: Outcome) -> str:
    approval = outcome.approval
    if outcome.accepted and approval is not None:
        return f"{approval.status.capitalize()} by {approval.decided_by}. Thank you."
    return outcome.message


def _unapplied_locked(interaction_id: int) -> SlackInteraction | None:
    """The click, locked in the caller's transaction, if it is not applied yet and no other
    transaction holds it (a thread or process applying it now)."""
    return (
        SlackInteraction.objects.select_for_update(skip_locked=True)
        .filter(pk=interaction_id, applied_at__isnull=True)
        .first()
    )


def _count_failure(interaction_id: int) -> None:
    """A try that failed for a reason of its own (not a transient database error): counted;
    at MAX_ATTEMPTS the click is given up (``failed``) and the person told."""
    try:
        with transaction.atomic(durable=True):
            row = _unapplied_locked(interaction_id)
            if row is None:
                return
            tries = row.attempts + 1
            if tries < MAX_ATTEMPTS:
                SlackInteraction.objects.filter(pk=row.pk).update(attempts=tries)
                return
            SlackInteraction.objects.filter(pk=row.pk).update(
                attempts=tries, applied_at=Now(), outcome="failed", reply=FAILED_TEXT
            )
        logger.error("Slack click %s: given up after %s failed tries", interaction_id, tries)
    except Exception:
        logger.warning("Slack click %s: its failure was not counted", interaction_id)
        return
    _reply(interaction_id)


# --- feedback --------------------------------------------------------------------------------


def _feedback(interaction_id: int, outcome: Outcome) -> None:
    """After the decision commits: the request's messages show it, and the person is told."""
    try:
        if outcome.accepted and outcome.approval is not None:
            update_messages(outcome.approval.pk)
    except Exception:
        logger.warning("Slack click %s: the messages were not updated", interaction_id)
    _reply(interaction_id)


def _reply(interaction_id: int) -> bool:
    """Send the click's reply to its response_url, once (claimed first); whether it was
    claimed. A reply that fails is not sent again (the request's message shows the state)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.CLAIM_REPLY, {"interaction_id": interaction_id})
        claimed = fetch_dict(cursor)
    if claimed is None:
        return False
    try:
        respond(int(claimed["approval_id"]), str(claimed["response_url"]), str(claimed["reply"]))
    except Exception as exc:
        logger.warning("Slack click %s: the reply was not sent (%s)", interaction_id,
                       type(exc).__name__)  # fmt: skip
    return True
