"""What the approvals tests share (no tests here): an automation around one approval (or
task) step, people who may or may not decide, Slack requests signed the way Slack signs
them, and moving a request past its deadline (UPDATEs of the database's times, no mocks)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.test import Client

from approvals.models import ApprovalRequest, SlackInteraction
from effects.models import Connection
from workflows.engine.waits import fire_due_deadlines
from workflows.models import Membership, Organisation, Run, RunEvent

from .effect_setup import connect, drive, start
from .processes import wait_for

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TEAM = "T0STUB"  # the stub's workspace
PASSWORD = "approver-password"


def approval_definition(**fields: Any) -> dict[str, Any]:
    step: dict[str, Any] = {
        "id": "ask",
        "type": "approval",
        "approvers": ["group:finance"],
        "message": "Refund {{ input.amount }} EUR to {{ input.customer }}?",
        "content": {"amount": "{{ input.amount }}", "customer": "{{ input.customer }}"},
        "deadline": "1d",
        **fields,
        "next": {"approved": "yes", "rejected": "no", "timed_out": "late"},
    }
    return {
        "start": "ask",
        "steps": [
            step,
            {"id": "yes", "type": "end", "output": "approved by {{ steps.ask.output.by }}"},
            {"id": "no", "type": "end", "output": "rejected"},
            {"id": "late", "type": "end", "output": "late"},
        ],
    }


def task_definition(**fields: Any) -> dict[str, Any]:
    step: dict[str, Any] = {
        "id": "fill",
        "type": "task",
        "assignees": ["group:finance"],
        "message": "Enter the invoice of order {{ input.amount }}",
        "form": {
            "fields": [
                {"name": "invoice", "type": "text", "required": True, "max_length": 20},
                {"name": "amount", "type": "number", "min": 0},
                {"name": "due", "type": "date"},
                {"name": "channel", "type": "choice", "choices": ["email", "post"]},
                {"name": "scan", "type": "file_name"},
            ]
        },
        "deadline": "2d",
        **fields,
        "next": {"submitted": "done", "timed_out": "late"},
    }
    return {
        "start": "fill",
        "steps": [
            step,
            {"id": "done", "type": "end", "output": "{{ steps.fill.output.answer.invoice }}"},
            {"id": "late", "type": "end", "output": "late"},
        ],
    }


def open_request(
    org: Organisation,
    definition: dict[str, Any] | None = None,
    *,
    key: str = "k1",
    slug: str = "refunds",
) -> tuple[Run, ApprovalRequest]:
    """Start a run and run its approval step on the human lane: it parks on its request."""
    run_id = start(
        org,
        definition or approval_definition(),
        key=key,
        slug=slug,
        run_input={"amount": 120, "customer": "Maya"},
    )
    drive(lane="human")
    return Run.objects.get(pk=run_id), ApprovalRequest.objects.get(run_id=run_id)


def person(
    org: Organisation | None,
    username: str,
    *,
    group: str | None = "finance",
    may_decide: bool = True,
    staff: bool = True,
) -> User:
    user = User.objects.create_user(
        username, password=PASSWORD, is_staff=staff, email=f"{username}@example.com"
    )
    if org is not None:
        Membership.objects.create(user=user, org=org)
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    if may_decide:
        user.user_permissions.add(
            Permission.objects.get(codename="decide_approvalrequest"),
            Permission.objects.get(codename="view_approvalrequest"),
        )
    return user


def pass_deadline(approval: ApprovalRequest) -> None:
    """The request's deadline, and its step's, are a second ago (the database's clock)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE approvals_approvalrequest SET expires_at = now() - interval '1 second' "
            "WHERE id = %s",
            [approval.pk],
        )
        cursor.execute(
            "UPDATE workflows_step SET wake_at = now() - interval '1 second' "
            "WHERE id = %s AND status = 'waiting'",
            [approval.step_row_id],
        )


def fire_deadline_and_run() -> int:
    fired = fire_due_deadlines()
    drive(lane="human")
    return fired


def kinds(run: Run) -> list[str]:
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("kind", flat=True))


def slack_connection(org: Organisation, stub_url: str, *, team: str = TEAM) -> Connection:
    return connect(
        org,
        provider="slack_message",
        base_url=stub_url + "/api/",
        name="slack",
        secret="xoxb-stub",
        options={"team_id": team},
    )


def with_slack(**fields: Any) -> dict[str, Any]:
    return approval_definition(connection="slack", channel="C0APPROVE", **fields)


# --- Slack's side -------------------------------------------------------------------------------


def click_payload(
    message: dict[str, Any],
    *,
    action: str = "waymark_approve",
    user: str = "U0ALICE",
    team: str = TEAM,
    response_url: str = "",
) -> dict[str, Any]:
    """What Slack sends when ``user`` presses a button of ``message`` (as the stub keeps it)."""
    actions = next(block for block in message["blocks"] if block["type"] == "actions")
    button = next(e for e in actions["elements"] if e["action_id"] == action)
    return {
        "type": "block_actions",
        "team": {"id": team, "domain": "acme"},
        "user": {"id": user, "username": user.lower(), "team_id": team},
        "api_app_id": "A0WAYMARK",
        "container": {"type": "message", "message_ts": message["ts"], "channel_id": "C0APPROVE"},
        "channel": {"id": "C0APPROVE", "name": "approvals"},
        "response_url": response_url,
        "trigger_id": "1.2.3",
        "actions": [
            {
                "type": "button",
                "action_id": button["action_id"],
                "block_id": actions["block_id"],
                "value": button["value"],
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }


def slack_post(
    client: Client,
    payload: Any,
    *,
    secret: str = SIGNING_SECRET,
    timestamp: int | None = None,
    signature: str | None = None,
    raw: str | None = None,
) -> Any:
    """POST an interaction the way Slack does: a form-encoded ``payload`` (JSON), signed
    with v0 = HMAC-SHA256 over ``v0:{timestamp}:{body}``."""
    body = raw if raw is not None else click_body(payload)
    ts = str(int(time.time()) if timestamp is None else timestamp)
    return client.post(
        "/slack/interactions",
        data=body,
        content_type="application/x-www-form-urlencoded",
        HTTP_X_SLACK_REQUEST_TIMESTAMP=ts,
        HTTP_X_SLACK_SIGNATURE=signature or slack_signature(secret, ts, body),
    )


def click_body(payload: Any) -> str:
    """An interaction's body as Slack sends it: the payload's JSON, form-encoded."""
    return urlencode({"payload": json.dumps(payload)})


def slack_signature(secret: str, timestamp: str, body: str) -> str:
    """Slack's v0 signature of a request: HMAC-SHA256 over ``v0:{timestamp}:{body}``."""
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:{body}".encode(), hashlib.sha256)
    return f"v0={digest.hexdigest()}"


def last_click() -> int:
    """The id of the latest click received (0: none yet)."""
    return SlackInteraction.objects.order_by("-id").values_list("id", flat=True).first() or 0


def click_decided(after: int) -> dict[str, str]:
    """Wait for the first click received after ``after`` to be decided (after the answer, by
    the web process's thread): its outcome's code and the text the person is sent."""
    row = wait_for(
        lambda: (
            SlackInteraction.objects.filter(id__gt=after, applied_at__isnull=False)
            .order_by("id")
            .first()
        ),
        what="the click to be decided",
    )
    return {"code": row.outcome, "text": row.reply}


def slack_click(client: Client, payload: Any, **signed: Any) -> dict[str, str]:
    """A click that passes the checks made before the answer: answered at once
    (``received``), then decided; what the person is told."""
    after = last_click()
    answer = slack_post(client, payload, **signed)
    assert (answer.status_code, answer.json()["code"]) == (200, "received"), answer.json()
    return click_decided(after)
