"""The run page's live view: what its script polls. A few bytes while the run stands still;
the run's fields and the page's parts once it moves; scoped and permission-checked like
the page itself."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from workflows.models import Membership, Organisation, Run
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start
from workflows.services.signals import signal_send

from .factories import SIGNAL_WAIT_DEFINITION

pytestmark = pytest.mark.django_db

RUNS = "/admin/workflows/run"


@pytest.fixture
def run(org: Organisation) -> Run:
    automation_publish_definition(org=org, slug="orders", definition=SIGNAL_WAIT_DEFINITION)
    started = run_start(org=org, automation_slug="orders", run_input={"order": "o-7"},
                        start_key="k")  # fmt: skip
    return Run.objects.get(pk=started.run_id)


def staff(username: str, *orgs: Organisation, view: bool = True) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    if view:
        user.user_permissions.set(Permission.objects.filter(codename="view_run"))
    for org in orgs:
        Membership.objects.create(user=user, org=org)
    client = Client()
    client.force_login(user)
    return client


def live(client: Client, run: Run, query: str = "") -> dict:
    response = client.get(f"{RUNS}/{run.pk}/live/{query}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    answer: dict = json.loads(response.content)
    return answer


def test_the_page_names_its_live_view_and_the_version_it_shows(
    admin_client: Client, run: Run
) -> None:
    html = admin_client.get(f"{RUNS}/{run.pk}/change/").content.decode()
    version = live(admin_client, run)["version"]
    assert f'data-url="{RUNS}/{run.pk}/live/"' in html
    assert f'data-version="{version}"' in html
    assert 'data-poll-ms="2000"' in html


def test_while_the_run_stands_still_the_answer_is_that_nothing_changed(
    admin_client: Client, run: Run, django_assert_max_num_queries
) -> None:
    version = live(admin_client, run)["version"]
    # Session, user, the run, its newest event: nothing per step or event.
    with django_assert_max_num_queries(4):
        answer = live(admin_client, run, f"?since={version}")
    assert answer == {"version": version, "finished": False, "status": "running",
                      "changed": False}  # fmt: skip


def test_once_the_run_moves_the_answer_carries_its_fields_and_the_pages_parts(
    admin_client: Client, org: Organisation, run: Run
) -> None:
    before = live(admin_client, run)
    assert 'data-step="wait" data-state="waiting"' in before["parts"]["run-graph"]

    signal_send(org=org, name="order.paid", correlation="o-7", payload={"paid": 12})

    after = live(admin_client, run, f"?since={before['version']}")
    assert after["changed"] and after["finished"] and after["version"] != before["version"]
    assert after["status"] == "succeeded"
    assert after["fields"]["status"] == "Succeeded"
    assert 'data-step="wait" data-state="done"' in after["parts"]["run-graph"]
    assert "&quot;paid&quot;: 12" in after["parts"]["steps"]  # the wait's output
    assert "step.succeeded" in after["parts"]["timeline"]


def test_a_list_paged_back_is_left_as_the_person_left_it(admin_client: Client, run: Run) -> None:
    answer = live(admin_client, run, "?steps_before=99&events_after=1")
    assert answer["parts"]["steps"] is None
    assert answer["parts"]["timeline"] is None
    assert answer["parts"]["run-graph"]


def test_another_organisations_staff_get_404_and_staff_without_view_permission_403(
    run: Run, other_org: Organisation, org: Organisation
) -> None:
    outsider = staff("globex-ana", other_org)
    response = outsider.get(f"{RUNS}/{run.pk}/live/")
    assert response.status_code == 404
    assert json.loads(response.content)["code"] == "not_found"
    assert outsider.get(f"{RUNS}/{run.pk}/change/").status_code == 404  # as the page

    member_without_view = staff("acme-bob", org, view=False)
    assert member_without_view.get(f"{RUNS}/{run.pk}/live/").status_code == 403

    member = staff("acme-ana", org)
    assert member.get(f"{RUNS}/{run.pk}/live/").status_code == 200
    assert Client().get(f"{RUNS}/{run.pk}/live/").status_code == 302  # to the login page
    assert staff("x", org).get(f"{RUNS}/nonsense/live/").status_code == 404
