"""The audit log: who did what from the admin, the API and the command line, written in the
action's own transaction, append-only in the database, read through the admin and the API.
And the run history's ``by``: who decided an approval, cancelled or retried a run."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.db.transaction import TransactionManagementError
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from effects.models import Connection
from workflows.models import ApiKey, AuditEntry, Membership, Organisation, Run, RunEvent
from workflows.plugins import Actor, record_audit
from workflows.services.audit import purge_audit
from workflows.services.control import run_act

from .test_approvals_setup import open_request
from .test_run_control import fail_run, start

pytestmark = pytest.mark.django_db


def entries(org: Organisation, **filters: Any) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(org=org, **filters).order_by("id"))


def actor_of(entry: AuditEntry) -> tuple[str, str, str]:
    return (entry.actor_kind, entry.actor_id, entry.actor_display)


def history_by(api: APIClient, run_id: int) -> dict[str, str | None]:
    """The run history's kinds, each with who the API says caused it."""
    rows = api.get(f"/api/v1/runs/{run_id}/history").json()["results"]
    return {row["kind"]: row["by"] for row in rows}


# --- who did what, from each door ---------------------------------------------------------------


def test_a_cancel_through_the_api_is_audited_as_the_key_and_shown_in_the_history(org, api) -> None:
    run = start(org)
    key = ApiKey.objects.get(org=org)

    assert api.post(f"/api/v1/runs/{run.pk}/cancel").status_code == 200

    (entry,) = entries(org, action="run.cancel")
    assert actor_of(entry) == ("api_key", key.prefix, "test")
    assert (entry.target_type, entry.target_id) == ("run", str(run.pk))
    assert entry.detail == {"status": "cancelled", "steps_changed": 1}
    assert history_by(api, run.pk)["run.cancelled"] == f"api_key:{key.prefix}"


def test_a_retry_from_the_admin_is_audited_as_the_person(org, admin_client: Client) -> None:
    run = fail_run(org)

    admin_client.post(f"/admin/workflows/run/{run.pk}/control/retry/")

    (entry,) = entries(org, action="run.retry")
    admin = User.objects.get(username="admin")
    assert actor_of(entry) == ("user", str(admin.pk), "admin")
    (retried,) = RunEvent.objects.filter(run=run, kind="run.retried")
    assert (retried.detail or {})["by"] == "admin:admin"


def test_a_command_is_audited_as_the_operating_system_user(org, monkeypatch) -> None:
    run = start(org)
    monkeypatch.setattr("getpass.getuser", lambda: "ada")

    call_command("run_control", "pause", "--org", org.slug, "--run", str(run.pk), stdout=StringIO())
    call_command("create_api_key", "--org", org.slug, "--name", "ci", stdout=StringIO(),
                 stderr=StringIO())  # fmt: skip

    (paused,) = entries(org, action="run.pause")
    (created,) = entries(org, action="api_key.create", actor_kind="command")
    assert actor_of(paused) == actor_of(created) == ("command", "ada", "ada")
    assert created.detail == {"name": "ci", "read_only": False, "scopes": [], "expires_at": None}
    key = ApiKey.objects.get(org=org, name="ci")
    call_command("revoke_api_key", key.prefix, stdout=StringIO())
    (revoked,) = entries(org, action="api_key.revoke")
    assert (revoked.target_id, actor_of(revoked)) == (key.prefix, ("command", "ada", "ada"))
    call_command("revoke_api_key", key.prefix, stdout=StringIO())  # again: nothing changes
    assert len(entries(org, action="api_key.revoke")) == 1


@pytest.mark.django_db(transaction=True)  # the approval step runs as a worker runs it
def test_an_approval_decided_through_the_api_is_audited_and_its_decider_shown(org, api) -> None:
    run, approval = open_request(org)

    answer = api.post(f"/api/v1/approvals/{approval.pk}/decide", {"decision": "approve"},
                      format="json")  # fmt: skip

    assert answer.status_code == 200, answer.json()
    by = answer.json()["approval"]["decided_by"]  # api_key:<prefix>
    (entry,) = entries(org, action="approval.approve")
    assert (entry.actor_kind, entry.actor_id) == ("api_key", by.removeprefix("api_key:"))
    assert (entry.target_type, entry.target_id) == ("approval", str(approval.pk))
    assert entry.detail["run"] == run.pk and entry.detail["decision"] == "approved"
    # Before, the decider was only in the event's worker column, which the API hides.
    assert history_by(api, run.pk)["step.approval"] == by


def test_a_refused_action_changes_nothing_and_records_nothing(org) -> None:
    run = start(org)
    run_act(org=org, run_id=run.pk, action="cancel", actor=Actor.system("ops"))

    with pytest.raises(Exception, match="cancelled"):
        run_act(org=org, run_id=run.pk, action="cancel", actor=Actor.system("ops"))

    assert [e.action for e in entries(org, target_type="run")] == ["run.cancel"]


def test_publishing_through_the_api_is_audited(org, api) -> None:
    api.post("/api/v1/automations", {"slug": "greet"}, format="json")
    definition = {"start": "done", "steps": [{"id": "done", "type": "end"}]}
    api.post("/api/v1/automations/greet/versions", {"definition": definition}, format="json")

    assert api.post("/api/v1/automations/greet/versions/1/publish").status_code == 200

    (entry,) = entries(org, action="automation.publish")
    assert (entry.actor_kind, entry.target_type, entry.target_id) == (
        "api_key", "automation", "greet",
    )  # fmt: skip
    assert (entry.detail["version"], entry.detail["current"]) == (1, True)


def test_a_connection_is_audited_without_its_secret(org, api) -> None:
    created = api.post(
        "/api/v1/connections",
        {"name": "crm", "provider": "http", "base_url": "https://crm.example", "secret": "s3cr3t!"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    api.patch("/api/v1/connections/crm", {"secret": "n3w-s3cr3t", "timeout_seconds": 5},
              format="json")  # fmt: skip
    api.delete("/api/v1/connections/crm")

    made, changed, deleted = entries(org, target_type="connection")
    assert [made.action, changed.action, deleted.action] == [
        "connection.create", "connection.update", "connection.delete",
    ]  # fmt: skip
    assert made.detail["secret_set"] is True
    assert changed.detail == {"provider": "http", "fields": ["timeout_seconds"],
                              "secret_replaced": True}  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM workflows_auditentry WHERE detail::text LIKE '%3cr3t%'"
        )
        assert cursor.fetchone() == (0,)
    assert not Connection.objects.filter(org=org).exists()


def test_the_egress_allowlist_is_audited_from_the_api_and_the_command(org, api) -> None:
    added = api.post("/api/v1/egress-allowlist", {"entry": "127.0.0.1", "note": "stubs"},
                     format="json")  # fmt: skip
    assert added.status_code == 201, added.json()
    api.delete(f"/api/v1/egress-allowlist/{added.json()['id']}")
    call_command("egress_allow", "--org", org.slug, "add", "127.0.0.1", stdout=StringIO())

    rows = entries(org, target_type="egress_allow")
    assert [(e.action, e.actor_kind, e.target_id) for e in rows] == [
        ("egress_allow.add", "api_key", "127.0.0.1/32"),
        ("egress_allow.remove", "api_key", "127.0.0.1/32"),
        ("egress_allow.add", "command", "127.0.0.1/32"),
    ]


# --- the door's rules -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_record_audit_refuses_to_run_outside_a_transaction(org) -> None:
    assert not connection.in_atomic_block  # autocommit: a record alone would commit alone

    with pytest.raises(TransactionManagementError):
        record_audit(org=org, actor=Actor.system(), action="thing.do", target_type="thing",
                     target_id=1)  # fmt: skip

    assert entries(org) == []


def test_an_action_rolled_back_takes_its_record_with_it(org) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        record_audit(org=org, actor=Actor.system(), action="thing.do", target_type="thing",
                     target_id=1)  # fmt: skip
        raise RuntimeError("the action failed after its record was written")

    assert entries(org) == []


@pytest.mark.parametrize(
    "detail",
    [{"secret": "x"}, {"options": {"api_token": "x"}}, {"list": [{"password": "x"}]}],
)
def test_a_secret_never_reaches_the_audit_log(org, detail: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="never records a secret"), transaction.atomic():
        record_audit(org=org, actor=Actor.system(), action="thing.do", target_type="thing",
                     target_id=1, detail=detail)  # fmt: skip


# --- append-only ----------------------------------------------------------------------------


def one_entry(org: Organisation) -> AuditEntry:
    with transaction.atomic():
        return record_audit(org=org, actor=Actor.system(), action="thing.do",
                            target_type="thing", target_id=1)  # fmt: skip


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE workflows_auditentry SET actor_display = 'someone else' WHERE id = %s",
        "DELETE FROM workflows_auditentry WHERE id = %s",
    ],
)
def test_the_database_refuses_to_change_or_delete_an_entry(org, statement: str) -> None:
    entry = one_entry(org)

    with (
        pytest.raises(DatabaseError, match="append-only") as refused,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement, [entry.pk])

    assert refused.value.__cause__.sqlstate == "WM002"  # type: ignore[union-attr]
    assert AuditEntry.objects.get(pk=entry.pk).actor_display == "waymark"


def test_the_model_refuses_too(org) -> None:
    entry = one_entry(org)
    entry.actor_display = "someone else"

    with pytest.raises(TypeError, match="append-only"):
        entry.save()
    with pytest.raises(TypeError, match="append-only"):
        entry.delete()


def test_retention_deletes_only_entries_older_than_it(org) -> None:
    AuditEntry.objects.create(  # written 40 days ago (an INSERT is never refused)
        org=org, at=timezone.now() - timedelta(days=40), actor_kind="system", actor_id="w",
        actor_display="w", action="thing.do", target_type="thing", target_id="1",
    )  # fmt: skip
    new = one_entry(org)

    assert purge_audit() == 0  # retention is off by default: kept forever
    assert purge_audit(older_than_seconds=30 * 86_400) == 1

    assert [e.pk for e in entries(org)] == [new.pk]
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEntry.objects.filter(pk=new.pk).delete()  # outside a purge: refused


# --- reading it ---------------------------------------------------------------------------------


def test_the_api_lists_the_organisations_entries_newest_first_with_filters(
    org, other_org, api, other_api
) -> None:
    runs = [start(org, key=f"k{n}") for n in range(3)]
    for run in runs:
        api.post(f"/api/v1/runs/{run.pk}/cancel")
    other_run = start(other_org, key="theirs")
    other_api.post(f"/api/v1/runs/{other_run.pk}/pause")

    page = api.get("/api/v1/audit", {"action": "run.cancel", "limit": 2}).json()
    assert [e["target_id"] for e in page["results"]] == [str(runs[2].pk), str(runs[1].pk)]
    assert page["results"][0]["actor"]["kind"] == "api_key"
    rest = api.get(page["next"]).json()
    assert [e["target_id"] for e in rest["results"]] == [str(runs[0].pk)]

    one = api.get("/api/v1/audit", {"target_type": "run", "target_id": runs[1].pk}).json()
    assert [e["action"] for e in one["results"]] == ["run.cancel"]
    # Another organisation's entries are not there, whatever the filter.
    theirs = api.get("/api/v1/audit", {"target_id": other_run.pk}).json()
    assert theirs["results"] == []
    assert [e["action"] for e in other_api.get("/api/v1/audit").json()["results"]] == [
        "run.pause", "automation.publish", "api_key.create",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"acton": "run.cancel"}, "invalid_query"),
        ({"actor_kind": "robot"}, "invalid_input"),
        ({"at_after": "yesterday"}, "invalid_input"),
        ({"cursor": "bogus"}, "invalid_input"),
    ],
)
def test_bad_audit_queries_are_refused_with_a_code(api, query: dict[str, str], code: str) -> None:
    answer = api.get("/api/v1/audit", query)

    assert answer.status_code == 400
    assert answer.json()["code"] == code


def test_the_audit_list_is_in_the_openapi_schema(api) -> None:
    schema = api.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()

    listing = schema["paths"]["/api/v1/audit"]["get"]
    assert listing["operationId"] == "audit_list"
    assert {p["name"] for p in listing["parameters"]} >= {"action", "actor_kind", "target_id"}
    event = schema["components"]["schemas"]["RunEventOut"]["properties"]
    assert "by" in event


def auditor(org: Organisation) -> Client:
    user = User.objects.create_user("aud", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_auditentry"))
    Membership.objects.create(user=user, org=org)
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_shows_a_members_entries_read_only(org, other_org) -> None:
    mine, theirs = one_entry(org), one_entry(other_org)
    client = auditor(org)

    listing = client.get("/admin/workflows/auditentry/").content.decode()
    assert f"/admin/workflows/auditentry/{mine.pk}/change/" in listing
    assert f"/admin/workflows/auditentry/{theirs.pk}/change/" not in listing
    page = client.get(f"/admin/workflows/auditentry/{mine.pk}/change/")
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert client.get(f"/admin/workflows/auditentry/{theirs.pk}/change/").status_code == 404
    assert client.get("/admin/workflows/auditentry/add/").status_code == 403
    assert client.post(f"/admin/workflows/auditentry/{mine.pk}/delete/").status_code == 403
    assert AuditEntry.objects.filter(pk=mine.pk).exists()


def test_a_superuser_sees_every_organisations_entries(org, other_org, admin_client) -> None:
    mine, theirs = one_entry(org), one_entry(other_org)

    listing = admin_client.get("/admin/workflows/auditentry/").content.decode()

    for entry in (mine, theirs):
        assert f"/admin/workflows/auditentry/{entry.pk}/change/" in listing


def test_a_key_made_in_the_admin_is_audited_as_the_person(org, admin_client) -> None:
    admin_client.post("/admin/workflows/apikey/add/", {"org": org.pk, "name": "deploy"})

    (entry,) = entries(org, action="api_key.create", actor_kind="user")
    assert entry.actor_display == "admin" and entry.detail["name"] == "deploy"


def test_the_audit_entries_outlive_the_runs_they_name(org) -> None:
    run = start(org)
    run_act(org=org, run_id=run.pk, action="cancel", actor=Actor.system("ops"))
    Run.objects.filter(pk=run.pk).update(finished_at=run.created_at - timedelta(days=400))

    from workflows.engine.retention import purge_finished_runs

    assert purge_finished_runs() == 1
    assert [e.action for e in entries(org, target_type="run")] == ["run.cancel"]
