"""The run page in a real browser: a run parked mid-way shows its graph with where it is, a
step's input and output; when the run moves (a signal, sent through the engine here) the
page follows without a reload, and stops following once the run has finished. The
screenshots are kept under artifacts/ for people to look at."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from workflows.models import Organisation, Run
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start
from workflows.services.signals import signal_send

from ..factories import OrganisationFactory
from .conftest import logged_in_page, make_user

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/workflows/run"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

# Greet the customer, wait for the order to be paid (or a day), thank them, or remind them.
ORDER_FLOW: dict = {
    "start": "greet",
    "steps": [
        {"id": "greet", "type": "set", "values": {"greeting": "Hello {{ input.customer }}"},
         "next": "paid"},
        {"id": "paid", "type": "wait_signal", "signal": "order.paid",
         "correlation": "{{ input.order }}", "timeout": "1d",
         "next": {"received": "thank", "timed_out": "remind"}},
        {"id": "thank", "type": "set", "values": {"thanked": True}, "next": "done"},
        {"id": "remind", "type": "set", "values": {"reminded": True}, "next": "done"},
        {"id": "done", "type": "end", "output": "{{ vars.greeting }}"},
    ],
}  # fmt: skip


def parked_run(org: Organisation) -> Run:
    automation_publish_definition(org=org, slug="orders", definition=ORDER_FLOW)
    started = run_start(org=org, automation_slug="orders", start_key="order-7",
                        run_input={"customer": "Eve", "order": "o-7"})  # fmt: skip
    return Run.objects.get(pk=started.run_id)


@pytest.fixture
def superuser_page(browser: Browser, live_server) -> Page:
    make_user("root", is_superuser=True)
    return logged_in_page(browser, live_server.url, "root")


def node(page: Page, step_id: str) -> Locator:
    return page.locator(f'#run-graph a.node[data-step="{step_id}"]')


def test_a_parked_run_shows_where_it_is_and_follows_it_without_a_reload(
    superuser_page: Page,
) -> None:
    org = OrganisationFactory.create()
    run = parked_run(org)
    page = superuser_page
    ARTIFACTS.mkdir(exist_ok=True)

    page.goto(f"{RUNS}/{run.pk}/change/")

    # The graph: where the run is (the wait, current) and the path it took to get there.
    expect(node(page, "greet")).to_have_attribute("data-state", "done")
    expect(node(page, "paid")).to_have_attribute("data-state", "waiting")
    expect(node(page, "paid")).to_have_class("node node-waiting current")
    expect(node(page, "thank")).to_have_attribute("data-state", "not-reached")
    expect(page.locator("#run-graph g.edge.taken")).to_have_count(1)  # greet -> paid
    # A step's input (as its version defines it) and its output.
    greet = page.locator("#steps tr.step-words:below(tr#step-greet)").first
    expect(greet.locator(".step-input")).to_contain_text('"greeting": "Hello {{ input.customer }}"')
    expect(greet.locator(".step-output")).to_contain_text('"greeting": "Hello Eve"')
    # What the parked step waits on, in words.
    expect(page.locator("tr#step-paid td.waiting-on")).to_contain_text(
        "signal order.paid with key o-7"
    )
    # Clicking a step of the graph goes to its row.
    node(page, "paid").click()
    expect(page).to_have_url(f"{page.url.split('#')[0].split('?')[0]}#step-paid")
    page.screenshot(path=str(ARTIFACTS / "run-page-parked.png"), full_page=True)

    page.evaluate("window.stillTheSamePage = true")
    signal_send(org=org, name="order.paid", correlation="o-7", payload={"amount": 12})

    # The page follows: the graph, the steps, the run's fields, without a reload.
    expect(node(page, "paid")).to_have_attribute("data-state", "done", timeout=20_000)
    expect(node(page, "thank")).to_have_attribute("data-state", "done")
    expect(node(page, "remind")).to_have_attribute("data-state", "not-reached")
    expect(page.locator(".field-status .readonly")).to_have_text("Succeeded")
    expect(page.locator("#run-live-note")).to_contain_text("no longer updates")
    expect(page.locator("tr#step-paid + tr.step-words .step-output")).to_contain_text(
        '"amount": 12'
    )
    assert page.evaluate("window.stillTheSamePage") is True
    page.screenshot(path=str(ARTIFACTS / "run-page-finished.png"), full_page=True)
