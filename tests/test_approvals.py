"""The approval step end to end in process: it opens a request bound to the content's digest
and parks; a decision (the API, a person) wakes it with its outcome; the deadline wakes it
ready and its executor settles the request (fallback, failure or escalation); every attempt,
accepted or refused, is in the audit."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db.models.functions import Now
from django.utils import timezone

from approvals import sweep
from approvals.models import ApprovalRequest, DecisionAttempt
from approvals.services import Actor, canonical_json, content_digest, decide
from workflows.models import Run, Step
from workflows.services.control import run_act

from .effect_setup import drive
from .test_approvals_setup import (
    approval_definition,
    fire_deadline_and_run,
    kinds,
    open_request,
    pass_deadline,
    person,
)

pytestmark = pytest.mark.django_db(transaction=True)


def attempts(approval: ApprovalRequest) -> list[tuple[str, bool, str]]:
    rows = DecisionAttempt.objects.filter(approval=approval).order_by("id")
    return [(a.via, a.accepted, a.reason) for a in rows]


def as_person(user: Any) -> Actor:
    return Actor(via="admin", name=user.get_username(), user=user, ip="127.0.0.1")


def test_the_step_opens_one_request_bound_to_its_content_and_parks(org) -> None:
    run, approval = open_request(org)

    content = {
        "message": "Refund 120 EUR to Maya?",
        "content": {"amount": "120", "customer": "Maya"},
    }
    assert approval.content == content
    assert approval.digest == content_digest(content)
    assert len(approval.digest) == 64 and canonical_json(content).startswith('{"content"')
    assert (approval.status, approval.kind, approval.approvers) == (
        "pending",
        "approval",
        ["group:finance"],
    )
    step = Step.objects.get(pk=approval.step_row_id)
    assert (step.status, step.wait_kind, step.owner, step.lease_until) == (
        "waiting",
        "external",
        None,
        None,
    )
    assert (step.wait_detail or {})["approval"] == approval.pk
    assert step.wake_at is not None and step.wake_at >= approval.expires_at
    assert drive(lane="human") == 0  # nothing claimable: it waits without a slot
    assert kinds(run)[-1] == "step.waiting"


def test_running_the_executor_again_finds_the_same_request(org) -> None:
    run, approval = open_request(org)
    Step.objects.filter(pk=approval.step_row_id).update(
        status="ready", wait_kind="", wake_at=None, lease_until=Now()
    )
    drive(lane="human")  # as after a crash before the park: the executor runs again

    assert ApprovalRequest.objects.filter(run=run).count() == 1
    assert Step.objects.get(pk=approval.step_row_id).status == "waiting"


def test_an_api_decision_wakes_the_step_and_the_run_goes_on(org, api) -> None:
    run, approval = open_request(org)

    answer = api.post(
        f"/api/v1/approvals/{approval.pk}/decide",
        {"decision": "approve", "comment": "ok"},
        format="json",
    )

    assert answer.status_code == 200, answer.json()
    assert answer.json()["approval"]["status"] == "approved"
    run.refresh_from_db()
    by = answer.json()["approval"]["decided_by"]
    assert by.startswith("api_key:")
    assert (run.status, run.output) == ("succeeded", f"approved by {by}")
    assert "step.approval" in kinds(run)
    assert attempts(approval) == [("api", True, "accepted")]


def test_a_decision_with_a_field_it_does_not_take_is_refused_and_decides_nothing(org, api) -> None:
    """A misspelt comment ("commnet") is named, not dropped; the approval stays open."""
    _, approval = open_request(org)
    answer = api.post(
        f"/api/v1/approvals/{approval.pk}/decide",
        {"decision": "approve", "commnet": "ok", "by": "x"},
        format="json",
    )
    assert answer.status_code == 400, answer.json()
    assert answer.json()["code"] == "invalid_input"
    assert sorted(answer.json()["errors"]) == ["by", "commnet"]
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_the_second_decision_is_told_the_first_one_won(org, api) -> None:
    run, approval = open_request(org)
    first = api.post(
        f"/api/v1/approvals/{approval.pk}/decide", {"decision": "reject"}, format="json"
    )
    second = api.post(
        f"/api/v1/approvals/{approval.pk}/decide", {"decision": "approve"}, format="json"
    )

    assert first.status_code == 200
    assert second.status_code == 409
    body = second.json()
    assert (body["code"], body["decided"]) == ("already_decided", "rejected")
    assert "Already rejected by api_key:" in body["detail"]
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "rejected")
    assert kinds(run).count("step.approval") == 1
    assert attempts(approval) == [("api", True, "accepted"), ("api", False, "already_decided")]


def test_a_person_may_decide_only_while_permitted_and_named(org, other_org) -> None:
    run, approval = open_request(org)
    outsider = person(other_org, "olga")  # in the group, with the permission, another org
    stranger = person(org, "sam", group="sales")  # not among the approvers
    unpermitted = person(org, "uma", may_decide=False)  # approver without the permission
    alice = person(org, "alice")

    refused = [
        decide(approval.pk, decision="approve", actor=as_person(u))
        for u in (outsider, stranger, unpermitted)
    ]
    assert [(o.accepted, o.code) for o in refused] == [
        (False, "not_found"),
        (False, "not_an_approver"),
        (False, "not_permitted"),
    ]
    approval.refresh_from_db()
    assert approval.status == "pending"

    # Permission is read at the moment of the decision: alice loses her group, then regains it.
    alice.groups.clear()
    assert decide(approval.pk, decision="approve", actor=as_person(alice)).code == (
        "not_an_approver"
    )
    alice.groups.add(Group.objects.get(name="finance"))
    ok = decide(approval.pk, decision="approve", actor=as_person(alice), comment="fine")
    assert (ok.accepted, ok.message) == (True, "Approved by alice.")
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "approved by alice")
    assert [r for _, _, r in attempts(approval)] == [
        "not_an_approver",
        "not_permitted",
        "not_an_approver",
        "accepted",
    ]
    # The outsider's attempt is recorded too, under their side: nothing of the request shown.
    assert DecisionAttempt.objects.filter(actor="olga", approval=None, reason="not_found").exists()


def test_a_decision_after_the_deadline_is_refused_and_the_fallback_is_taken(org, api) -> None:
    run, approval = open_request(org)
    pass_deadline(approval)

    late = api.post(
        f"/api/v1/approvals/{approval.pk}/decide", {"decision": "approve"}, format="json"
    )
    assert (late.status_code, late.json()["code"]) == (409, "expired")
    assert fire_deadline_and_run() == 1

    approval.refresh_from_db()
    run.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("expired", "deadline")
    assert (run.status, run.output) == ("succeeded", "late")  # on_timeout: timed_out
    step = Step.objects.get(pk=approval.step_row_id)
    assert (step.output or {})["timed_out"] is True
    again = api.post(
        f"/api/v1/approvals/{approval.pk}/decide", {"decision": "approve"}, format="json"
    )
    assert again.json()["code"] == "expired"
    assert attempts(approval) == [("api", False, "expired"), ("api", False, "expired")]


@pytest.mark.parametrize(
    ("on_timeout", "output"), [("reject", "rejected"), ("approve", "approved by deadline")]
)
def test_the_deadline_falls_back_to_a_default_decision(org, on_timeout: str, output: str) -> None:
    run, approval = open_request(org, approval_definition(on_timeout=on_timeout))
    pass_deadline(approval)
    fire_deadline_and_run()
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", output)


def test_on_timeout_fail_stops_the_run_where_the_admin_shows_it(org) -> None:
    run, approval = open_request(org, approval_definition(on_timeout="fail"))
    pass_deadline(approval)
    fire_deadline_and_run()
    run.refresh_from_db()
    assert run.status == "failed"
    assert "got no decision before its deadline" in run.error


def test_escalation_hands_the_request_to_other_approvers_with_a_new_deadline(org) -> None:
    definition = approval_definition(
        on_timeout="escalate", escalate_to=["user:boss"], escalate_deadline="4h"
    )
    run, approval = open_request(org, definition)
    alice, boss = person(org, "alice"), person(org, "boss", group=None)
    pass_deadline(approval)
    fire_deadline_and_run()

    approval.refresh_from_db()
    assert (approval.status, approval.level, approval.approvers) == ("pending", 1, ["user:boss"])
    assert timedelta(hours=3) < approval.expires_at - timezone.now() <= timedelta(hours=4)
    step = Step.objects.get(pk=approval.step_row_id)
    assert (step.status, (step.wait_detail or {})["level"]) == ("waiting", 1)
    assert decide(approval.pk, decision="approve", actor=as_person(alice)).code == (
        "not_an_approver"
    )
    assert decide(approval.pk, decision="reject", actor=as_person(boss)).accepted
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "rejected")

    # With no decision after the escalation either: timed_out.
    run2, approval2 = open_request(org, definition, key="k2")
    for _ in range(2):
        pass_deadline(approval2)
        fire_deadline_and_run()
        approval2.refresh_from_db()
    run2.refresh_from_db()
    assert (approval2.status, approval2.level, run2.output) == ("expired", 1, "late")


def test_a_cancelled_run_refuses_decisions_and_its_request_is_closed(org, api) -> None:
    run, approval = open_request(org)
    run_act(org=org, run_id=run.pk, action="cancel", actor="test")

    answer = api.post(
        f"/api/v1/approvals/{approval.pk}/decide", {"decision": "approve"}, format="json"
    )
    assert (answer.status_code, answer.json()["code"]) == (409, "run_cancelled")
    sweep.wake_decided()
    approval.refresh_from_db()
    assert approval.status == "cancelled"
    assert Run.objects.get(pk=run.pk).status == "cancelled"


def test_content_the_person_did_not_see_is_not_decided(org, api) -> None:
    _run, approval = open_request(org)
    answer = api.post(
        f"/api/v1/approvals/{approval.pk}/decide",
        {"decision": "approve", "digest": "0" * 64},
        format="json",
    )
    assert (answer.status_code, answer.json()["code"]) == (409, "content_changed")
    ok = api.post(
        f"/api/v1/approvals/{approval.pk}/decide",
        {"decision": "approve", "digest": approval.digest},
        format="json",
    )
    assert ok.status_code == 200


def test_bad_input_is_refused_and_changes_nothing(org, api, other_api) -> None:
    _run, approval = open_request(org)
    url = f"/api/v1/approvals/{approval.pk}/decide"

    long = api.post(url, {"decision": "approve", "comment": "x" * 1001}, format="json")
    assert (long.status_code, long.json()["code"]) == (400, "comment_too_long")
    odd = api.post(url, {"decision": "maybe"}, format="json")
    assert odd.status_code == 400
    extra = api.post(url, {"decision": "approve", "by": "ceo"}, format="json")
    assert extra.status_code == 400
    foreign = other_api.post(url, {"decision": "approve"}, format="json")
    assert (foreign.status_code, foreign.json()["code"]) == (404, "not_found")
    assert other_api.get(f"/api/v1/approvals/{approval.pk}").status_code == 404
    assert other_api.get("/api/v1/approvals?status=pending").json()["results"] == []

    approval.refresh_from_db()
    assert approval.status == "pending"
    assert Step.objects.get(pk=approval.step_row_id).status == "waiting"
    assert attempts(approval) == [("api", False, "comment_too_long")]


def test_pending_approvals_are_listed_for_the_key(org, api) -> None:
    _, approval = open_request(org)
    listed = api.get("/api/v1/approvals?status=pending").json()["results"]
    assert [(a["id"], a["status"], a["digest"]) for a in listed] == [
        (approval.pk, "pending", approval.digest)
    ]
    assert api.get("/api/v1/approvals?status=approved").json()["results"] == []
    assert api.get("/api/v1/approvals?status=nonsense").status_code == 400
