"""The effects admin in a real browser: resolving an effect in review from its page (a bad
result first, then a good one), and a connection's write-only secret."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from effects.models import Connection, Effect
from effects.secrets import decrypt
from workflows.models import Organisation, Run, RunEvent
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from ..factories import IO_DEFINITION, OrganisationFactory
from .conftest import logged_in_page, make_user

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-browser-Pl41nT3xt-0099"
# Kept for people to look at: an effect in review as an operator sees it.
SCREENSHOT = Path(tempfile.gettempdir()) / "waymark-admin-effect-in-review.png"


def effect_in_review(org: Organisation) -> Effect:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    started = run_start(org=org, automation_slug="io", run_input={}, start_key="k")
    run = Run.objects.get(pk=started.run_id)
    return Effect.objects.create(
        org_id=org.pk, run=run, step_id="work", iteration=0, key=f"{run.pk}/work/0",
        provider="http", state="needs_review", calls=1, last_attempt_at=timezone.now(),
        last_response={"status": 504, "body": "gateway timeout"},
    )  # fmt: skip


@pytest.fixture
def superuser_page(browser: Browser, live_server) -> Page:
    make_user("root", is_superuser=True)
    return logged_in_page(browser, live_server.url, "root")


def test_marking_an_effect_done_from_its_page(superuser_page: Page) -> None:
    effect = effect_in_review(OrganisationFactory.create())
    page = superuser_page

    page.goto(f"/admin/effects/effect/{effect.pk}/change/")
    expect(page.locator("#effect-resolve")).to_contain_text("Resolve this effect")
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    page.fill("#id_done_result", "{not json")
    page.click('#effect-resolve input[type="submit"][value="Mark done with result"]')

    expect(page.locator(".errorlist")).to_contain_text("Enter a valid JSON")
    effect.refresh_from_db()
    assert effect.state == "needs_review"

    page.fill("#id_done_result", '{"id": "c_9"}')
    page.click('input[type="submit"][value="Mark done with result"]')

    expect(page.locator("ul.messagelist")).to_contain_text("marked done")
    expect(page.locator("#effect-resolve")).to_have_count(0)  # nothing left to resolve
    effect.refresh_from_db()
    assert (effect.state, effect.result, effect.resolved_by) == (
        "settled",
        {"id": "c_9"},
        "admin:root",
    )
    assert RunEvent.objects.filter(run_id=effect.run_id, kind="effect.resolved").count() == 1


def test_a_connections_secret_is_typed_once_and_never_shown(superuser_page: Page) -> None:
    org = OrganisationFactory.create()
    page = superuser_page

    page.goto("/admin/effects/connection/add/")
    page.select_option("#id_org", str(org.pk))
    page.fill("#id_name", "crm")
    page.select_option("#id_provider", "http")
    page.fill("#id_secret", SECRET)
    page.click('input[name="_continue"]')

    expect(page.locator("ul.messagelist")).to_contain_text("was added successfully")
    expect(page.locator("#id_secret")).to_have_value("")
    assert SECRET not in page.content()
    conn = Connection.objects.get(org=org, name="crm")
    assert decrypt(conn.secret_encrypted) == SECRET
    assert conn.secret_encrypted not in page.content()
