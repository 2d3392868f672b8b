"""A code workflow asks people and waits on the clock (docs/reference/code-workflows.md):
ctx.approval decided in Slack (a click signed as Slack signs it, at the local Slack stub) or through
the API, ctx.task answered through the API, and zoned sleeps, whose timer rows land at the
wall-clock instant their zone says across a daylight-saving change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.test import Client
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from tests.stubs.slack import SlackStub
from timers.models import Timer
from timers.recompute import recompute_pending
from timers.timing import plan
from workflows.models import Organisation
from workflows.plugins.code import Context, workflow
from workflows.plugins.testing import WorkflowTest

from .test_approvals_setup import click_payload, slack_click, slack_connection

pytestmark = pytest.mark.django_db(transaction=True)

BERLIN = ZoneInfo("Europe/Berlin")


@workflow("code-refund", version=1)
def refund(ctx: Context, request: dict[str, Any]) -> dict[str, Any]:
    slack = {"connection": "slack", "channel": "C0APPROVE"} if request.get("slack") else {}
    decided = ctx.approval(
        "ask", approvers="group:finance", message="Refund {{ input.amount }} EUR?",
        content={"amount": request["amount"]}, deadline="1d", **slack,
    )  # fmt: skip
    return {"approved": decided.approved, "outcome": decided.outcome, "by": decided.by,
            "via": decided.via, "comment": decided.comment,
            "decision": decided.decision}  # fmt: skip


@workflow("code-invoice", version=1)
def invoice(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
    form = {"fields": [{"name": "number", "type": "text", "required": True, "max_length": 20}]}
    got = ctx.task("fill", assignees=["group:finance"], message="Invoice?", form=form,
                   deadline="2d")  # fmt: skip
    return {"number": None if got.answer is None else got.answer["number"], "by": got.by,
            "timed_out": got.timed_out}  # fmt: skip


@workflow("code-zoned", version=1)
def zoned(ctx: Context, run_input: dict[str, Any]) -> str:
    days = run_input["days"]
    # The same sleep, as a text or as a timedelta of whole days.
    ctx.sleep("nap", timedelta(days=days) if run_input.get("delta") else f"{days}d",
              zone="Europe/Berlin")  # fmt: skip
    ctx.wait_until("morning", rule={"time": "09:00"}, zone="Europe/Berlin")
    return "awake"


def test_an_approval_decided_in_slack_resumes_the_code(
    org: Organisation, slack_stub: SlackStub, alice: Any, slack_signing_secret: None
) -> None:
    slack_connection(org, slack_stub.url)
    t = WorkflowTest(org=org)
    t.start("code-refund", version=1, input={"amount": 120, "slack": True})
    run = t.run_until_waiting()
    assert [(s.step_id, s.type, s.status) for s in run.waiting] == [("ask", "approval", "waiting")]
    (message,) = slack_stub.messages
    assert message["channel"] == "C0APPROVE"
    assert message["metadata"]["event_payload"]["effect_key"].startswith(f"{run.id}/ask/1")

    decided = slack_click(Client(), click_payload(message))  # alice presses Approve
    assert decided["code"] == "accepted"

    run = t.run_until_finished()
    assert (run.status, run.error) == ("succeeded", "")
    assert run.output == {"approved": True, "outcome": "approved", "by": "alice",
                          "via": "slack", "comment": "", "decision": "approved"}  # fmt: skip
    assert run.step("ask").output["decision"] == "approved"


def test_an_approval_rejected_through_the_api_resumes_the_code_with_its_comment(
    org: Organisation, api: APIClient
) -> None:
    t = WorkflowTest(org=org)
    t.start("code-refund", version=1, input={"amount": 9000})
    t.run_until_waiting()
    request = ApprovalRequest.objects.get(org=org, step_id="ask")
    answer = api.post(f"/api/v1/approvals/{request.pk}/decide",
                      {"decision": "reject", "comment": "too much"}, format="json")  # fmt: skip
    assert answer.status_code == 200, answer.json()

    run = t.run_until_finished()
    assert run.status == "succeeded"
    assert run.output["approved"] is False
    assert (run.output["outcome"], run.output["via"], run.output["comment"]) == (
        "rejected", "api", "too much",
    )  # fmt: skip
    assert run.output["decision"] == "rejected"
    assert run.output["by"].startswith("api_key:")


def test_an_approval_whose_deadline_passes_gives_back_timed_out(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("code-refund", version=1, input={"amount": 5})
    t.run_until_waiting()
    assert t.skip_time() == 1
    run = t.run_until_finished()
    assert run.output == {"approved": False, "outcome": "timed_out", "by": "deadline",
                          "via": "deadline", "comment": "", "decision": None}  # fmt: skip


def test_a_task_answered_through_the_api_gives_its_answer_back(
    org: Organisation, api: APIClient
) -> None:
    t = WorkflowTest(org=org)
    t.start("code-invoice", version=1, input={})
    run = t.run_until_waiting()
    assert [(s.step_id, s.type) for s in run.waiting] == [("fill", "task")]
    task = ApprovalRequest.objects.get(org=org, step_id="fill")
    bad = api.post(f"/api/v1/tasks/{task.pk}/submit", {"answer": {"number": 7}}, format="json")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_answer")  # still open
    good = api.post(f"/api/v1/tasks/{task.pk}/submit", {"answer": {"number": "INV-7"}},
                    format="json")  # fmt: skip
    assert good.status_code == 200, good.json()

    run = t.run_until_finished()
    assert run.output["number"] == "INV-7" and run.output["timed_out"] is False
    assert run.output["by"].startswith("api_key:")


# --- zoned sleeps -----------------------------------------------------------------------------


def days_across_one_change(start: datetime) -> int:
    """A number of days after which Berlin's wall clock has changed its offset once: the
    first day past the next daylight-saving change, and one more (so the same local time
    is not in the change's own hour)."""
    local = start.astimezone(BERLIN)
    for days in range(1, 400):
        if (local + timedelta(days=days)).utcoffset() != local.utcoffset():
            return days + 1
    raise AssertionError("Berlin changes its clocks every year")


@pytest.mark.parametrize("delta", [False, True], ids=["text", "timedelta"])
def test_a_zoned_sleep_across_a_dst_change_keeps_its_wall_clock_time(
    org: Organisation, delta: bool
) -> None:
    """``"5d"`` and ``timedelta(days=5)`` are the same sleep: calendar days in the zone (a
    timedelta counted 48 elapsed hours, an hour off across the change)."""
    days = days_across_one_change(datetime.now(UTC))
    t = WorkflowTest(org=org)
    t.start("code-zoned", version=1, input={"days": days, "delta": delta})
    run = t.run_until_waiting()
    assert [s.step_id for s in run.waiting] == ["nap"]

    nap = Timer.objects.get(run_id=run.id, step_id="nap")
    entered = nap.created_at.astimezone(BERLIN)  # the instant the step was entered
    lands = nap.due_at.astimezone(BERLIN)
    assert (nap.kind, nap.zone) == ("wait", "Europe/Berlin")
    # The same wall-clock time, `days` calendar days later in Berlin...
    assert lands.replace(tzinfo=None) == entered.replace(tzinfo=None) + timedelta(days=days)
    # ...which is an hour more or less than days of 24 hours: the change was crossed.
    shift = entered.utcoffset() - lands.utcoffset()  # type: ignore[operator]
    assert abs(shift) == timedelta(hours=1)
    assert nap.due_at - nap.created_at == timedelta(days=days) + shift
    # Computed again from what it keeps (after a tz database update), it lands the same.
    assert nap.intent == {"at": lands.replace(tzinfo=None).isoformat()}
    assert recompute_pending().moved == 0

    assert t.skip_time() == 1
    run = t.run_until_waiting()
    morning = Timer.objects.get(run_id=run.id, step_id="morning")
    at = morning.due_at.astimezone(BERLIN)
    assert (morning.kind, at.hour, at.minute, at.second) == ("wait_until", 9, 0, 0)
    assert timedelta(0) < morning.due_at - morning.created_at <= timedelta(days=1)
    t.skip_time()
    assert t.run_until_finished().output == "awake"


@pytest.mark.parametrize(
    ("entered", "days", "lands", "hours"),
    [
        # Spring: Berlin's clocks go 02:00 -> 03:00 on 2027-03-28; 10:00 stays 10:00.
        ("2027-03-27T10:00:00+01:00", 2, "2027-03-29T10:00:00+02:00", 47),
        # Autumn: 03:00 -> 02:00 on 2026-10-25.
        ("2026-10-24T10:00:00+02:00", 1, "2026-10-25T10:00:00+01:00", 25),
        # Away from a change: whole days of 24 hours.
        ("2026-12-05T10:00:00+01:00", 2, "2026-12-07T10:00:00+01:00", 48),
    ],
)
def test_a_wait_of_days_in_a_zone_lands_on_the_same_local_time(
    entered: str, days: int, lands: str, hours: int
) -> None:
    now = datetime.fromisoformat(entered).astimezone(UTC)
    step = {"id": "nap", "type": "wait", "duration": f"{days}d", "timezone": "Europe/Berlin"}
    planned = plan(step, {}, run_id=1, now=now)
    assert planned.due_at == datetime.fromisoformat(lands)
    assert planned.due_at - now == timedelta(hours=hours)
    # Without a zone, or in hours, a duration is elapsed time.
    plain = plan({**step, "timezone": "UTC"}, {}, run_id=1, now=now)
    assert plain.due_at - now == timedelta(days=days)
    in_hours = plan({**step, "duration": f"{24 * days}h"}, {}, run_id=1, now=now)
    assert in_hours.due_at - now == timedelta(days=days)


@workflow("code-nowhere", version=1)
def nowhere(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.sleep("nap", "1d", zone="Mars/Olympus")


def test_a_zone_that_is_not_one_fails_the_run_naming_the_field(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("code-nowhere", version=1, input={})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert "invalid_code_step: step 'nap': timezone must be an IANA time zone name" in run.error
    assert run.steps == []
