"""Run control in the admin: list actions and run-page buttons, each through a confirmation
page, acting through the run-control service with the admin user as the actor."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from workflows.admin.run_control import APPLIES_TO
from workflows.engine.executors import StepFailure
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim, settle_failure
from workflows.models import Membership, Organisation, Run, RunEvent
from workflows.services import control
from workflows.services.automations import automation_publish_definition
from workflows.services.control import run_act
from workflows.services.runs import run_start

from .factories import IO_DEFINITION

pytestmark = pytest.mark.django_db

RUNS = "/admin/workflows/run"
CONFIRM_TEMPLATE = "admin/workflows/run/confirm_action.html"


def start_run(org: Organisation, key: str) -> Run:
    """A run of the io definition: it stays running, its step ready (no worker runs here)."""
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    result = run_start(org=org, automation_slug="io", run_input={}, start_key=key)
    return Run.objects.get(pk=result.run_id)


@pytest.fixture
def start(org: Organisation) -> Callable[[str], Run]:
    return lambda key: start_run(org, key)


def in_status(start: Callable[[str], Run], key: str, status: str) -> Run:
    """A run of the io definition brought to ``status`` the way the engine would."""
    run = start(key)
    if status == "paused":
        run_act(org=run.org, run_id=run.pk, action="pause", actor="test")
    elif status == "cancelled":
        run_act(org=run.org, run_id=run.pk, action="cancel", actor="test")
    elif status == "failed":
        (step,) = claim(policy=lane_policy("io"), worker="w", limit=1)
        failure = StepFailure("boom", retryable=False)
        settle_failure(step, failure, worker="w", policy=lane_policy("io"))
    run.refresh_from_db()
    assert run.status == status
    return run


def status_of(run: Run) -> str:
    run.refresh_from_db()
    return run.status


def choose(client: Client, action: str, runs: list[Run], **extra: str):
    """Pick runs in the change list and an action, as the Go button does."""
    data = {"action": action, "index": "0", "_selected_action": [str(r.pk) for r in runs]}
    return client.post(f"{RUNS}/", {**data, **extra})


def confirm(client: Client, action: str, runs: list[Run], **extra: str):
    """Press "Yes" on the confirmation page (which posts the same selection back)."""
    data = {"action": action, "confirmed": "yes", "select_across": "0",
            "_selected_action": [str(r.pk) for r in runs]}  # fmt: skip
    return client.post(f"{RUNS}/", {**data, **extra}, follow=True)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# --- list actions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "before", "after"),
    [
        ("cancel_runs", "running", "cancelled"),
        ("pause_runs", "running", "paused"),
        ("resume_runs", "paused", "running"),
        ("retry_runs", "failed", "running"),
    ],
)
def test_a_list_action_confirms_first_then_acts_as_the_admin_user(
    admin_client: Client, start, action: str, before: str, after: str
) -> None:
    target = in_status(start, "target", before)
    finished = in_status(start, "finished", "cancelled")

    page = choose(admin_client, action, [target, finished])

    assert page.status_code == 200
    assert CONFIRM_TEMPLATE in [t.name for t in page.templates]
    html = " ".join(page.content.decode().split())
    assert "applies to 1 of the 2 selected runs" in html
    assert "Left as it is: 1 cancelled." in html
    assert status_of(target) == before  # nothing changes before the confirmation

    done = confirm(admin_client, action, [target, finished])

    assert done.status_code == 200
    assert status_of(target) == after
    assert status_of(finished) == "cancelled"
    event = RunEvent.objects.filter(run=target).order_by("-id").first()
    assert event is not None
    assert event.worker == "admin:admin"
    assert any("1 run(s)" in m for m in messages_of(done))
    assert any("1 selected run(s) skipped" in m for m in messages_of(done))


def test_confirming_acts_on_the_runs_as_they_are_at_that_moment(
    admin_client: Client, start
) -> None:
    first, second = start("a"), start("b")
    page = choose(admin_client, "cancel_runs", [first, second])
    assert "applies to 2 of the 2 selected runs" in page.content.decode()

    run_act(org=second.org, run_id=second.pk, action="cancel", actor="someone else")
    done = confirm(admin_client, "cancel_runs", [first, second])

    assert status_of(first) == "cancelled"
    assert any("1 run(s) cancelled" in m for m in messages_of(done))
    assert any("1 selected run(s) skipped" in m for m in messages_of(done))
    assert not RunEvent.objects.filter(run=second, kind="run.cancel_refused").exists()


def test_a_selection_across_pages_follows_the_list_filter(admin_client: Client, start) -> None:
    running = [start(f"r{i}") for i in range(3)]
    paused = in_status(start, "p", "paused")

    page = admin_client.post(
        f"{RUNS}/?status=running",
        {"action": "cancel_runs", "index": "0", "select_across": "1",
         "_selected_action": [str(running[0].pk)]},
    )  # fmt: skip

    assert "applies to 3 of the 3 selected runs" in page.content.decode()
    admin_client.post(
        f"{RUNS}/?status=running",
        {"action": "cancel_runs", "confirmed": "yes", "select_across": "1",
         "_selected_action": [str(running[0].pk)]},
    )  # fmt: skip
    assert [status_of(r) for r in running] == ["cancelled"] * 3
    assert status_of(paused) == "paused"


# --- the run page -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "buttons"),
    [
        ("running", ["cancel", "pause"]),
        ("paused", ["cancel", "resume"]),
        ("failed", ["retry"]),
        ("cancelled", []),
    ],
)
def test_the_run_page_offers_the_actions_its_status_allows(
    admin_client: Client, start, status: str, buttons: list[str]
) -> None:
    run = in_status(start, "k", status)

    html = admin_client.get(f"{RUNS}/{run.pk}/change/").content.decode()

    for action in ("cancel", "pause", "resume", "retry"):
        link = f'href="{RUNS}/{run.pk}/control/{action}/"'
        assert (link in html) == (action in buttons), action


def test_pausing_from_the_run_page_confirms_then_pauses_and_resume_brings_it_back(
    admin_client: Client, start
) -> None:
    run = start("k")
    url = f"{RUNS}/{run.pk}/control/pause/"

    page = admin_client.get(url)

    assert page.status_code == 200
    assert CONFIRM_TEMPLATE in [t.name for t in page.templates]
    assert "applies to 1 of the 1 selected run." in page.content.decode()
    assert status_of(run) == "running"

    response = admin_client.post(url)

    assert response.status_code == 302
    assert response["Location"] == f"{RUNS}/{run.pk}/change/"
    assert status_of(run) == "paused"
    response = admin_client.post(f"{RUNS}/{run.pk}/control/resume/", follow=True)
    assert status_of(run) == "running"
    assert f"Run {run.pk} resumed (now running)." in messages_of(response)


def test_a_refusal_is_shown_with_its_code_and_changes_nothing(admin_client: Client, start) -> None:
    run = start("k")
    assert admin_client.get(f"{RUNS}/{run.pk}/control/pause/").status_code == 200
    run_act(org=run.org, run_id=run.pk, action="cancel", actor="someone else")

    response = admin_client.post(f"{RUNS}/{run.pk}/control/pause/", follow=True)

    assert response.status_code == 200
    (message,) = messages_of(response)
    assert message.startswith(f"Run {run.pk}: run_state_conflict: The run is cancelled")
    assert status_of(run) == "cancelled"
    refused = RunEvent.objects.get(run=run, kind="run.pause_refused")
    assert refused.worker == "admin:admin"


def test_retrying_a_run_that_did_not_fail_is_refused_with_its_code(
    admin_client: Client, start
) -> None:
    run = start("k")

    response = admin_client.post(f"{RUNS}/{run.pk}/control/retry/", follow=True)

    assert any(m.startswith(f"Run {run.pk}: run_state_conflict:") for m in messages_of(response))
    assert status_of(run) == "running"


def test_an_unknown_action_is_not_found(admin_client: Client, start) -> None:
    run = start("k")
    assert admin_client.get(f"{RUNS}/{run.pk}/control/delete/").status_code == 404
    assert admin_client.post(f"{RUNS}/{run.pk}/control/delete/").status_code == 404


# --- who may act --------------------------------------------------------------------------------


def staff(username: str, org: Organisation, *codenames: str) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    perms = Permission.objects.filter(content_type__app_label="workflows", codename__in=codenames)
    user.user_permissions.set(perms)
    Membership.objects.create(user=user, org=org)
    client = Client()
    client.force_login(user)
    return client


def test_a_view_only_staff_member_sees_the_run_but_cannot_act(org: Organisation, start) -> None:
    run = start("k")
    viewer = staff("viewer", org, "view_run")

    html = viewer.get(f"{RUNS}/{run.pk}/change/").content.decode()
    assert "/control/" not in html
    assert "cancel_runs" not in viewer.get(f"{RUNS}/").content.decode()

    assert viewer.get(f"{RUNS}/{run.pk}/control/cancel/").status_code == 403
    assert viewer.post(f"{RUNS}/{run.pk}/control/cancel/").status_code == 403
    choose(viewer, "cancel_runs", [run])
    confirm(viewer, "cancel_runs", [run])
    assert status_of(run) == "running"


def test_the_permission_is_checked_when_the_action_is_taken(org: Organisation, start) -> None:
    run = start("k")
    operator = staff("operator", org, "view_run", "change_run")
    assert operator.get(f"{RUNS}/{run.pk}/control/cancel/").status_code == 200

    User.objects.get(username="operator").user_permissions.remove(
        Permission.objects.get(codename="change_run")
    )

    assert operator.post(f"{RUNS}/{run.pk}/control/cancel/").status_code == 403
    confirm(operator, "cancel_runs", [run])
    assert status_of(run) == "running"


def test_an_operator_cannot_act_on_another_organisations_runs(
    org: Organisation, other_org: Organisation, start
) -> None:
    theirs = start_run(other_org, "theirs")
    operator = staff("operator", org, "view_run", "change_run")

    assert operator.get(f"{RUNS}/{theirs.pk}/control/cancel/").status_code == 404
    assert operator.post(f"{RUNS}/{theirs.pk}/control/cancel/").status_code == 404
    confirm(operator, "cancel_runs", [theirs])
    assert status_of(theirs) == "running"


def test_the_admin_applies_each_action_to_the_statuses_the_service_does() -> None:
    assert {action: sorted(APPLIES_TO[action]) for action in control.ACTIONS} == {
        action: sorted(control._SOURCES[action]) for action in control.ACTIONS
    }
