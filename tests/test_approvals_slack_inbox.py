"""Slack gets its answer at once, whatever holds the request (approvals/inbox.py).

A click is recorded (an insert that never waits on the request's row lock) and answered;
the decision follows the answer, with the rules of every decision: the first write wins, a
click racing another decision or a cancel is told who won. A click answered by a web process
that dies before deciding it is decided by the sweep. A body too large for the endpoint is a
JSON 413 and one WARNING line.

The lock is real: another connection holds the request's row FOR UPDATE (a thread of this
test) while the click is posted, and every wait is for an event (the answer, a connection
waiting on the lock, the click's row applied), never for a length of time.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection, transaction
from django.test import Client

from approvals import sweep
from approvals.models import ApprovalRequest, DecisionAttempt, SlackInteraction, SlackUser
from tests.stubs.slack import SlackStub
from workflows.models import Run
from workflows.services.control import run_act

from .processes import kill_tree, wait_for
from .test_approvals_races import endings, lock_waiters_are
from .test_approvals_setup import (
    SIGNING_SECRET,
    TEAM,
    click_decided,
    click_payload,
    last_click,
    open_request,
    person,
    slack_connection,
    slack_post,
    with_slack,
)
from .test_web_server import start_web

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("slack_signing_secret"),
]


class RowLock:
    """A request's row held FOR UPDATE by another connection (a thread), until released."""

    def __init__(self, approval_id: int) -> None:
        self.approval_id = approval_id
        self.locked = threading.Event()
        self.release = threading.Event()
        self.released = threading.Event()  # the holder's transaction has ended
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                # Idle in its transaction on purpose: not ended by the server's timeout.
                cursor.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
                cursor.execute(
                    "SELECT id FROM approvals_approvalrequest WHERE id = %s FOR UPDATE",
                    [self.approval_id],
                )
                self.locked.set()
                # Bounded only so that a failing test ends: the tests release it themselves.
                self.release.wait(timeout=90)
        finally:
            self.released.set()
            connection.close()

    def held(self) -> bool:
        return self.locked.is_set() and not self.released.is_set()


@contextmanager
def row_locked(approval_id: int) -> Iterator[RowLock]:
    lock = RowLock(approval_id)
    lock.thread.start()
    assert lock.locked.wait(timeout=30), "the request's row was never locked"
    try:
        yield lock
    finally:
        lock.release.set()
        lock.thread.join(timeout=90)


def open_in_slack(org: Any, stub: SlackStub, key: str = "k1") -> tuple[Run, ApprovalRequest]:
    slack_connection(org, stub.url)
    return open_request(org, with_slack(), key=key)


def audit() -> list[tuple[bool, str]]:
    return [(a.accepted, a.reason) for a in DecisionAttempt.objects.order_by("id")]


def replies(stub: SlackStub, count: int) -> list[str]:
    wait_for(lambda: len(stub.responses) >= count, what=f"{count} response_url repl(ies)")
    return [r["body"]["text"] for r in stub.responses]


def test_a_click_is_answered_while_the_request_is_locked_and_decided_after(
    org, slack_stub, alice
) -> None:
    run, approval = open_in_slack(org, slack_stub)
    click = click_payload(slack_stub.messages[0], response_url=slack_stub.response_url())
    before = last_click()

    with row_locked(approval.pk) as lock:
        answer = slack_post(Client(), click)
        # The answer came while the other transaction still held the request's row.
        assert lock.held(), "the click was answered only after the lock was released"
        assert (answer.status_code, answer.json()["code"]) == (200, "received")
        # The decision comes after the answer: it waits for the lock now.
        wait_for(lock_waiters_are(1), what="the click's decision to wait for the row lock")
        assert ApprovalRequest.objects.get(pk=approval.pk).status == "pending"
        # The sweep passing meanwhile leaves the click to the thread applying it (its row
        # is locked), without waiting for it.
        assert sweep.slack_clicks() == 0
        assert lock.held()

    assert click_decided(before) == {"code": "accepted", "text": "Approved by alice. Thank you."}
    assert replies(slack_stub, 1) == ["Approved by alice. Thank you."]
    wait_for(lambda: slack_stub.updates, what="the message's chat.update")
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "approved by alice")
    # Decided once: the sweep finds nothing left, and nothing is recorded twice.
    assert sweep.slack_clicks() == 0
    assert audit() == [(True, "accepted")]
    assert endings(run) == ["step.approval", "run.succeeded"]
    assert SlackInteraction.objects.get().outcome == "accepted"


def test_two_clicks_received_while_locked_the_first_write_wins(org, slack_stub, alice) -> None:
    bob = person(org, "bob")
    SlackUser.objects.create(org=org, team_id=TEAM, slack_user_id="U0BOB", user=bob)
    run, approval = open_in_slack(org, slack_stub)
    message = slack_stub.messages[0]
    url = slack_stub.response_url()

    with row_locked(approval.pk) as lock:
        approve = slack_post(Client(), click_payload(message, response_url=url))
        bobs = click_payload(message, action="waymark_reject", user="U0BOB", response_url=url)
        reject = slack_post(Client(), bobs)
        assert lock.held()
        assert [approve.json()["code"], reject.json()["code"]] == ["received", "received"]
        wait_for(lock_waiters_are(2), what="both decisions to wait for the row lock")

    wait_for(lambda: SlackInteraction.objects.filter(applied_at__isnull=True).count() == 0,
             what="both clicks to be decided")  # fmt: skip
    outcomes = sorted(SlackInteraction.objects.values_list("outcome", flat=True))
    assert outcomes == ["accepted", "already_decided"]
    approval.refresh_from_db()
    loser = SlackInteraction.objects.get(outcome="already_decided")
    assert loser.reply.startswith(f"Already {approval.status} by {approval.decided_by} at ")
    assert sorted(replies(slack_stub, 2)) == sorted(
        [f"{approval.status.capitalize()} by {approval.decided_by}. Thank you.", loser.reply]
    )
    assert sorted(audit()) == [(False, "already_decided"), (True, "accepted")]
    assert endings(run) == ["step.approval", "run.succeeded"]  # the run moved once


def test_a_click_received_before_a_cancel_is_told_the_run_was_cancelled(
    org, slack_stub, alice
) -> None:
    run, approval = open_in_slack(org, slack_stub)
    click = click_payload(slack_stub.messages[0], response_url=slack_stub.response_url())
    before = last_click()

    with row_locked(approval.pk) as lock:
        assert slack_post(Client(), click).json()["code"] == "received"
        wait_for(lock_waiters_are(1), what="the click's decision to wait for the row lock")
        run_act(org=org, run_id=run.pk, action="cancel", actor="op")  # commits first
        assert lock.held()

    text = "The run was cancelled; this request is closed."
    assert click_decided(before) == {"code": "run_cancelled", "text": text}
    assert replies(slack_stub, 1) == [text]
    approval.refresh_from_db()
    assert approval.status == "pending"  # the decision changed nothing (the sweep closes it)
    assert audit() == [(False, "run_cancelled")]
    assert Run.objects.get(pk=run.pk).status == "cancelled"


def signed_body(payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    import hashlib
    import hmac
    from urllib.parse import urlencode

    body = urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time()))
    base = b"v0:" + ts.encode() + b":" + body
    digest = hmac.new(SIGNING_SECRET.encode(), base, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": f"v0={digest}",
    }
    return body, headers


def test_a_click_whose_web_process_dies_after_the_answer_is_decided_by_the_sweep(
    org, slack_stub, alice, procs, tmp_path: Path
) -> None:
    """The real web server (runengine --web-only) answers the click while the request is
    locked; it is killed (SIGKILL) while its decision waits for the lock, so the click was
    answered and never decided by it. The sweep's pass decides it, once."""
    run, approval = open_in_slack(org, slack_stub)
    port = start_web(procs, tmp_path, WAYMARK_SLACK_SIGNING_SECRET=SIGNING_SECRET)
    body, headers = signed_body(
        click_payload(slack_stub.messages[0], response_url=slack_stub.response_url())
    )

    with row_locked(approval.pk) as lock:
        answer = httpx.post(
            f"http://127.0.0.1:{port}/slack/interactions", content=body, headers=headers,
            timeout=60,
        )  # fmt: skip
        assert lock.held(), "the click was answered only after the lock was released"
        assert (answer.status_code, answer.json()["code"]) == (200, "received")
        wait_for(lock_waiters_are(1), what="the web process's decision to wait for the lock")
        kill_tree(procs[-1])  # the engine and its web processes, at once
        assert lock.held()

    # Once the dead process's session is gone (its backend ends at its next write to the
    # closed socket), the sweep's pass decides the click; until then the row is skipped.
    wait_for(lambda: sweep.slack_clicks() == 1, what="the sweep to decide the click")
    row = SlackInteraction.objects.get()
    assert (row.outcome, row.reply) == ("accepted", "Approved by alice. Thank you.")
    assert replies(slack_stub, 1) == ["Approved by alice. Thank you."]
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "approved by alice")
    assert audit() == [(True, "accepted")]
    assert sweep.slack_clicks() == 0  # nothing left: decided once


def test_a_two_megabyte_post_is_a_json_413_and_one_warning(org, caplog) -> None:
    body = b"payload=" + b"x" * (2 * 1024 * 1024)
    with caplog.at_level(logging.INFO):
        answer = Client().post(
            "/slack/interactions", data=body, content_type="application/x-www-form-urlencoded"
        )
    assert answer.status_code == 413
    assert answer["Content-Type"] == "application/json"
    assert answer.json()["code"] == "payload_too_large"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if r.exc_info]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["Slack interaction refused (payload_too_large) from 127.0.0.1"]
    assert not DecisionAttempt.objects.exists() and not SlackInteraction.objects.exists()


def test_a_reply_owed_after_a_crash_is_sent_by_the_sweep_once(org, slack_stub, alice) -> None:
    """The decision committed, then the process died before telling the person: the row is
    applied, its reply not yet claimed. The sweep sends it, once."""
    _run, approval = open_in_slack(org, slack_stub)
    SlackInteraction.objects.create(
        org=org, approval_id=approval.pk, decision="approve", token={}, team_id=TEAM,
        slack_user_id="U0ALICE", response_url=slack_stub.response_url(),
        applied_at=approval.created_at, outcome="accepted", reply="Approved by alice. Thank you.",
    )  # fmt: skip
    with connection.cursor() as cursor:  # applied a moment ago, by the database's clock
        cursor.execute("UPDATE approvals_slackinteraction SET applied_at = now()")

    sweep.slack_clicks()
    assert replies(slack_stub, 1) == ["Approved by alice. Thank you."]
    sweep.slack_clicks()
    assert len(slack_stub.responses) == 1
    assert SlackInteraction.objects.get().replied_at is not None


def test_a_click_that_keeps_failing_is_given_up_and_the_person_told(
    org, slack_stub, alice, caplog
) -> None:
    """A click whose decision raises (here: a stored token the code cannot read) is tried
    again by each sweep pass, and given up after MAX_ATTEMPTS: marked failed, the person asked
    to decide in Waymark, the request untouched."""
    from approvals.inbox import FAILED_TEXT, MAX_ATTEMPTS

    _run, approval = open_in_slack(org, slack_stub)
    token = {"a": approval.pk, "r": approval.run_id, "s": approval.step_id, "v": "approve",
             "i": approval.iteration, "d": approval.digest, "l": "not a level"}  # fmt: skip
    SlackInteraction.objects.create(
        org=org, approval_id=approval.pk, decision="approve", token=token, team_id=TEAM,
        slack_user_id="U0ALICE", block_id=f"waymark_approval:{approval.pk}",
        response_url=slack_stub.response_url(),
    )  # fmt: skip

    for tries in range(1, MAX_ATTEMPTS):
        assert sweep.slack_clicks() == 0
        row = SlackInteraction.objects.get()
        assert (row.attempts, row.applied_at) == (tries, None)
    sweep.slack_clicks()
    row = SlackInteraction.objects.get()
    assert (row.attempts, row.outcome, row.reply) == (MAX_ATTEMPTS, "failed", FAILED_TEXT)
    assert replies(slack_stub, 1) == [FAILED_TEXT]
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "pending"
    assert audit() == []  # every try was rolled back whole
