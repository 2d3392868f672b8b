"""Approvals in Slack: the request posted through slack-sdk's WebClient to the Slack stub
(Block Kit, two buttons with signed tokens), clicks signed the way Slack signs them, each
refusal answered with what Slack shows the person, the message updated with chat.update
after a decision, and every attempt in the audit."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from typing import Any

import pytest
from django.core import signing
from django.db import connection
from django.test import Client

from approvals.models import ApprovalRequest, DecisionAttempt, SlackUser
from approvals.slack import TOKEN_SALT
from effects.models import Connection
from tests.stubs.slack import SlackStub
from workflows.models import Run, Step
from workflows.services.control import run_act

from .test_approvals_setup import (
    TEAM,
    click_decided,
    click_payload,
    fire_deadline_and_run,
    last_click,
    open_request,
    pass_deadline,
    person,
    slack_click,
    slack_connection,
    slack_post,
    with_slack,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("slack_signing_secret"),
]


def posted(stub: SlackStub) -> dict[str, Any]:
    (message,) = stub.messages
    return message


def wait_for(predicate: Any, what: str, timeout: float = 10.0) -> None:
    """Wait for an event that happens after the HTTP answer (a thread's chat.update)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.02)


def audit() -> list[tuple[bool, str]]:
    return [(a.accepted, a.reason) for a in DecisionAttempt.objects.order_by("id")]


def open_in_slack(org: Any, stub: SlackStub, **fields: Any) -> tuple[Run, ApprovalRequest]:
    slack_connection(org, stub.url)
    return open_request(org, with_slack(**fields))


def test_the_request_is_posted_with_buttons_and_a_click_decides(org, slack_stub, alice) -> None:
    run, approval = open_in_slack(org, slack_stub)
    message = posted(slack_stub)
    assert message["channel"] == "C0APPROVE"
    assert message["metadata"]["event_payload"]["effect_key"].startswith(f"{run.pk}/ask/1")
    texts = [b.get("text", {}).get("text", "") for b in message["blocks"]]
    assert "Refund 120 EUR to Maya?" in texts
    buttons = next(b for b in message["blocks"] if b["type"] == "actions")["elements"]
    assert [b["action_id"] for b in buttons] == ["waymark_approve", "waymark_reject"]
    approval.refresh_from_db()
    assert approval.slack_messages == [{"channel": "C0APPROVE", "ts": message["ts"], "level": 0}]

    before = last_click()
    answer = slack_post(Client(), click_payload(message, response_url=slack_stub.response_url()))

    # Answered at once; decided after the answer.
    assert (answer.status_code, answer.json()["code"]) == (200, "received")
    assert answer.json()["replace_original"] is False
    assert click_decided(before) == {"code": "accepted", "text": "Approved by alice. Thank you."}
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "approved by alice")
    # After the answer: the message shows the outcome to everyone, buttons gone.
    wait_for(lambda: slack_stub.updates, "chat.update")
    update = slack_stub.updates[0]
    assert update["ts"] == message["ts"]
    assert not any(b["type"] == "actions" for b in update["blocks"])
    assert "*Approved* by alice via slack" in str(update["blocks"])
    wait_for(lambda: slack_stub.responses, "the response_url reply")
    assert slack_stub.responses[0]["body"]["text"].startswith("Approved by alice")
    wait_for(lambda: not ApprovalRequest.objects.get(pk=approval.pk).slack_stale, "not stale")
    assert audit() == [(True, "accepted")]
    attempt = DecisionAttempt.objects.get()
    assert (attempt.via, attempt.actor, attempt.slack_user_id, attempt.slack_team_id) == (
        "slack",
        "alice",
        "U0ALICE",
        TEAM,
    )


def test_forged_stale_and_malformed_requests_are_refused(org, slack_stub, alice, caplog) -> None:
    _run, approval = open_in_slack(org, slack_stub)
    click = click_payload(posted(slack_stub))
    client = Client()

    forged = slack_post(client, click, secret="not-the-signing-secret")
    assert (forged.status_code, forged.json()["code"]) == (401, "bad_signature")
    unsigned = slack_post(client, click, signature="v0=" + "0" * 64)
    assert unsigned.status_code == 401
    replayed = slack_post(client, click, timestamp=int(time.time()) - 301)
    assert (replayed.status_code, replayed.json()["code"]) == (401, "stale_request")
    assert "older than 5 minutes" in replayed.json()["text"]
    ahead = slack_post(client, click, timestamp=int(time.time()) + 400)
    assert (ahead.status_code, ahead.json()["code"]) == (401, "stale_request")
    assert "ahead of this clock" in ahead.json()["text"]  # it said "older" of a future one
    garbage = slack_post(client, None, raw="payload=%7Bnot+json")
    assert (garbage.status_code, garbage.json()["code"]) == (400, "malformed")
    no_payload = slack_post(client, None, raw="hello=world")
    assert no_payload.status_code == 400
    wrong_type = slack_post(client, {**click, "type": "view_submission"})
    assert wrong_type.status_code == 400
    unknown = {**click, "actions": [{**click["actions"][0], "action_id": "waymark_delete"}]}
    answer = slack_post(client, unknown)
    assert (answer.status_code, answer.json()["code"]) == (200, "unknown_action")

    approval.refresh_from_db()
    assert approval.status == "pending"
    assert Step.objects.get(pk=approval.step_row_id).status == "waiting"
    # Not verified (anyone can send those): a log line each, no audit row.
    refusals = [r.getMessage() for r in caplog.records if r.name == "approvals.slack"]
    assert refusals == [
        "Slack interaction refused (bad_signature) from 127.0.0.1",
        "Slack interaction refused (bad_signature) from 127.0.0.1",
        "Slack interaction refused (stale_request) from 127.0.0.1",
        "Slack interaction refused (stale_request) from 127.0.0.1",
    ]
    assert audit() == [
        (False, "malformed"),
        (False, "malformed"),
        (False, "malformed"),
        (False, "unknown_action"),
    ]
    # Then the real click still decides.
    assert slack_click(client, click)["text"] == "Approved by alice. Thank you."


def test_a_token_for_another_step_or_workspace_is_refused(org, slack_stub, alice) -> None:
    _, first = open_in_slack(org, slack_stub)
    _, second = open_request(org, with_slack(), key="k2")
    one, two = slack_stub.messages
    swapped = click_payload(one)
    swapped["actions"][0]["value"] = click_payload(two)["actions"][0]["value"]
    client = Client()

    answer = slack_click(client, swapped)
    assert answer == {
        "code": "token_mismatch",
        "text": "This button does not belong to this request.",
    }
    wrong_button = click_payload(one)
    wrong_button["actions"][0]["value"] = click_payload(one, action="waymark_reject")["actions"][0][
        "value"
    ]
    assert slack_click(client, wrong_button)["code"] == "token_mismatch"
    tampered = click_payload(one)
    tampered["actions"][0]["value"] += "x"
    assert slack_post(client, tampered).json()["code"] == "token_invalid"
    other_team = slack_click(client, click_payload(one, team="T0OTHER"))
    assert other_team["code"] == "wrong_workspace"

    for approval in (first, second):
        approval.refresh_from_db()
        assert approval.status == "pending"
    assert audit() == [
        (False, "token_mismatch"),
        (False, "token_mismatch"),
        (False, "token_invalid"),
        (False, "wrong_workspace"),
    ]


def test_a_click_before_the_post_is_recorded_is_checked_against_the_connection(
    org, slack_stub, alice
) -> None:
    """Slack shows the message once it answered the post, a moment before the worker records
    the post (and with it the workspace) on the request: a click in that moment is checked
    against the workspace of the connection the request is posted through, not refused."""
    _, approval = open_in_slack(org, slack_stub)
    message = posted(slack_stub)
    # The request as it is between Slack's answer and the worker's record of the post.
    ApprovalRequest.objects.filter(pk=approval.pk).update(slack_team_id="", slack_messages=[])
    client = Client()

    other_team = slack_click(client, click_payload(message, team="T0OTHER"))
    assert other_team["code"] == "wrong_workspace"
    assert slack_click(client, click_payload(message))["text"] == "Approved by alice. Thank you."
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("approved", "alice")
    assert audit() == [(False, "wrong_workspace"), (True, "accepted")]


def test_permission_is_checked_when_the_button_is_pressed(org, slack_stub, alice) -> None:
    _run, approval = open_in_slack(org, slack_stub)
    click = click_payload(posted(slack_stub))
    alice.groups.clear()  # Monday morning: alice left finance after the message was sent

    lost = slack_click(Client(), click)
    assert lost["text"] == "You are not among the approvers of this request."
    stranger = slack_click(Client(), click_payload(posted(slack_stub), user="U0NOBODY"))
    assert stranger["code"] == "unknown_slack_user"
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert audit() == [(False, "not_an_approver"), (False, "unknown_slack_user")]


def test_a_second_click_is_told_who_won(org, slack_stub, alice) -> None:
    bob = person(org, "bob")
    SlackUser.objects.create(org=org, team_id=TEAM, slack_user_id="U0BOB", user=bob)
    run, _approval = open_in_slack(org, slack_stub)
    message = copy.deepcopy(posted(slack_stub))  # as people's Slack clients still show it

    first = slack_click(Client(), click_payload(message, action="waymark_reject"))
    again = slack_click(Client(), click_payload(message, action="waymark_reject"))  # double
    other = slack_click(Client(), click_payload(message, user="U0BOB"))

    assert first["text"] == "Rejected by alice. Thank you."
    for late in (again, other):
        assert late["code"] == "already_decided"
        assert late["text"].startswith("Already rejected by alice at ")
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "rejected")
    assert audit() == [(True, "accepted"), (False, "already_decided"), (False, "already_decided")]


def test_a_click_after_expiry_or_cancellation_is_refused(org, slack_stub, alice) -> None:
    _run, approval = open_in_slack(org, slack_stub)
    click = click_payload(posted(slack_stub))
    pass_deadline(approval)

    late = slack_click(Client(), click)
    assert late["code"] == "expired"
    assert late["text"].startswith("This request expired at ")
    fire_deadline_and_run()
    approval.refresh_from_db()
    assert approval.status == "expired"

    run2, _approval2 = open_request(org, with_slack(), key="k2")
    run_act(org=org, run_id=run2.pk, action="cancel", actor="test")
    cancelled = slack_click(Client(), click_payload(slack_stub.messages[-1]))
    assert cancelled == {
        "code": "run_cancelled",
        "text": "The run was cancelled; this request is closed.",
    }
    assert audit() == [(False, "expired"), (False, "run_cancelled")]


def test_an_expired_token_and_changed_content_are_refused(org, slack_stub, alice) -> None:
    _run, approval = open_in_slack(org, slack_stub)
    click = click_payload(posted(slack_stub))
    value = signing.loads(click["actions"][0]["value"], salt=TOKEN_SALT)
    stale = {**value, "e": int(time.time()) - 1}
    old = click_payload(posted(slack_stub))
    old["actions"][0]["value"] = signing.dumps(stale, salt=TOKEN_SALT, compress=True)
    assert slack_post(Client(), old).json()["code"] == "token_expired"

    # The content under review changed after the message was posted: its digest differs.
    ApprovalRequest.objects.filter(pk=approval.pk).update(digest="f" * 64)
    changed = slack_click(Client(), click)
    assert changed["code"] == "content_changed"
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert audit() == [(False, "token_expired"), (False, "content_changed")]


def test_without_a_signing_secret_nothing_is_accepted(org, slack_stub, alice, settings) -> None:
    settings.APPROVALS_SLACK_SIGNING_SECRET = ""
    _run, _approval = open_in_slack(org, slack_stub)
    answer = slack_post(Client(), click_payload(posted(slack_stub)))
    assert (answer.status_code, answer.json()["code"]) == (503, "not_configured")
    assert audit() == []  # not verified: logged, not audited


def test_an_api_decision_updates_the_slack_message_too(org, slack_stub, api) -> None:
    _run, approval = open_in_slack(org, slack_stub)
    api.post(f"/api/v1/approvals/{approval.pk}/decide", {"decision": "reject"}, format="json")
    wait_for(lambda: slack_stub.updates, "chat.update")
    assert "*Rejected* by api_key:" in str(slack_stub.updates[0]["blocks"])


def test_a_stale_message_is_brought_up_to_date_by_the_sweep(org, slack_stub, alice) -> None:
    from approvals import sweep

    _run, approval = open_in_slack(org, slack_stub)
    slack_stub.fail_next(1, 500, path_prefix="/api/chat.update")
    slack_post(Client(), click_payload(posted(slack_stub)))
    wait_for(lambda: any(r["path"] == "/api/chat.update" for r in slack_stub.requests), "a try")
    assert ApprovalRequest.objects.get(pk=approval.pk).slack_stale
    assert sweep.update_slack() == 1
    assert not ApprovalRequest.objects.get(pk=approval.pk).slack_stale
    assert "*Approved* by alice" in str(slack_stub.messages[0]["blocks"])


def test_a_reminder_is_posted_in_the_thread_once(org, slack_stub) -> None:
    from approvals import sweep

    _run, approval = open_in_slack(org, slack_stub, reminders=["4h"])
    assert approval.next_reminder_at is not None
    # Four hours before the deadline (moved, on the database's clock).
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE approvals_approvalrequest SET expires_at = now() + interval '239 minutes', "
            "next_reminder_at = now() - interval '1 minute' WHERE id = %s",
            [approval.pk],
        )
    assert sweep.send_reminders() == 1
    assert sweep.send_reminders() == 0
    reminder = slack_stub.messages[-1]
    assert reminder["thread_ts"] == slack_stub.messages[0]["ts"]
    assert reminder["text"].startswith("Reminder: this approval needs an answer by")
    assert ApprovalRequest.objects.filter(
        pk=approval.pk, reminders_sent=1, next_reminder_at__isnull=True
    ).exists()


def test_an_escalation_posts_a_new_message_and_retires_the_old_buttons(
    org, slack_stub, alice
) -> None:
    boss = person(org, "boss", group=None)
    SlackUser.objects.create(org=org, team_id=TEAM, slack_user_id="U0BOSS", user=boss)
    run, approval = open_in_slack(org, slack_stub, on_timeout="escalate", escalate_to=["user:boss"])
    old = click_payload(posted(slack_stub))
    pass_deadline(approval)
    # The old token would have expired with the old deadline; re-sign it as if still young.
    value = signing.loads(old["actions"][0]["value"], salt=TOKEN_SALT)
    old["actions"][0]["value"] = signing.dumps(
        {**value, "e": int(time.time()) + 600}, salt=TOKEN_SALT, compress=True
    )
    fire_deadline_and_run()

    assert len(slack_stub.messages) == 2
    newer = slack_stub.messages[1]
    assert f"{run.pk}/ask/1/escalation-1:" in newer["metadata"]["event_payload"]["effect_key"]
    assert slack_click(Client(), old)["code"] == "superseded"
    answer = slack_click(Client(), click_payload(newer, user="U0BOSS"))
    assert answer["text"] == "Approved by boss. Thank you."
    run.refresh_from_db()
    assert run.output == "approved by boss"


def test_a_reply_whose_url_redirects_is_not_followed(org, slack_stub) -> None:
    """The reply goes to Slack's hooks host or the connection's own host; a 3xx there must
    not take it (and what it says) to another place, which nobody vetted."""
    from approvals.slack import SlackReplyRefused, respond
    from tests.stubs.redirect import RecordingStub, RedirectingStub

    _, approval = open_in_slack(org, slack_stub)
    with RecordingStub() as elsewhere, RedirectingStub(elsewhere.url) as moved:
        Connection.objects.filter(org=org).update(base_url=moved.url + "/api/")
        with pytest.raises(SlackReplyRefused, match="answered 302"):
            respond(approval.pk, moved.url + "/hooks/reply", "Approved by alice.")
        assert moved.requests and not elsewhere.requests


def test_a_reply_to_a_host_that_trickles_its_answer_ends_at_its_bound(org, slack_stub) -> None:
    """The reply is bounded as a whole (RESPOND_SECONDS), not each read: a host sending one
    byte a second (within a per-read timeout) kept the sweep's approvals pass, or a click's
    thread, for as long as it liked."""
    from approvals.slack import respond

    from .stubs.tarpit import Tarpit

    _, approval = open_in_slack(org, slack_stub)
    with Tarpit(trickle=1.0) as tarpit:
        Connection.objects.filter(org=org).update(base_url=tarpit.url + "/api/")
        ended = threading.Event()

        def reply() -> None:
            try:
                with contextlib.suppress(Exception):
                    respond(approval.pk, tarpit.url + "/hooks/reply", "Approved by alice.")
            finally:
                connection.close()  # this thread's own
                ended.set()

        threading.Thread(target=reply, daemon=True).start()
        tarpit.wait_accepted(1, timeout=30)
        # Waited for far past the bound (5 s; a loaded machine is slow), never for ever.
        assert ended.wait(60), "the reply was still reading the trickle"


def test_a_reply_answered_with_300_mib_is_closed_unread(org, slack_stub) -> None:
    """What the response_url answers is never kept: none of a 300 MiB body is received."""
    from approvals.slack import respond

    from .memory import MIB, peak_rss
    from .stubs.flood import FloodStub

    _, approval = open_in_slack(org, slack_stub)
    with FloodStub(status=200, size=300 * MIB) as flood:
        Connection.objects.filter(org=org).update(base_url=flood.url + "/api/")
        with peak_rss() as peak:
            respond(approval.pk, flood.url + "/hooks/reply", "Approved by alice.")
        (sent,) = flood.wait_requests(1)
    assert peak.grew_mib < 50, f"the reply grew this process {peak.grew_mib:.0f} MiB"
    assert sent < 64 * MIB
