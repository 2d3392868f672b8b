"""The admin as a control room: every page renders, published versions are read-only."""

from __future__ import annotations

import json
from html import unescape
from typing import Any

import pytest
from django.test import Client

from workflows.definitions.validator import definition_digest
from workflows.models import ApiKey, Automation, AutomationVersion, Organisation, Run, RunEvent
from workflows.services.automations import (
    automation_publish_definition,
    version_create_draft,
)
from workflows.services.runs import run_start
from workflows.services.tenancy import api_key_create

from .factories import linear_definition

pytestmark = pytest.mark.django_db

ADMIN = "/admin/workflows"
# The management form of the automation page's (read-only) versions inline.
NO_INLINE_FORMS = {"versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}

PUBLISHED: dict[str, Any] = {
    "description": "Greets people; the admin shows this pretty-printed.",
    "start": "greet",
    "steps": [
        {
            "id": "greet",
            "type": "set",
            "values": {"greeting": "Hi {{ input.name }}"},
            "next": "done",
        },
        {"id": "done", "type": "end", "output": {"text": "{{ vars.greeting }}"}},
    ],
}


@pytest.fixture
def published(org: Organisation) -> AutomationVersion:
    return automation_publish_definition(org=org, slug="greeter", definition=PUBLISHED)


@pytest.fixture
def draft(published: AutomationVersion) -> AutomationVersion:
    return version_create_draft(
        automation=published.automation, definition=linear_definition("a", "b")
    )


@pytest.fixture
def run(org: Organisation, published: AutomationVersion) -> Run:
    started = run_start(
        org=org, automation_slug="greeter", run_input={"name": "Ada"}, start_key="admin-run"
    )
    return Run.objects.get(pk=started.run_id)


@pytest.fixture
def api_key(org: Organisation) -> ApiKey:
    key, _ = api_key_create(org=org, name="ops key")
    return key


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return response.content.decode()


# --- every page renders ---------------------------------------------------------------------


def test_changelists_render(
    admin_client: Client,
    org: Organisation,
    api_key: ApiKey,
    draft: AutomationVersion,
    run: Run,
) -> None:
    assert org.slug in page(admin_client, f"{ADMIN}/organisation/")
    assert api_key.prefix in page(admin_client, f"{ADMIN}/apikey/")
    assert "greeter" in page(admin_client, f"{ADMIN}/automation/")
    versions = page(admin_client, f"{ADMIN}/automationversion/")
    current = draft.automation.current_version
    assert current is not None
    assert draft.digest[:12] in versions
    assert current.digest[:12] in versions
    runs = page(admin_client, f"{ADMIN}/run/")
    assert f"{ADMIN}/run/{run.pk}/change/" in runs
    assert "succeeded" in runs.lower()


def test_changelist_filters_render(
    admin_client: Client, draft: AutomationVersion, run: Run
) -> None:
    unpublished = page(admin_client, f"{ADMIN}/automationversion/?published_at__isempty=1")
    current = draft.automation.current_version
    assert current is not None
    assert draft.digest[:12] in unpublished
    assert current.digest[:12] not in unpublished
    assert f"/run/{run.pk}/change/" in page(admin_client, f"{ADMIN}/run/?status=succeeded")
    assert f"/run/{run.pk}/change/" not in page(admin_client, f"{ADMIN}/run/?status=running")
    assert f"/run/{run.pk}/change/" in page(admin_client, f"{ADMIN}/run/?q={run.pk}")


def test_change_pages_render(
    admin_client: Client,
    org: Organisation,
    api_key: ApiKey,
    published: AutomationVersion,
) -> None:
    assert org.slug in page(admin_client, f"{ADMIN}/organisation/{org.pk}/change/")
    key_page = page(admin_client, f"{ADMIN}/apikey/{api_key.pk}/change/")
    assert api_key.prefix in key_page
    assert "ops key" in key_page
    assert api_key.key_hash not in key_page  # only the prefix is ever shown
    automation_page = page(admin_client, f"{ADMIN}/automation/{published.automation_id}/change/")
    assert "greeter" in automation_page
    assert published.digest in automation_page  # the versions inline


def test_published_version_is_read_only_and_pretty_printed(
    admin_client: Client, published: AutomationVersion
) -> None:
    html = page(admin_client, f"{ADMIN}/automationversion/{published.pk}/change/")

    assert 'name="definition"' not in html
    assert "<textarea" not in html
    # As written: the document's own key order, not jsonb's (tests/test_definition_text.py).
    pretty = json.dumps(published.document(), indent=2, ensure_ascii=False)
    assert f'<pre style="white-space: pre-wrap">{pretty}</pre>' in unescape(html)
    assert published.digest in html


def test_draft_version_has_the_editable_definition(
    admin_client: Client, draft: AutomationVersion
) -> None:
    html = page(admin_client, f"{ADMIN}/automationversion/{draft.pk}/change/")

    assert 'name="definition"' in html
    assert "<textarea" in html
    assert '"start": "a"' in unescape(html)


def test_saving_an_invalid_definition_on_a_draft_shows_the_issue_code(
    admin_client: Client, draft: AutomationVersion
) -> None:
    stored, digest = draft.definition, draft.digest
    broken = linear_definition("a")
    broken["steps"][0]["next"] = "nowhere"

    response = admin_client.post(
        f"{ADMIN}/automationversion/{draft.pk}/change/",
        {"definition": json.dumps(broken), "_save": "Save"},
    )

    assert response.status_code == 200  # the form again, with its errors
    html = unescape(response.content.decode())
    assert "unknown_step_reference" in html
    assert '"nowhere"' in html
    draft.refresh_from_db()
    assert draft.definition == stored
    assert draft.digest == digest


def test_saving_json_that_is_not_valid_shows_an_error(
    admin_client: Client, draft: AutomationVersion
) -> None:
    stored = draft.definition

    response = admin_client.post(
        f"{ADMIN}/automationversion/{draft.pk}/change/",
        {"definition": '{"start": "a", ', "_save": "Save"},
    )

    assert response.status_code == 200
    assert "Enter a valid JSON" in response.content.decode()
    draft.refresh_from_db()
    assert draft.definition == stored


def test_saving_a_valid_definition_on_a_draft_updates_it_and_its_digest(
    admin_client: Client, draft: AutomationVersion
) -> None:
    new = linear_definition("x", "y", "z")

    response = admin_client.post(
        f"{ADMIN}/automationversion/{draft.pk}/change/",
        {"definition": json.dumps(new), "_save": "Save"},
    )

    assert response.status_code == 302
    draft.refresh_from_db()
    assert draft.definition == new
    assert draft.digest == definition_digest(new)
    assert draft.published_at is None


def test_posting_to_a_published_version_changes_nothing(
    admin_client: Client, published: AutomationVersion
) -> None:
    stored, digest = published.definition, published.digest

    response = admin_client.post(
        f"{ADMIN}/automationversion/{published.pk}/change/",
        {"definition": json.dumps(linear_definition("evil")), "_save": "Save"},
        follow=True,
    )

    assert response.status_code == 403  # a published version is view-only
    published.refresh_from_db()
    assert published.definition == stored
    assert published.digest == digest


def test_a_refused_save_is_not_reported_as_a_success(
    admin_client: Client, published: AutomationVersion
) -> None:
    response = admin_client.post(
        f"{ADMIN}/automationversion/{published.pk}/change/",
        {"_save": "Save"},
        follow=True,
    )

    assert response.status_code == 403
    assert "was changed successfully" not in response.content.decode()


def test_publish_action_publishes_a_draft(admin_client: Client, draft: AutomationVersion) -> None:
    response = admin_client.post(
        f"{ADMIN}/automationversion/",
        {"action": "publish", "_selected_action": [str(draft.pk)]},
        follow=True,
    )

    assert response.status_code == 200
    assert f"Published greeter v{draft.number}" in response.content.decode()
    draft.refresh_from_db()
    assert draft.published_at is not None
    assert Automation.objects.get(pk=draft.automation_id).current_version_id == draft.pk


def test_adding_an_api_key_shows_the_raw_key_once(admin_client: Client, org: Organisation) -> None:
    response = admin_client.post(
        f"{ADMIN}/apikey/add/", {"org": str(org.pk), "name": "from admin"}, follow=True
    )

    assert response.status_code == 200
    key = ApiKey.objects.get(name="from admin")
    assert key.org_id == org.pk
    raw = response.context["raw_key"]
    assert raw.startswith(f"wmk_{key.prefix}_") and raw in response.content.decode()
    assert key.matches(raw)
    assert response.redirect_chain == []  # shown on the answer itself, not after a redirect
    assert ApiKey.objects.filter(org=org).count() == 1


def test_the_revoke_action_revokes_keys(admin_client: Client, api_key: ApiKey) -> None:
    response = admin_client.post(
        f"{ADMIN}/apikey/",
        {"action": "revoke", "_selected_action": [str(api_key.pk)]},
        follow=True,
    )

    assert response.status_code == 200
    api_key.refresh_from_db()
    assert api_key.revoked_at is not None


# --- runs -----------------------------------------------------------------------------------


def test_run_page_shows_the_timeline(admin_client: Client, run: Run) -> None:
    html = page(admin_client, f"{ADMIN}/run/{run.pk}/change/")

    kinds = list(RunEvent.objects.filter(run=run).order_by("id").values_list("kind", flat=True))
    assert kinds == ["run.started", "step.succeeded", "step.succeeded", "run.succeeded"]
    timeline = html[html.index("<th>event</th>") :]
    for kind in ("run.started", "step.succeeded", "run.succeeded"):
        assert f"<td>{kind}</td>" in timeline
    # The events appear in order.
    positions = [timeline.index(f"<td>{kind}</td>") for kind in ("run.started", "run.succeeded")]
    assert positions == sorted(positions)
    assert "<td>greet</td>" in timeline
    text = unescape(html)
    assert '"name": "Ada"' in text  # pretty input
    assert '"text": "Hi Ada"' in text  # pretty output
    assert "admin-run" in html  # start key


def test_runs_cannot_be_added_or_deleted(admin_client: Client, run: Run) -> None:
    assert admin_client.get(f"{ADMIN}/run/add/").status_code == 403
    assert admin_client.get(f"{ADMIN}/run/{run.pk}/delete/").status_code == 403
    assert Run.objects.filter(pk=run.pk).exists()


def test_versions_cannot_be_added_and_published_ones_not_deleted(
    admin_client: Client, published: AutomationVersion, draft: AutomationVersion
) -> None:
    assert admin_client.get(f"{ADMIN}/automationversion/add/").status_code == 403
    assert admin_client.get(f"{ADMIN}/automationversion/{published.pk}/delete/").status_code == 403
    assert admin_client.get(f"{ADMIN}/automationversion/{draft.pk}/delete/").status_code == 200


def test_pages_need_a_staff_login(client: Client, run: Run) -> None:
    response = client.get(f"{ADMIN}/run/{run.pk}/change/")

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_an_automations_organisation_and_slug_cannot_change_after_creation(
    admin_client: Client, published: AutomationVersion, other_org: Organisation
) -> None:
    # Moving an automation would leave its versions and runs in the first organisation, and
    # let the other one start runs on the first one's version.
    url = f"{ADMIN}/automation/{published.automation_id}/change/"
    html = page(admin_client, url)
    assert 'name="org"' not in html
    assert 'name="slug"' not in html

    response = admin_client.post(
        url, {"org": str(other_org.pk), "slug": "moved", "name": "Renamed", **NO_INLINE_FORMS}
    )

    assert response.status_code == 302
    automation = Automation.objects.get(pk=published.automation_id)
    assert (automation.org_id, automation.slug) == (published.org_id, "greeter")
    assert automation.name == "Renamed"


def test_a_new_automation_chooses_its_organisation_and_slug(
    admin_client: Client, org: Organisation
) -> None:
    html = page(admin_client, f"{ADMIN}/automation/add/")
    assert 'name="org"' in html
    assert 'name="slug"' in html

    response = admin_client.post(
        f"{ADMIN}/automation/add/",
        {"org": str(org.pk), "slug": "fresh", "name": "Fresh", **NO_INLINE_FORMS},
    )

    assert response.status_code == 302
    assert Automation.objects.filter(org=org, slug="fresh").exists()


def test_the_root_leads_to_the_admin_and_view_site_to_the_api_docs(admin_client: Client) -> None:
    root = Client().get("/")
    assert (root.status_code, root["Location"]) == (302, "/admin/")
    assert Client().get("/", follow=True).redirect_chain[-1][0].startswith("/admin/login/")

    html = admin_client.get("/admin/").content.decode()
    assert '<a href="/api/v1/docs/">View site</a>' in html
    assert Client().get("/api/v1/docs/").status_code == 200
