"""The control room in a real browser: a staff member signs in and lands on it; it shows
their organisation's runs by status, a failed run linked to its page, the approval waiting
for them before another's, and nothing of another organisation. The screenshot is kept under
artifacts/ for people to look at."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.db.models.functions import Now
from playwright.sync_api import Browser, expect

from approvals.models import ApprovalRequest
from workflows.models import Run, Step

from ..effect_setup import drive, start
from ..factories import OrganisationFactory
from ..test_approvals_setup import PASSWORD, approval_definition, person
from .conftest import logged_in_page

pytestmark = pytest.mark.django_db(transaction=True)

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def failed_run(org, *, key: str, error: str) -> int:
    run_id = start(org, approval_definition(), slug="refunds", key=key,
                   run_input={"amount": 1, "customer": "Failing"})  # fmt: skip
    Run.objects.filter(pk=run_id).update(status="failed", error=error, finished_at=Now())
    Step.objects.filter(run_id=run_id).update(status="cancelled")
    return run_id


def test_an_operator_lands_on_the_control_room_and_finds_what_needs_them(
    browser: Browser, live_server
) -> None:
    org, other = OrganisationFactory.create(), OrganisationFactory.create()
    failed = failed_run(org, key="f1", error="the CRM answered 500")
    theirs = failed_run(other, key="t1", error="another organisation's secret")
    for_ops = approval_definition(approvers=["group:ops"], deadline="1h")
    ops_request = start(org, for_ops, slug="ops", key="o1",
                        run_input={"amount": 3, "customer": "Ops"})  # fmt: skip
    mine = start(org, approval_definition(deadline="2d"), slug="refunds", key="m1",
                 run_input={"amount": 120, "customer": "Maya"})  # fmt: skip
    drive(lane="human")
    alice = person(org, "alice")  # may decide for finance
    alice.user_permissions.add(*Permission.objects.filter(content_type__app_label="workflows"))
    mine_request = ApprovalRequest.objects.get(run_id=mine)

    page = logged_in_page(browser, live_server.url, "alice", PASSWORD)  # lands on /admin/

    runs = page.locator('.control-panel[data-panel="Runs by status"]')
    expect(runs.locator("tr", has_text="failed")).to_contain_text("1")
    expect(runs.locator("tr", has_text="running")).to_contain_text("2")
    stuck = page.locator('.control-panel[data-panel="Failed or stuck"]')
    expect(stuck).to_contain_text("the CRM answered 500")
    expect(stuck).not_to_contain_text("another organisation's secret")
    waiting = page.locator('.control-panel[data-panel^="Waiting for people"]')
    expect(waiting.locator("tr").first).to_contain_text(f"approval {mine_request.pk}")
    expect(waiting.locator("tr").first).to_contain_text("yours to decide")
    expect(waiting.locator("tr").nth(1)).to_contain_text(f"run {ops_request},")
    expect(page.locator("#control-room-links")).to_contain_text("Approvals inbox")
    expect(page.locator("#content-main .module").first).to_have_class("app-workflows module")
    expect(page.locator("#control-room")).not_to_contain_text(f"run {theirs} ")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "control-room.png"), full_page=True)

    # The failed run links to its page; the approval to its review.
    stuck.locator(f"a:has-text('run {failed} ')").click()
    expect(page).to_have_url(f"{live_server.url}/admin/workflows/run/{failed}/change/")
    page.go_back()
    waiting.locator("tr").first.locator("a").click()
    expect(page.locator("#request-message")).to_have_text("Refund 120 EUR to Maya?")
