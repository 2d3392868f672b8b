"""Approvals in Slack: the request message with Approve and Reject buttons, the signed tokens
the buttons carry, ``POST /slack/interactions``, and bringing the messages up to date.

**The message** is Block Kit rendered from the template ``approvals/slack_request.json``. It is
posted through the effect ledger under the step's effect key (an escalation's under
``<key>/escalation-1``), with the ``slack_message`` connection the step names, so a retry or
a crash never posts it twice (``effects/providers/slack.py`` finds it again by metadata).

**A button's value** is a token (``django.core.signing``, salted) binding one approval, its
run, step and iteration, the digest of the content, the escalation level and the decision
of that button; it expires with the request (plus ``TOKEN_GRACE_SECONDS``) and in any case
after ``APPROVALS_TOKEN_MAX_AGE_SECONDS``.

**The message** shows the request's message and content as they are under review, escaped
for Slack (``&``, ``<``, ``>``: run data cannot mention ``<!channel>`` or make links). A
section holds 3,000 characters; when the message or the content does not fit, the message
says it was truncated and links to the request's review page in Waymark, and it carries
**no buttons**: the buttons would approve the digest of the whole content, of which the
person saw only a part, so such a request is decided in the admin (or the API) where the
whole content is shown. The link is absolute when ``APPROVALS_PUBLIC_URL`` (or the
environment variable ``WAYMARK_PUBLIC_URL``, e.g. ``https://waymark.example.com``) is set.

**An interaction** is checked in this order: the body's size (``payload_too_large``, 413,
above ``DATA_UPLOAD_MAX_MEMORY_SIZE``: ``WAYMARK_MAX_REQUEST_BYTES``), the signature
(``X-Slack-Signature``, v0 HMAC-SHA256 of ``b"v0:" + timestamp + b":" + body`` with the
app's signing secret, computed by slack-sdk's ``SignatureVerifier`` and compared in
constant time; a body that is not UTF-8 does not verify), the 5-minute timestamp window (a
replay), the payload, the action and the button's token. Until the signature and the window
pass, anyone can send the request: a refusal then is one WARNING log line (no body, no
secret) and no audit row, so forged requests cannot grow the database. None of these reads
the request's row, so none waits on its lock. A click that passes them is recorded in the
inbox of received clicks and answered at once (``received``, an ephemeral text, never
replacing the message): Slack wants its answer within 3 seconds, and a decision may wait on
the request's row lock. After the answer (approvals/inbox.py) come the checks that read the
request: the workspace (the payload's team must be the connection's ``options.team_id``),
the Slack user's Django user (``SlackUser``, who must be a member of the request's
organisation), and the decision itself (``services.decide``'s rules: permission *then*,
first write wins); the outcome goes to the person through ``response_url``, and the request's
messages are updated (``chat.update``; the sweep redoes any update that did not happen,
``slack_stale``). Every verified attempt is recorded (``DecisionAttempt``).

The signing secret is the Slack app's: ``settings.APPROVALS_SLACK_SIGNING_SECRET`` or the
environment variable ``WAYMARK_SLACK_SIGNING_SECRET``. Without it every interaction is
refused (503).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import signing
from django.db import close_old_connections, connection
from django.template.loader import render_to_string
from django.urls import reverse

from effects.public import (
    EVENT_TYPE,
    Allowlist,
    Answer,
    CallDeadline,
    ConnectionInfo,
    Request,
    SlackMessageProvider,
    egress_client,
    load_connection,
    slack_call,
    vet_base_url,
)
from workflows.plugins import StepFailure
from workflows.plugins.engine import database_now

from .models import ApprovalRequest, RequestKind, RequestStatus

logger = logging.getLogger(__name__)

TOKEN_SALT = "waymark.approvals.slack-button"  # noqa: S105 (a salt, not a secret)
TOKEN_GRACE_SECONDS = 60
DEFAULT_TOKEN_MAX_AGE = 35 * 86_400
TEXT_CHARS = 2900  # a section's text holds 3000
SLACK_RESPONSE_HOSTS = ("hooks.slack.com",)
# The whole of a click's ephemeral reply, from connecting to its status (CallDeadline).
RESPOND_SECONDS = 5.0


def signing_secret() -> str:
    value = getattr(settings, "APPROVALS_SLACK_SIGNING_SECRET", None)
    if value is None:
        value = os.environ.get("WAYMARK_SLACK_SIGNING_SECRET", "")
    return str(value or "")


def public_url() -> str:
    """Where people reach Waymark (``https://waymark.example.com``), for links in messages;
    empty when not configured."""
    value = getattr(settings, "APPROVALS_PUBLIC_URL", None)
    if value is None:
        value = os.environ.get("WAYMARK_PUBLIC_URL", "")
    return str(value or "").rstrip("/")


def token_max_age() -> int:
    return int(getattr(settings, "APPROVALS_TOKEN_MAX_AGE_SECONDS", DEFAULT_TOKEN_MAX_AGE))


# --- tokens -------------------------------------------------------------------------------------


def make_token(approval: ApprovalRequest, decision: str) -> str:
    expires = int(approval.expires_at.timestamp()) + TOKEN_GRACE_SECONDS
    payload = {
        "a": approval.pk,
        "r": approval.run_id,
        "s": approval.step_id,
        "i": approval.iteration,
        "d": approval.digest,
        "l": approval.level,
        "v": decision,
        "e": expires,
    }
    return signing.dumps(payload, salt=TOKEN_SALT, compress=True)


class BadToken(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def read_token(value: str) -> dict[str, Any]:
    try:
        payload = signing.loads(value, salt=TOKEN_SALT, max_age=token_max_age())
    except signing.SignatureExpired:
        raise BadToken("token_expired", "This button has expired.") from None
    except signing.BadSignature:
        raise BadToken("token_invalid", "This button is not valid.") from None
    if not isinstance(payload, dict) or not all(k in payload for k in "arsidlve"):
        raise BadToken("token_invalid", "This button is not valid.")
    # The request's deadline on the database's clock, which the decision itself checks: a web
    # process whose clock runs ahead must not refuse the button before the deadline.
    if not isinstance(payload["e"], int) or payload["e"] < database_now().timestamp():
        raise BadToken("token_expired", "This button has expired: the request's deadline passed.")
    return payload


# --- the message ----------------------------------------------------------------------------------


def slack_escape(text: str) -> str:
    """Text for Slack's ``text`` and mrkdwn: ``&``, ``<`` and ``>`` escaped (Slack's rules),
    so run data cannot mention (``<!channel>``, ``<@U…>``) or link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escape_within(text: str, limit: int) -> tuple[str, bool]:
    """``text`` escaped for Slack and at most ``limit`` characters long, never cut inside
    an entity; and whether it had to be cut."""
    escaped = slack_escape(text)
    if len(escaped) <= limit:
        return escaped, False
    kept: list[str] = []
    used = 0
    for char in text:
        piece = slack_escape(char)
        if used + len(piece) > limit:
            break
        kept.append(piece)
        used += len(piece)
    return "".join(kept), True


def review_link(approval: ApprovalRequest) -> str:
    """The request's review page in the admin, as Slack mrkdwn."""
    path = reverse("admin:approvals_approvalrequest_review", args=[approval.pk])
    base = public_url()
    if base:
        return f"<{slack_escape(base + path)}|{approval.kind} {approval.pk}>"
    return f"Approval requests → {approval.kind} {approval.pk} ({slack_escape(path)})"


def message_blocks(
    approval: ApprovalRequest, *, superseded: bool = False
) -> tuple[str, list[dict[str, Any]]]:
    """The message's fallback text and blocks, as the request stands now. ``superseded``:
    a message of an earlier level (before an escalation): no buttons any more."""
    is_open = approval.status == RequestStatus.PENDING and not superseded
    kind = "Approval" if approval.kind == RequestKind.APPROVAL else "Task"
    content = approval.content if isinstance(approval.content, dict) else {}
    message, cut = escape_within(approval.message, TEXT_CHARS)
    details = content.get("content")
    detail_text = ""
    if approval.kind == RequestKind.APPROVAL and details not in (None, "", {}, []):
        shown = (
            details
            if isinstance(details, str)
            else json.dumps(details, indent=2, ensure_ascii=False)
        )
        # Its own ``` would end the code block early: what follows would be formatted.
        fenced, cut_details = escape_within(shown.replace("```", "`\u200b``"), TEXT_CHARS - 6)
        detail_text = "```" + fenced + "```"
        cut = cut or cut_details
    # Cut short, the message must not be decided from Slack: the buttons would approve the
    # digest of everything, of which only a part is shown here.
    notice = f"_(truncated — review it in Waymark: {review_link(approval)})_" if cut else ""
    context = (
        f"Run {approval.run_id} · step {slack_escape(approval.step_id)} · answer by "
        f"{approval.expires_at:%Y-%m-%d %H:%M} UTC · digest {approval.digest[:12]}"
    )
    buttons = is_open and not cut and approval.kind == RequestKind.APPROVAL
    values = {
        "title": f"{kind} requested"[:150],
        "message": message or "(no message)",
        "details": detail_text,
        "notice": notice,
        "context_line": context,
        "open": is_open,
        "buttons": buttons,
        "approval_id": approval.pk,
        "outcome_line": outcome_line(approval, superseded=superseded),
    }
    if buttons:
        values["approve_token"] = make_token(approval, "approve")
        values["reject_token"] = make_token(approval, "reject")
    template = (
        "approvals/slack_request.json"
        if approval.kind == RequestKind.APPROVAL
        else ("approvals/slack_task.json")
    )
    blocks = json.loads(render_to_string(template, values))
    text = f"{kind} requested: {slack_escape(approval.message[:200])}"
    if not is_open:
        text = outcome_line(approval, superseded=superseded)
    return text, blocks


def outcome_line(approval: ApprovalRequest, *, superseded: bool = False) -> str:
    status = approval.status
    if status in (RequestStatus.APPROVED, RequestStatus.REJECTED, RequestStatus.SUBMITTED):
        who = slack_escape(approval.decided_by)
        line = f"*{status.capitalize()}* by {who} via {approval.decided_via}"
        if approval.comment:
            line += f": “{slack_escape(approval.comment[:500])}”"
        return line
    if status == RequestStatus.EXPIRED:
        return f"*Expired* with no decision (then: {approval.on_timeout})."
    if status == RequestStatus.CANCELLED:
        return "*Closed*: the run ended another way."
    if superseded:
        return "*Escalated*: a newer message replaces this one."
    return "Pending."


class ApprovalMessageProvider(SlackMessageProvider):
    """The slack_message provider, posting Block Kit (the request with its buttons)."""

    def call(self, request: Request, key: str, conn: ConnectionInfo | None) -> Answer:
        metadata = {"event_type": EVENT_TYPE, "event_payload": {"effect_key": key}}
        response = slack_call(
            conn,
            "chat_postMessage",
            channel=request.payload["channel"],
            text=request.payload["text"],
            blocks=request.payload["blocks"],
            metadata=metadata,
        )
        channel, ts = response.get("channel"), response.get("ts")
        if not isinstance(channel, str) or not isinstance(ts, str) or not ts:
            from effects.public import Ambiguous

            raise Ambiguous("malformed answer from Slack: no channel or ts", {"ok": True})
        result = {"channel": channel, "ts": ts}
        return Answer(result=result, response=result)


PROVIDER = ApprovalMessageProvider()


def request_for(approval: ApprovalRequest, channel: str) -> Request:
    text, blocks = message_blocks(approval)
    return Request(
        payload={"channel": channel, "text": text, "blocks": blocks},
        summary={"channel": channel, "text": text[:500], "approval": approval.pk},
        recipient=None,  # a team's channel, not a person: no consent list applies
    )


def connection_for(approval: ApprovalRequest) -> ConnectionInfo | None:
    try:
        return load_connection(approval.org_id, approval.slack_connection, PROVIDER)
    except StepFailure:
        return None


def update_messages(approval_id: int) -> bool:
    """Make the request's Slack messages show its state now (``chat.update``, idempotent);
    True when every message is up to date. Called after a decision's answer, and by the
    sweep for any request still ``slack_stale``."""
    approval = ApprovalRequest.objects.filter(pk=approval_id).first()
    if approval is None or not approval.slack_messages:
        return True
    seen_update = approval.updated_at
    conn = connection_for(approval)
    if conn is None:
        return False
    for message in approval.slack_messages:
        superseded = int(message.get("level", 0)) != approval.level
        text, blocks = message_blocks(approval, superseded=superseded)
        try:
            slack_call(
                conn,
                "chat_update",
                channel=message["channel"],
                ts=message["ts"],
                text=text,
                blocks=blocks,
            )
        except Exception:
            logger.warning("approval %s: chat.update failed", approval_id, exc_info=True)
            return False
    # Up to date, unless it changed again meanwhile (then the next pass updates it).
    ApprovalRequest.objects.filter(pk=approval_id, updated_at=seen_update).update(slack_stale=False)
    return True


def update_stale_messages(by: str = "sweep") -> int:
    """The sweep's pass: bring stale messages up to date (a bounded batch)."""
    ids = list(
        ApprovalRequest.objects.filter(slack_stale=True)
        .order_by("updated_at")
        .values_list("pk", flat=True)[:50]
    )
    return sum(1 for approval_id in ids if update_messages(approval_id))


def update_after(approval: ApprovalRequest) -> None:
    """After a decision from the admin or the API commits: update its Slack messages, after
    the answer (a thread; the sweep redoes what it does not finish). A Slack click's
    decision does the same on its own thread (approvals/inbox.py)."""
    if not approval.slack_messages:
        return
    approval_id = approval.pk

    def work() -> None:
        try:
            update_messages(approval_id)
        except Exception:
            logger.exception("updating the Slack messages of approval %s", approval_id)
        finally:
            connection.close()

    close_old_connections()
    threading.Thread(target=work, name="slack-after", daemon=True).start()


def respond(approval_id: int | None, url: str, text: str) -> None:
    """The ephemeral reply through ``response_url``: only to Slack's hooks host, or to the
    host of the request's own connection (a stub in the tests)."""
    host = urlsplit(url).hostname or ""
    allowed = host in SLACK_RESPONSE_HOSTS and url.startswith("https://")
    conn = None
    if not allowed and approval_id is not None:
        approval = ApprovalRequest.objects.filter(pk=approval_id).first()
        conn = connection_for(approval) if approval is not None else None
        if conn is not None and conn.base_url:
            try:
                vet_base_url(conn)
            except Exception:
                return
            allowed = urlsplit(conn.base_url).hostname == host
    if not allowed:
        return
    data = json.dumps({"response_type": "ephemeral", "replace_original": False, "text": text})
    # Through the egress guard, bounded as a whole (a host trickling its answer a byte at a
    # time kept a sweep or a click's thread for as long as it liked: urllib's timeout bounds
    # each read only), never following a redirect.
    deadline = CallDeadline(RESPOND_SECONDS)
    try:
        with egress_client(allow=conn.allow if conn is not None else Allowlist(),
                           timeout=RESPOND_SECONDS, deadline=deadline) as http:  # fmt: skip
            request = http.build_request("POST", url, content=data.encode(),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
            answer = http.send(request, follow_redirects=False, stream=True)
            # Its body says nothing we keep: closed unread, none of it is received.
            answer.close()
    finally:
        deadline.close()
    if not answer.is_success:  # a 3xx is refused too: the reply goes only where it was vetted
        raise SlackReplyRefused(f"the response_url answered {answer.status_code}")


class SlackReplyRefused(Exception):
    """The reply's endpoint did not take it (its status says why)."""
