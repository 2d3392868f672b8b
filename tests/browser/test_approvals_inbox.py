"""The approvals inbox in a real browser: an approver finds the request in the inbox, reads
what is under review and the run's timeline, approves with a comment, and the run moves on;
someone without the permission sees the request but no buttons, and a POST they make anyway
is refused (and recorded)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, expect

from approvals.models import ApprovalRequest, DecisionAttempt
from workflows.models import Run

from ..effect_setup import drive, start
from ..factories import OrganisationFactory
from ..test_approvals_setup import PASSWORD, approval_definition, person
from .conftest import logged_in_page

pytestmark = pytest.mark.django_db(transaction=True)


def open_request() -> tuple[Run, ApprovalRequest]:
    org = OrganisationFactory.create()
    run_id = start(
        org, approval_definition(), slug="refunds", run_input={"amount": 120, "customer": "Maya"}
    )
    drive(lane="human")
    return Run.objects.get(pk=run_id), ApprovalRequest.objects.get(run_id=run_id)


def test_an_approver_decides_in_the_inbox_and_the_run_moves_on(
    browser: Browser, live_server
) -> None:
    run, approval = open_request()
    person(approval.org, "alice")
    page = logged_in_page(browser, live_server.url, "alice", PASSWORD)

    page.goto("/admin/approvals/approvalrequest/")
    expect(page.locator("#mine")).to_contain_text("Refund 120 EUR to Maya?")
    page.click(f"#mine a:has-text('approval {approval.pk}')")
    expect(page.locator("#request-message")).to_have_text("Refund 120 EUR to Maya?")
    expect(page.locator("#request-content")).to_contain_text('"customer": "Maya"')
    expect(page.locator("#timeline")).to_contain_text("step.waiting")
    page.fill("#id_comment", "within budget")
    page.click("#approve")

    expect(page.locator("ul.messagelist")).to_contain_text("Approved by alice.")
    expect(page.locator("#request-status")).to_have_text("approved")
    expect(page.locator("#approve")).to_have_count(0)
    run.refresh_from_db()
    approval.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "approved by alice")
    assert (approval.comment, approval.decided_via) == ("within budget", "admin")


def test_someone_without_permission_sees_no_buttons_and_a_post_is_refused(
    browser: Browser, live_server
) -> None:
    run, approval = open_request()
    viewer = person(approval.org, "victor", may_decide=False)
    from django.contrib.auth.models import Permission

    viewer.user_permissions.add(Permission.objects.get(codename="view_approvalrequest"))
    page = logged_in_page(browser, live_server.url, "victor", PASSWORD)

    page.goto(f"/admin/approvals/approvalrequest/{approval.pk}/review/")
    expect(page.locator("#request-message")).to_have_text("Refund 120 EUR to Maya?")
    expect(page.locator("#cannot-decide")).to_contain_text(
        "You do not have permission to decide approvals."
    )
    expect(page.locator("#approve")).to_have_count(0)
    expect(page.locator("#reject")).to_have_count(0)

    # A hand-made POST from this page (its CSRF token), as a button would have sent it.
    status: list = page.evaluate(
        """async (digest) => {
            const token = document.cookie.split('; ').find(c => c.startsWith('csrftoken='))
                .split('=')[1];
            const body = new URLSearchParams({decision: 'approve', digest: digest,
                                              csrfmiddlewaretoken: token});
            const answer = await fetch(window.location.pathname, {method: 'POST', body: body});
            return [answer.status, await answer.text()];
        }""",
        approval.digest,
    )
    # Redirected back to the page (fetch follows it), which shows the refusal.
    assert status[0] == 200
    assert "Refused: You do not have permission to decide approvals." in status[1]
    approval.refresh_from_db()
    run.refresh_from_db()
    assert (approval.status, run.status) == ("pending", "running")
    attempt = DecisionAttempt.objects.get(approval=approval)
    assert (attempt.via, attempt.actor, attempt.accepted, attempt.reason) == (
        "admin",
        "victor",
        False,
        "not_permitted",
    )
