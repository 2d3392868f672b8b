"""Migrating runs between versions through its surfaces: the API (dry run by default, a job,
its status, resume), ``manage.py migrate_runs`` and the admin (dry run first, then confirm),
each scoped to the organisation and refusing bad input with a stable code."""

from __future__ import annotations

from collections import Counter
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.test import APIClient

from workflows.models import (
    AuditEntry,
    Automation,
    Membership,
    Organisation,
    Run,
    RunMigration,
)
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start
from workflows.services.tenancy import api_key_create

from .migration_setup import SLUG, definition, migrated_events, publish, version_of
from .test_run_migration import start_runs

pytestmark = pytest.mark.django_db(transaction=True)

BODY: dict[str, Any] = {
    "from_version": 3, "to_version": 4, "map": {"cool": "cooldown", "paid": "payment"},
}  # fmt: skip
PATH = f"/api/v1/automations/{SLUG}/migrations"


def post(api: APIClient, body: dict[str, Any], path: str = PATH) -> Any:
    return api.post(path, body, format="json")


def versions(run_ids: list[int]) -> set[int]:
    return {version_of(run_id) for run_id in run_ids}


# --- the API ------------------------------------------------------------------------------------


def test_the_api_answers_a_dry_run_by_default_and_moves_nothing(org: Organisation, api) -> None:
    runs = start_runs(org)

    answer = post(api, BODY)

    assert answer.status_code == 200, answer.json()
    data = answer.json()
    assert data["dry_run"] is True
    assert data["plan"]["targets"]["review"] == "review"
    assert data["plan"]["unmapped"] == {"hold": "step_removed"}
    assert (data["report"]["matched"], data["report"]["would_move"]) == (8, 6)
    assert data["report"]["cannot"]["step_removed"]["sample"] == sorted(runs["hold"])
    assert versions([r for ids in runs.values() for r in ids]) == {3}
    assert not RunMigration.objects.exists()


def test_the_api_moves_runs_in_calls_of_limit_and_resumes_by_id(org: Organisation, api) -> None:
    runs = start_runs(org)

    first = post(api, {**BODY, "dry_run": False, "limit": 5}).json()
    # The runs it cannot move are not tried: the five tried all moved.
    assert (first["status"], first["moved"], first["more"]) == ("running", 5, True)
    assert first["planned"]["would_move"] == 6
    second = post(api, {"resume": first["id"]}).json()
    assert (second["status"], second["moved"], second["moved_now"], second["more"]) == (
        "finished", 6, 1, False,
    )  # fmt: skip
    assert second["report"]["cannot"]["step_removed"]["runs"] == 2
    status = api.get(f"{PATH}/{first['id']}").json()
    assert (status["status"], status["moved"], status["from_version"]) == ("finished", 6, 3)
    assert status["created_by"].startswith("api_key:")
    listed = api.get(PATH).json()["results"]
    assert [job["id"] for job in listed] == [first["id"]]
    moved = runs["cool"] + runs["paid"] + runs["review"]
    assert versions(moved) == {4} and versions(runs["hold"]) == {3}
    assert all(len(migrated_events(r)) == 1 for r in moved)
    by = migrated_events(moved[0])[0].detail
    assert by is not None and by["by"] == status["created_by"]
    # Audited, each in its action's transaction: the job made, resumed, and each run moved.
    entries = AuditEntry.objects.filter(org=org, action__contains="migrat")
    audited = Counter(entries.values_list("action", "actor_kind"))
    assert audited == {
        ("run_migration.start", "api_key"): 1,
        ("run_migration.resume", "api_key"): 1,
        ("run.migrate", "api_key"): 6,
    }


def test_a_migration_of_steps_whose_ids_read_as_secrets_names_is_made_and_audited(
    org: Organisation, api
) -> None:
    """A step id is the author's word: ``fetch_token`` in both versions, a run waiting at
    it. The plan's maps go into the audit entry as pairs, not as keys (the audit log refuses
    a key that reads as a secret's name, and every migration of the automation was a 500)."""
    for hours in (1, 2):  # two versions, the same step ids
        steps = [{"id": "fetch_token", "type": "wait", "duration": f"{hours}h", "next": "done"},
                 {"id": "done", "type": "end"}]  # fmt: skip
        definition = {"start": "fetch_token", "steps": steps}
        automation_publish_definition(org=org, slug="tokens", definition=definition)
        if hours == 1:
            run_id = run_start(org=org, automation_slug="tokens", run_input={},
                               start_key="t").run_id  # fmt: skip
    path = "/api/v1/automations/tokens/migrations"
    answer = post(api, {"from_version": 1, "to_version": 2, "dry_run": False}, path)
    assert answer.status_code == 200, answer.json()
    assert answer.json()["moved"] == 1
    entry = AuditEntry.objects.get(org=org, action="run_migration.start")
    assert entry.detail["targets"] == [["fetch_token", "fetch_token"], ["done", "done"]]
    assert version_of(run_id) == 2


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({**BODY, "map": {"cool": "nowhere"}}, 400, "unknown_step"),
        ({**BODY, "map": {"paid": "cooldown"}}, 400, "incompatible_step_type"),
        ({**BODY, "statuses": ["succeeded"]}, 400, "run_finished"),
        ({**BODY, "statuses": ["done"]}, 400, "invalid_input"),
        ({**BODY, "to_version": 3}, 400, "same_version"),
        ({**BODY, "to_version": 7}, 404, "unknown_version"),
        ({**BODY, "to_automation": "other", "to_version": 1}, 400,
         "version_of_another_automation"),
        ({**BODY, "removed": "move_to:hold"}, 400, "unknown_step"),
        ({**BODY, "removed": {"move_to": "cooldown", "x": 1}}, 400, "invalid_input"),
        ({**BODY, "mapp": {}}, 400, "invalid_input"),
        ({"to_version": 4}, 400, "invalid_input"),
        ({"resume": 1, "to_version": 4}, 400, "invalid_input"),
        ({"resume": 99_999}, 404, "unknown_migration"),
        ({**BODY, "limit": 5000}, 400, "invalid_input"),
        ({**BODY, "limit": 0}, 400, "invalid_input"),  # a job that could move nothing
    ],
)  # fmt: skip
def test_bad_input_through_the_api_is_a_code_and_nothing_moves(
    org: Organisation, api, body: dict[str, Any], status: int, code: str
) -> None:
    runs = start_runs(org, per_kind=1)
    publish_other(org)

    answer = post(api, {**body, "dry_run": False})

    assert (answer.status_code, answer.json()["code"]) == (status, code), answer.json()
    assert versions([r for ids in runs.values() for r in ids]) == {3}
    assert not RunMigration.objects.exists()


def publish_other(org: Organisation) -> None:
    automation_publish_definition(org=org, slug="other", definition=definition(4))


def test_another_organisations_automation_and_jobs_are_unknown(
    org: Organisation, api, other_org: Organisation, other_api
) -> None:
    start_runs(org, per_kind=1)
    job = post(api, {**BODY, "dry_run": False}).json()

    assert post(other_api, BODY).json()["code"] == "unknown_automation"
    publish(other_org, 4)
    assert post(other_api, {"resume": job["id"]}).json()["code"] == "unknown_migration"
    assert other_api.get(f"{PATH}/{job['id']}").json()["code"] == "unknown_migration"


def test_a_read_only_key_cannot_migrate(org: Organisation) -> None:
    start_runs(org, per_kind=1)
    key, raw = api_key_create(org=org, name="ro")
    key.read_only = True
    key.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")

    assert post(client, BODY).json()["code"] == "read_only_key"
    assert client.get(PATH).status_code == 200


def test_the_schema_documents_the_migration_endpoints(api) -> None:
    paths = api.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()["paths"]

    assert "post" in paths["/api/v1/automations/{slug}/migrations"]
    assert "get" in paths["/api/v1/automations/{slug}/migrations/{migration_id}"]


# --- the command --------------------------------------------------------------------------------


def command(org: Organisation, *args: str) -> str:
    out = StringIO()
    call_command("migrate_runs", "--org", org.slug, "--automation", SLUG, *args, stdout=out)
    return out.getvalue()


def test_the_command_dry_runs_applies_and_resumes(org: Organisation) -> None:
    runs = start_runs(org)
    plan = ["--from", "3", "--to", "4", "--map", "cool=cooldown", "--map", "paid=payment"]

    said = command(org, *plan, "--dry-run")
    assert "8 run(s) match; 6 would move" in said
    assert "at hold (no new step): 2 run(s), not moved: step_removed" in said
    assert versions(runs["cool"]) == {3}

    said = command(org, *plan, "--removed", "move_to:cooldown", "--step", "hold")
    job = RunMigration.objects.get()
    assert f"migration {job.pk} started: if it stops, go on with --resume {job.pk}" in said
    assert f"migration {job.pk} (finished): 2 run(s) moved" in said
    assert versions(runs["hold"]) == {4} and versions(runs["cool"]) == {3}
    assert "0 now" in command(org, "--resume", str(job.pk))


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--map", "hold=cooldown"), "--map"),
        (("--map", "cool=cooldown", "--map", "paid=payment"), "--map"),
        (("--removed", "move_to:cooldown"), "--removed"),
        (("--step", "cool", "--status", "paused"), "--status, --step"),
        (("--from", "3", "--to", "4"), "--from, --to"),
        (("--dry-run",), "--dry-run"),
    ],
)  # fmt: skip
def test_the_command_resumes_only_with_the_migrations_own_plan(
    org: Organisation, api, args: tuple[str, ...], named: str
) -> None:
    # A plan option beside --resume is refused before anything moves, as the API refuses it:
    # the job goes on with the plan it was made with, never one given now (a --map the job
    # did not make would otherwise be silently ignored, and --dry-run would move runs).
    runs = start_runs(org)
    first = post(api, {**BODY, "map": {"cool": "cooldown"}, "dry_run": False, "limit": 1})
    job = RunMigration.objects.get(pk=first.json()["id"])
    assert job.moved == 1

    with pytest.raises(CommandError, match=f"invalid_input: .*leave out {named}$"):
        command(org, "--resume", str(job.pk), *args)

    job.refresh_from_db()
    assert (job.status, job.moved) == ("running", 1)
    assert sum(version_of(r) == 4 for ids in runs.values() for r in ids) == 1
    # Without them it goes on with its own plan: `hold` has no new id there, so those stay.
    assert f"migration {job.pk} (finished)" in command(org, "--resume", str(job.pk))
    assert versions(runs["cool"]) == {4} and versions(runs["hold"]) == {3}


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("--from", "3", "--to", "4", "--map", "cool=nowhere"), "unknown_step"),
        (("--from", "3", "--to", "3"), "same_version"),
        (("--from", "3", "--to", "4", "--removed", "sideways"), "invalid_input"),
        (("--from", "3", "--to", "4", "--map", "cool"), "--map takes OLD=NEW"),
        (("--resume", "12345",), "unknown_migration"),
        (("--to", "4",), "give --from and --to"),
    ],
)  # fmt: skip
def test_the_command_refuses_bad_input_with_its_code(
    org: Organisation, args: tuple[str, ...], code: str
) -> None:
    start_runs(org, per_kind=1)

    with pytest.raises(CommandError, match=code):
        command(org, *args)
    assert not RunMigration.objects.exists()


# --- the admin ----------------------------------------------------------------------------------


def staff(org: Organisation, *, may_change: bool = True) -> Client:
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    Membership.objects.create(user=user, org=org)
    codenames = ["view_automation", *(["change_automation"] if may_change else [])]
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def migrate_url(automation: Automation) -> str:
    return f"/admin/workflows/automation/{automation.pk}/migrate-runs/"


FORM = {"from_version": "3", "to_version": "4", "map": "cool=cooldown\npaid = payment",
        "removed": "stay", "steps": "", "statuses": ["running", "paused"]}  # fmt: skip


def test_the_admin_shows_the_dry_run_first_and_moves_on_confirmation(org: Organisation) -> None:
    runs = start_runs(org)
    client = staff(org)
    automation = Automation.objects.get(org=org, slug=SLUG)
    url = migrate_url(automation)

    page = client.get(url)
    assert page.status_code == 200 and b"Dry run" in page.content

    shown = client.post(url, FORM)
    assert shown.status_code == 200
    text = shown.content.decode()
    assert 'id="would-move"' in text and "6 of the 8 matching runs would move" in text
    assert "step_removed" in text
    assert versions(runs["cool"]) == {3}  # nothing moved yet

    done = client.post(url, {**FORM, "confirmed": "yes"}, follow=True)
    job = RunMigration.objects.get()
    assert (job.status, job.moved, job.created_by) == ("finished", 6, "admin:ops")
    assert f"Migration {job.pk}" in done.content.decode()
    assert versions(runs["cool"] + runs["paid"] + runs["review"]) == {4}


def test_the_admin_refuses_a_bad_plan_on_the_form_and_moves_nothing(org: Organisation) -> None:
    runs = start_runs(org, per_kind=1)
    client = staff(org)
    automation = Automation.objects.get(org=org, slug=SLUG)

    shown = client.post(migrate_url(automation), {**FORM, "map": "paid=cooldown",
                                                  "confirmed": "yes"})  # fmt: skip

    assert shown.status_code == 200
    assert "incompatible_step_type" in shown.content.decode()
    assert versions([r for ids in runs.values() for r in ids]) == {3}
    assert not RunMigration.objects.exists()


def test_the_admin_page_needs_the_change_permission_and_the_organisation(
    org: Organisation, other_org: Organisation
) -> None:
    start_runs(org, per_kind=1)
    automation = Automation.objects.get(org=org, slug=SLUG)

    assert staff(org, may_change=False).post(migrate_url(automation), FORM).status_code == 403
    outsider = User.objects.create_user("outsider", password="pw", is_staff=True)
    Membership.objects.create(user=outsider, org=other_org)
    outsider.user_permissions.set(Permission.objects.filter(codename__endswith="_automation"))
    client = Client()
    client.force_login(outsider)
    assert client.get(migrate_url(automation)).status_code == 404
    assert Run.objects.filter(version__number=4).count() == 0
