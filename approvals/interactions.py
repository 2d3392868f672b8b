"""``POST /slack/interactions``: a button pressed on an approval's Slack message.

Checked in the order approvals/slack.py describes (size, signature, timestamp window, payload,
action, token) without reading the request's row; a click that passes is recorded in the
inbox of received clicks and answered at once, and decided after the answer
(approvals/inbox.py). Its own module so that the inbox, which updates the messages through
approvals/slack.py, and the view, which hands clicks to the inbox, import no cycle.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from slack_sdk.signature import SignatureVerifier

from . import inbox
from .services import Actor, client_ip, record_attempt
from .slack import BadToken, read_token, signing_secret

# The refusals' log lines keep the logger they had when this view lived in approvals/slack.py:
# operators filter on it.
logger = logging.getLogger("approvals.slack")

TIMESTAMP_WINDOW = 5 * 60  # Slack's own rule for replays
TIMESTAMP = re.compile(r"[0-9]{1,12}")
ACTIONS = {"waymark_approve": "approve", "waymark_reject": "reject"}


def _refuse(status: int, code: str, text: str) -> HttpResponse:
    """An answer Slack shows the person who clicked: an ephemeral message, never replacing
    the request's message (everyone else keeps seeing it as it is)."""
    body = {"response_type": "ephemeral", "replace_original": False, "text": text, "code": code}
    return JsonResponse(body, status=status)


def signature_verifies(secret: str, timestamp: str, body: bytes, signature: str) -> bool:
    """Slack's v0 signature, as slack-sdk's SignatureVerifier computes it over the bytes
    received, compared in constant time. Not its ``is_valid``: that folds the timestamp's
    window into the same False, and the view refuses the two apart (``bad_signature`` first,
    then ``stale_request``, only for a request known to come from Slack). A header that is
    not ASCII cannot be a signature; a body that is not UTF-8 cannot be verified (the SDK
    signs text; Slack sends a URL-encoded form, which is ASCII)."""
    if not signature.isascii():
        return False
    try:
        expected = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
    except UnicodeDecodeError:
        return False
    return expected is not None and hmac.compare_digest(expected, signature)


def _unverified(status: int, code: str, ip: str | None, text: str) -> HttpResponse:
    """A refusal before the request is known to come from Slack: anyone can send those, so
    it is one log line (no body, no header values), not an audit row."""
    logger.warning("Slack interaction refused (%s) from %s", code, ip or "an unknown address")
    answer = _refuse(status, code, text)
    # That line is the log: not django.request's second WARNING for the same 4xx.
    answer._has_been_logged = True  # type: ignore[attr-defined]  # read by log_response
    return answer


@csrf_exempt
@require_POST
def interactions(request: HttpRequest) -> HttpResponse:
    """``POST /slack/interactions``: a button pressed on a request message."""
    ip = client_ip(request)
    try:
        body = request.body
    except RequestDataTooBig:
        # Before Django's own handling (an HTML 400 and an ERROR with a traceback): anyone
        # can send these, so one WARNING line and JSON, like any unverified refusal.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return _unverified(
            413, "payload_too_large", ip, f"The request is larger than {limit} bytes."
        )
    secret = signing_secret()
    if not secret:
        return _unverified(
            503, "not_configured", ip, "Waymark has no Slack signing secret configured."
        )
    timestamp = request.headers.get("X-Slack-Request-Timestamp", "")
    signature = request.headers.get("X-Slack-Signature", "")
    if (
        not TIMESTAMP.fullmatch(timestamp)
        or not signature
        or not signature_verifies(secret, timestamp, body, signature)
    ):
        return _unverified(401, "bad_signature", ip, "The request's signature does not verify.")
    age = time.time() - int(timestamp)
    if abs(age) > TIMESTAMP_WINDOW:
        # Either way a replay or a clock that is off; say which side of now it is.
        when = "older than 5 minutes" if age > 0 else "more than 5 minutes ahead of this clock"
        return _unverified(
            401, "stale_request", ip, f"The request is {when} (a replay?); it was refused."
        )
    anonymous = Actor(via="slack", name="", ip=ip)
    payload = _payload(body)
    if payload is None:
        record_attempt(
            anonymous,
            None,
            "",
            accepted=False,
            reason="malformed",
            detail="the payload is not a block_actions interaction",
        )
        return _refuse(400, "malformed", "Waymark could not read this interaction.")
    team_id, user_id, action = payload
    actor = Actor(
        via="slack", name=f"slack:{user_id}", ip=ip, slack_team_id=team_id, slack_user_id=user_id
    )
    decision = ACTIONS.get(str(action.get("action_id")))
    if decision is None:
        record_attempt(
            actor,
            None,
            "",
            accepted=False,
            reason="unknown_action",
            detail=f"action {str(action.get('action_id'))[:100]!r}",
        )
        return _refuse(200, "unknown_action", "Waymark does not know this action.")
    try:
        token = read_token(str(action.get("value") or ""))
    except BadToken as bad:
        record_attempt(actor, None, decision, accepted=False, reason=bad.code, detail=bad.message)
        return _refuse(200, bad.code, bad.message)
    # Recorded, answered; decided after the answer (approvals/inbox.py): the decision may
    # wait on the request's row lock, and Slack waits 3 seconds at most.
    click = inbox.receive(
        token=token,
        decision=decision,
        block_id=str(action.get("block_id") or ""),
        team_id=team_id,
        slack_user_id=user_id,
        ip=ip,
        response_url=str(payload_response_url(body) or ""),
    )
    transaction.on_commit(lambda: inbox.apply_soon(click.pk))
    return JsonResponse(
        {
            "response_type": "ephemeral",
            "replace_original": False,
            "text": inbox.RECEIVED_TEXT,
            "code": "received",
        }
    )


def _payload(body: bytes) -> tuple[str, str, Mapping[str, Any]] | None:
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=True, max_num_fields=5)
        data = json.loads(form["payload"][0])
    except (UnicodeDecodeError, ValueError, KeyError, IndexError):
        return None
    if not isinstance(data, dict) or data.get("type") != "block_actions":
        return None
    team, user, actions = data.get("team"), data.get("user"), data.get("actions")
    if not isinstance(team, dict) or not isinstance(user, dict) or not isinstance(actions, list):
        return None
    team_id, user_id = team.get("id"), user.get("id")
    if not isinstance(team_id, str) or not isinstance(user_id, str) or not team_id or not user_id:
        return None
    if len(actions) != 1 or not isinstance(actions[0], dict):
        return None
    return team_id[:32], user_id[:32], actions[0]


def payload_response_url(body: bytes) -> str | None:
    try:
        data = json.loads(parse_qs(body.decode("utf-8"))["payload"][0])
    except (UnicodeDecodeError, ValueError, KeyError, IndexError):
        return None
    url = data.get("response_url") if isinstance(data, dict) else None
    return url if isinstance(url, str) else None
