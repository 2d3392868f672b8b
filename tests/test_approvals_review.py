"""Regression tests for the approvals review: who a Slack user may be linked to, retention of
runs with approvals, asking again after an operator's retry, decisions while the Slack post
retries, what unverified Slack requests leave behind, signatures over bytes, what the Slack
message shows, text PostgreSQL cannot store, rendered approvers, and the audit's client
address behind proxies."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client

from approvals import sweep
from approvals.models import ApprovalRequest, DecisionAttempt, SlackUser
from approvals.slack import message_blocks
from workflows.engine.retention import purge_finished_runs
from workflows.models import Membership, Run, Step
from workflows.services.control import run_act

from .effect_setup import drive, start
from .test_approvals_setup import (
    PASSWORD,
    SIGNING_SECRET,
    TEAM,
    approval_definition,
    click_payload,
    fire_deadline_and_run,
    open_request,
    pass_deadline,
    person,
    slack_click,
    slack_connection,
    task_definition,
    with_slack,
)

pytestmark = pytest.mark.django_db(transaction=True)

ADD_LINK = "/admin/approvals/slackuser/add/"


@pytest.fixture(autouse=True)
def signing_secret(settings: Any) -> None:
    settings.APPROVALS_SLACK_SIGNING_SECRET = SIGNING_SECRET


def reasons() -> list[tuple[bool, str]]:
    return [(a.accepted, a.reason) for a in DecisionAttempt.objects.order_by("id")]


def slack_admin(org: Any, username: str) -> User:
    """A member of ``org`` who may manage Slack links, but not decide."""
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    Membership.objects.create(user=user, org=org)
    user.user_permissions.add(
        *Permission.objects.filter(
            codename__in=["add_slackuser", "view_slackuser", "change_slackuser"]
        )
    )
    return user


def signed(body: bytes, *, secret: str = SIGNING_SECRET) -> dict[str, str]:
    ts = str(int(time.time()))
    base = b"v0:" + ts.encode() + b":" + body
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"HTTP_X_SLACK_REQUEST_TIMESTAMP": ts, "HTTP_X_SLACK_SIGNATURE": f"v0={digest}"}


def post_raw(client: Client, body: bytes, **headers: str) -> Any:
    return client.post(
        "/slack/interactions",
        data=body,
        content_type="application/x-www-form-urlencoded",
        **headers,  # type: ignore[arg-type]
    )


# --- 1. Slack links ---------------------------------------------------------------------------


def test_a_staff_user_may_link_only_their_own_user(org, other_org, slack_stub) -> None:
    alice = person(org, "alice")  # may decide
    person(other_org, "olga")
    mallory = slack_admin(org, "mallory")
    browser = Client()
    browser.force_login(mallory)

    form = browser.get(ADD_LINK).content.decode()
    assert 'name="user"' not in form and "olga" not in form and "alice" not in form
    assert 'name="created_at' not in form  # set by the database, not asked for
    # Whatever user is posted, the link is mallory's own.
    created = browser.post(
        ADD_LINK, {"org": org.pk, "team_id": TEAM, "slack_user_id": "U0MALLORY", "user": alice.pk}
    )
    assert created.status_code == 302, created.content[:2000]
    link = SlackUser.objects.get(slack_user_id="U0MALLORY")
    assert link.user == mallory
    # Not in another organisation.
    other = browser.post(
        ADD_LINK, {"org": other_org.pk, "team_id": TEAM, "slack_user_id": "U0M2", "user": alice.pk}
    )
    assert other.status_code == 200 and not SlackUser.objects.filter(slack_user_id="U0M2").exists()

    # Someone else's link cannot be rewritten to mallory's Slack id either.
    theirs = SlackUser.objects.create(org=org, team_id=TEAM, slack_user_id="U0ALICE", user=alice)
    url = f"/admin/approvals/slackuser/{theirs.pk}/change/"
    changed = browser.post(url, {"org": org.pk, "team_id": TEAM, "slack_user_id": "U0EVIL"})
    assert changed.status_code == 403
    theirs.refresh_from_db()
    assert (theirs.slack_user_id, theirs.user) == ("U0ALICE", alice)

    # So mallory's clicks are mallory's: she may not decide.
    slack_connection(org, slack_stub.url)
    _run, approval = open_request(org, with_slack())
    answer = slack_click(Client(), click_payload(slack_stub.messages[0], user="U0MALLORY"))
    assert answer["code"] == "not_permitted"
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_a_superuser_may_link_only_members_of_the_organisation(org, other_org) -> None:
    alice = person(org, "alice")
    olga = person(other_org, "olga")
    root = User.objects.create_superuser("root", password=PASSWORD)
    browser = Client()
    browser.force_login(root)

    refused = browser.post(
        ADD_LINK, {"org": org.pk, "team_id": TEAM, "slack_user_id": "U0OLGA", "user": olga.pk}
    )
    assert refused.status_code == 200
    assert "not a member of the chosen organisation" in refused.content.decode()
    assert not SlackUser.objects.exists()
    linked = browser.post(
        ADD_LINK, {"org": org.pk, "team_id": TEAM, "slack_user_id": "U0ALICE", "user": alice.pk}
    )
    assert linked.status_code == 302
    assert SlackUser.objects.get().user == alice


def test_a_click_as_a_linked_user_who_is_not_a_member_is_refused(org, slack_stub) -> None:
    """A link made some other way (before this check, the shell) to a superuser who is not a
    member of the request's organisation is not honoured."""
    root = User.objects.create_superuser("root", password=PASSWORD)
    SlackUser.objects.create(org=org, team_id=TEAM, slack_user_id="U0ROOT", user=root)
    slack_connection(org, slack_stub.url)
    _run, approval = open_request(org, with_slack(approvers=["*"]))

    answer = slack_click(Client(), click_payload(slack_stub.messages[0], user="U0ROOT"))

    assert answer["code"] == "other_organisation"
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert reasons() == [(False, "other_organisation")]


# --- 2. retention -----------------------------------------------------------------------------


def test_a_finished_run_with_a_decided_approval_is_purged_with_it(org, api) -> None:
    run, approval = open_request(org)
    assert api.post(
        f"/api/v1/approvals/{approval.pk}/decide", {"decision": "reject"}, format="json"
    ).json()["accepted"]
    late = api.post(
        f"/api/v1/approvals/{approval.pk}/decide", {"decision": "approve"}, format="json"
    )
    assert late.json()["code"] == "already_decided"
    run.refresh_from_db()
    assert run.status == "succeeded"
    # An attempt tied to no approval (the API, another organisation's id) is not the run's.
    api.post("/api/v1/approvals/999999/decide", {"decision": "approve"}, format="json")
    live_run, live = open_request(org, key="k2")  # still pending: not purged
    assert DecisionAttempt.objects.filter(approval=approval).count() == 2
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workflows_run SET finished_at = now() - interval '1 hour' WHERE id = %s",
            [run.pk],
        )

    assert purge_finished_runs(older_than_seconds=60) == 1

    assert not Run.objects.filter(pk=run.pk).exists()
    assert not ApprovalRequest.objects.filter(pk=approval.pk).exists()
    assert not DecisionAttempt.objects.filter(approval_id=approval.pk).exists()
    assert DecisionAttempt.objects.filter(approval=None, reason="not_found").count() == 1
    assert ApprovalRequest.objects.filter(pk=live.pk, status="pending").exists()
    assert Run.objects.filter(pk=live_run.pk).exists()
    assert purge_finished_runs(older_than_seconds=60) == 0


# --- 3. an operator's retry asks again -----------------------------------------------------------


def test_retrying_a_run_failed_by_an_approval_timeout_asks_again(org, api) -> None:
    run, first = open_request(org, approval_definition(on_timeout="fail"))
    pass_deadline(first)
    fire_deadline_and_run()
    run.refresh_from_db()
    assert run.status == "failed" and "got no decision before its deadline" in run.error

    run_act(org=org, run_id=run.pk, action="retry", actor="operator")
    drive(lane="human")

    run.refresh_from_db()
    assert run.status == "running"
    first.refresh_from_db()
    assert first.status == "expired"  # the first request keeps its end
    second = ApprovalRequest.objects.get(run=run, status="pending")
    assert second.pk != first.pk and second.series > first.series
    assert second.expires_at > first.expires_at
    assert Step.objects.get(pk=second.step_row_id).status == "waiting"
    old = api.post(f"/api/v1/approvals/{first.pk}/decide", {"decision": "approve"}, format="json")
    assert old.json()["code"] == "expired"
    new = api.post(f"/api/v1/approvals/{second.pk}/decide", {"decision": "approve"}, format="json")
    assert new.json()["accepted"] is True
    run.refresh_from_db()
    assert run.status == "succeeded" and str(run.output).startswith("approved by api_key:")


def test_retrying_a_run_failed_by_a_slack_outage_posts_again(org, slack_stub) -> None:
    alice = person(org, "alice")
    SlackUser.objects.create(org=org, team_id=TEAM, slack_user_id="U0ALICE", user=alice)
    slack_connection(org, slack_stub.url)
    slack_stub.fail_next(1, status=400)  # Slack refuses: the step fails for good
    run_id = start(
        org, with_slack(), key="k", slug="refunds", run_input={"amount": 1, "customer": "c"}
    )
    for _ in range(30):
        drive(lane="human")
        if Run.objects.get(pk=run_id).status != "running":
            break
    assert Run.objects.get(pk=run_id).status == "failed"
    sweep.close_orphans()
    first = ApprovalRequest.objects.get(run_id=run_id)
    assert first.status == "cancelled"
    slack_stub.clear()

    run_act(org=org, run_id=run_id, action="retry", actor="operator")
    drive(lane="human")

    after = Run.objects.get(pk=run_id)
    assert after.status == "running", after.error
    second = ApprovalRequest.objects.get(run_id=run_id, status="pending")
    (message,) = slack_stub.messages
    key = message["metadata"]["event_payload"]["effect_key"]
    assert key.startswith(f"{run_id}/ask/1/series-{second.series}")
    answer = slack_click(Client(), click_payload(message))
    assert answer["text"] == "Approved by alice. Thank you."
    assert Run.objects.get(pk=run_id).output == "approved by alice"


# --- 4. a decision while the Slack post is retrying ----------------------------------------------


def test_a_decision_while_the_slack_post_retries_is_applied(org, api, slack_stub) -> None:
    slack_connection(org, slack_stub.url)
    slack_stub.fail_next(5, status=500)
    run_id = start(
        org, with_slack(), key="k", slug="refunds", run_input={"amount": 1, "customer": "c"}
    )
    drive(lane="human", fast_forward=False)
    approval = ApprovalRequest.objects.get(run_id=run_id)
    step = Step.objects.get(pk=approval.step_row_id)
    assert (step.status, step.wait_kind) == ("waiting", "retry")

    answer = api.post(
        f"/api/v1/approvals/{approval.pk}/decide", {"decision": "approve"}, format="json"
    )

    assert answer.status_code == 200, answer.json()
    approval.refresh_from_db()
    assert (approval.status, approval.wake_owed) == ("approved", True)
    sweep.wake_decided()  # still waiting out the backoff: the decision stays owed
    assert ApprovalRequest.objects.get(pk=approval.pk).wake_owed
    drive(lane="human")  # the retry runs: the executor takes the decision
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded" and str(run.output).startswith("approved by api_key:")
    sweep.wake_decided()
    assert not ApprovalRequest.objects.get(pk=approval.pk).wake_owed
    assert reasons() == [(True, "accepted")]


# --- 5 and 6. unverified Slack requests -------------------------------------------------------


def test_unverified_interactions_leave_a_log_line_not_an_audit_row(org, caplog) -> None:
    client = Client()
    with caplog.at_level(logging.WARNING, logger="approvals.slack"):
        for _ in range(50):
            answer = post_raw(
                client,
                b"payload=secret-stuff",
                HTTP_X_SLACK_REQUEST_TIMESTAMP="1",
                HTTP_X_SLACK_SIGNATURE="v0=00",
            )
            assert answer.json()["code"] == "bad_signature"
    assert not DecisionAttempt.objects.exists()
    lines = [r.getMessage() for r in caplog.records if r.name == "approvals.slack"]
    assert lines == ["Slack interaction refused (bad_signature) from 127.0.0.1"] * 50
    assert not any("secret-stuff" in r.getMessage() for r in caplog.records)


def test_non_ascii_signatures_and_bodies_that_are_not_utf8_are_refused(org) -> None:
    client = Client(raise_request_exception=False)
    accented = post_raw(
        client,
        b"payload=x",
        HTTP_X_SLACK_REQUEST_TIMESTAMP=str(int(time.time())),
        HTTP_X_SLACK_SIGNATURE="v0=\u00e9",
    )
    assert (accented.status_code, accented.json()["code"]) == (401, "bad_signature")
    not_utf8 = post_raw(
        client,
        b"payload=\xff\xfe",
        HTTP_X_SLACK_REQUEST_TIMESTAMP="1",
        HTTP_X_SLACK_SIGNATURE="v0=00",
    )
    assert (not_utf8.status_code, not_utf8.json()["code"]) == (401, "bad_signature")
    odd_digits = post_raw(  # "²".isdigit() is true, int("²") raises
        client, b"payload=x", HTTP_X_SLACK_REQUEST_TIMESTAMP="\u00b2", HTTP_X_SLACK_SIGNATURE="v0=0"
    )
    assert (odd_digits.status_code, odd_digits.json()["code"]) == (401, "bad_signature")
    assert not DecisionAttempt.objects.exists()
    # Signed, but not UTF-8: Slack never sends one (its form is URL-encoded, ASCII), and
    # slack-sdk verifies text only: refused as unverified (a log line, no audit row).
    body = b"payload=\xff\xfe"
    garbled = post_raw(client, body, **signed(body))
    assert (garbled.status_code, garbled.json()["code"]) == (401, "bad_signature")
    assert not DecisionAttempt.objects.exists()


# --- 7. what the Slack message shows ------------------------------------------------------------


def test_a_message_cut_short_says_so_and_has_no_buttons(org, settings) -> None:
    settings.APPROVALS_PUBLIC_URL = "https://waymark.example.com/"
    definition = approval_definition(
        content={"note": "{{ input.note }}", "pay_to": "{{ input.iban }}"}
    )
    run_id = start(
        org,
        definition,
        key="t",
        slug="refunds",
        run_input={"note": "x" * 3000, "iban": "ATTACKER-IBAN", "amount": 1, "customer": "c"},
    )
    drive(lane="human")
    approval = ApprovalRequest.objects.get(run_id=run_id)

    _text, blocks = message_blocks(approval)

    shown = json.dumps(blocks, ensure_ascii=False)
    assert "ATTACKER-IBAN" not in shown
    assert not any(block["type"] == "actions" for block in blocks)
    review = f"https://waymark.example.com/admin/approvals/approvalrequest/{approval.pk}/review/"
    assert f"(truncated — review it in Waymark: <{review}|approval {approval.pk}>)" in shown
    assert all(len(b.get("text", {}).get("text", "")) <= 3000 for b in blocks)
    # A short one keeps its buttons.
    _run, short = open_request(org, key="k2")
    assert any(block["type"] == "actions" for block in message_blocks(short)[1])


def test_run_data_cannot_mention_or_link_in_slack(org) -> None:
    definition = approval_definition(
        message="Refund {{ input.customer }}?", content="{{ input.customer }}"
    )
    run_id = start(
        org,
        definition,
        key="m",
        slug="refunds",
        run_input={"amount": 1, "customer": "<!channel> & <https://evil.example|Maya>"},
    )
    drive(lane="human")
    approval = ApprovalRequest.objects.get(run_id=run_id)

    text, blocks = message_blocks(approval)

    escaped = "&lt;!channel&gt; &amp; &lt;https://evil.example|Maya&gt;"
    assert text == f"Approval requested: Refund {escaped}?"
    shown = json.dumps(blocks)
    assert escaped in shown and "<!channel>" not in shown and "<https:" not in shown


# --- 8. text PostgreSQL cannot store -----------------------------------------------------------


def test_a_task_answer_with_a_lone_surrogate_is_refused_and_recorded(org, api) -> None:
    start(org, task_definition(), key="t", slug="tasks", run_input={"amount": 7})
    drive(lane="human")
    task = ApprovalRequest.objects.get()
    url = f"/api/v1/tasks/{task.pk}/submit"

    surrogate = api.post(url, '{"answer": {"invoice": "\\ud800"}}', content_type="application/json")
    nul_key = api.post(url, '{"answer": {"a\\u0000b": "x"}}', content_type="application/json")

    assert (surrogate.status_code, surrogate.json()["code"]) == (400, "invalid_answer")
    assert surrogate.json()["errors"] == {
        "invoice": "contains a NUL character or an unpaired surrogate, which cannot be stored"
    }
    assert (nul_key.status_code, nul_key.json()["code"]) == (400, "invalid_answer")
    task.refresh_from_db()
    assert task.status == "pending"
    assert reasons() == [(False, "invalid_answer"), (False, "invalid_answer")]


def test_an_admin_comment_with_nul_is_refused_and_recorded(org) -> None:
    _run, approval = open_request(org)
    browser = Client(raise_request_exception=False)
    browser.force_login(person(org, "alice"))
    url = f"/admin/approvals/approvalrequest/{approval.pk}/review/"

    answer = browser.post(
        url, {"decision": "approve", "comment": "ok\x00", "digest": approval.digest}, follow=True
    )

    assert answer.status_code == 200
    assert "Refused: The comment contains a NUL character" in answer.content.decode()
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert reasons() == [(False, "invalid_comment")]


# --- 9. rendered approvers -----------------------------------------------------------------------


@pytest.mark.parametrize("rendered", ["*", "group:*", "user:a b", "a:b:c", "x" * 300])
def test_a_rendered_approver_is_checked_like_a_literal_one(org, rendered) -> None:
    definition = approval_definition(approvers=["{{ input.approver }}"])
    run_id = start(
        org,
        definition,
        key="s",
        slug="refunds",
        run_input={"approver": rendered, "amount": 1, "customer": "c"},
    )
    drive(lane="human")

    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and "approvers.0 rendered" in run.error
    assert not ApprovalRequest.objects.exists()


def test_a_rendered_approver_that_is_valid_is_used(org) -> None:
    definition = approval_definition(approvers=["user:{{ input.approver }}", "*"])
    run_id = start(
        org,
        definition,
        key="s",
        slug="refunds",
        run_input={"approver": "alice@example.com", "amount": 1, "customer": "c"},
    )
    drive(lane="human")
    assert ApprovalRequest.objects.get(run_id=run_id).approvers == ["user:alice@example.com", "*"]


# --- 10. the audit's client address --------------------------------------------------------


def test_the_audit_reads_the_client_address_as_the_api_throttles(org, api, settings) -> None:
    _run, approval = open_request(org)
    url = f"/api/v1/approvals/{approval.pk}/decide"
    stale = {"decision": "approve", "digest": "0" * 64}
    api.post(url, stale, format="json", HTTP_X_FORWARDED_FOR="198.51.100.9")
    # Behind one trusted proxy (WAYMARK_NUM_PROXIES=1): the address it saw.
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    api.post(url, stale, format="json", HTTP_X_FORWARDED_FOR="198.51.100.9, 203.0.113.7")
    browser = Client(HTTP_X_FORWARDED_FOR="203.0.113.8")
    browser.force_login(person(org, "alice"))
    browser.post(
        f"/admin/approvals/approvalrequest/{approval.pk}/review/",
        {"decision": "approve", "digest": "0" * 64},
    )
    body = urlencode({"payload": json.dumps({"type": "nothing"})}).encode()
    post_raw(Client(HTTP_X_FORWARDED_FOR="203.0.113.9"), body, **signed(body))

    ips = list(DecisionAttempt.objects.order_by("id").values_list("reason", "ip"))
    assert ips == [
        ("content_changed", "127.0.0.1"),  # no trusted proxy: the header is not believed
        ("content_changed", "203.0.113.7"),
        ("content_changed", "203.0.113.8"),
        ("malformed", "203.0.113.9"),
    ]
