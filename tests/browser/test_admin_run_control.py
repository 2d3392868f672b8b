"""Run control in a real browser: the list action and its confirmation, the run page's
buttons, and organisation scoping, against the live server and the real database."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from playwright.sync_api import Browser, Page, expect

from workflows.models import Membership, Organisation, Run, RunEvent
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from ..factories import IO_DEFINITION, OrganisationFactory
from .conftest import logged_in_page, make_user

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/workflows/run"
# Kept for people to look at (the run page as an operator sees it, a paused run).
SCREENSHOT = Path(tempfile.gettempdir()) / "waymark-admin-run-page.png"


def running_run(org: Organisation, key: str = "k") -> Run:
    """A run of one io step: it stays running, its step ready (no worker runs here)."""
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    started = run_start(org=org, automation_slug="io", run_input={"who": "Ada"}, start_key=key)
    return Run.objects.get(pk=started.run_id)


def status_of(run: Run) -> str:
    run.refresh_from_db()
    return run.status


@pytest.fixture
def superuser_page(browser: Browser, live_server) -> Page:
    make_user("root", is_superuser=True)
    return logged_in_page(browser, live_server.url, "root")


def test_cancelling_a_run_from_the_run_list_through_the_confirmation_page(
    superuser_page: Page,
) -> None:
    org = OrganisationFactory.create()
    run, bystander = running_run(org, "target"), running_run(org, "bystander")
    page = superuser_page

    page.goto(f"{RUNS}/")
    page.check(f'input[name="_selected_action"][value="{run.pk}"]')
    page.select_option('select[name="action"]', "cancel_runs")
    page.click('button[name="index"]')

    expect(page.locator("#applies")).to_contain_text("Cancel applies to 1 of the 1 selected run.")
    assert status_of(run) == "running"  # nothing changes before the confirmation
    page.click('input[type="submit"][value="Yes, cancel 1 run"]')

    expect(page.locator("ul.messagelist")).to_contain_text("Cancel: 1 run(s) cancelled.")
    expect(page.locator(f'tr:has(a[href="{RUNS}/{run.pk}/change/"])')).to_contain_text("Cancelled")
    assert status_of(run) == "cancelled"
    assert status_of(bystander) == "running"
    assert RunEvent.objects.get(run=run, kind="run.cancelled").worker == "admin:root"


def test_pausing_a_run_from_its_page_and_resuming_it(superuser_page: Page) -> None:
    run = running_run(OrganisationFactory.create())
    page = superuser_page

    page.goto(f"{RUNS}/{run.pk}/change/")
    expect(page.locator("#steps")).to_contain_text("ready 1")
    page.click("text=Pause run…")
    expect(page.locator("#applies")).to_contain_text("Pause applies to 1 of the 1 selected run.")
    page.click('input[type="submit"][value="Yes, pause 1 run"]')

    expect(page.locator("ul.messagelist")).to_contain_text(f"Run {run.pk} paused (now paused).")
    assert status_of(run) == "paused"
    expect(page.locator("a.run-control-pause")).to_have_count(0)
    expect(page.locator("#steps")).to_contain_text("waiting 1")  # the ready step is parked
    page.screenshot(path=SCREENSHOT, full_page=True)

    page.click("text=Resume run…")
    page.click('input[type="submit"][value="Yes, resume 1 run"]')

    expect(page.locator("ul.messagelist")).to_contain_text(f"Run {run.pk} resumed (now running).")
    assert status_of(run) == "running"
    expect(page.locator("a.run-control-pause")).to_have_count(1)
    expect(page.locator("#timeline")).to_contain_text("run.resumed")


def test_a_staff_member_of_another_organisation_does_not_see_the_run(
    browser: Browser, live_server
) -> None:
    run = running_run(OrganisationFactory.create())
    outsider = make_user("outsider")
    outsider.user_permissions.set(Permission.objects.filter(content_type__app_label="workflows"))
    Membership.objects.create(user=outsider, org=OrganisationFactory.create())
    page = logged_in_page(browser, live_server.url, "outsider")

    page.goto(f"{RUNS}/")
    expect(page.locator("#result_list, p.paginator")).not_to_have_count(0)
    expect(page.locator(f'a[href="{RUNS}/{run.pk}/change/"]')).to_have_count(0)
    response = page.goto(f"{RUNS}/{run.pk}/change/")
    assert response is not None and response.status == 404
    response = page.goto(f"{RUNS}/{run.pk}/control/cancel/")
    assert response is not None and response.status == 404
    assert status_of(run) == "running"
