"""Erasure's reach, both ways.

Far enough: a copy of the erased person's value in another person's rows (a provider's
refusal naming them in someone else's effect, a step's error, a history entry, an approval's
comment, a webhook answer) is found and removed, and afterwards no text or JSON column of any
table holds it. Not too far: only whole values are matched in other people's rows (an id
inside a URL, a run's number, stay), an identifier must be long enough and declared, an
erasure is a dry run unless asked otherwise, it needs its own key scope and admin permission,
and the audit log is byte-for-byte as it was."""

# The fixtures (world, eraser) are test_erasure's, imported: pytest passes them by name.
# ruff: noqa: F811

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import Client
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from effects.models import Effect, Suppression
from effects.resolve import resolve_effect
from timers.models import Timer
from webhooks.models import Delivery
from workflows.errors import InvalidInput
from workflows.models import ApiKey, AuditEntry, Erasure, Membership, Organisation, Run, RunEvent
from workflows.models import Step as StepRow
from workflows.plugins.audit import Actor, record_audit
from workflows.plugins.code import CodeWorkflowError, Context, publish_code_workflow, workflow
from workflows.plugins.erasure import MARKER, Matcher, scrub_json
from workflows.services.automations import automation_publish_definition
from workflows.services.erasure import erase_person, subject_of
from workflows.services.erasure.scrub import Value
from workflows.services.runs import run_start
from workflows.services.signals import signal_send
from workflows.services.tenancy import api_key_create

from .effect_setup import connect, drive
from .test_erasure import ANN, ANN_TRACES, BOB, NUDGE, REFUND, erase, eraser, hits, world  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def every_column_holding(value: str) -> list[str]:
    """Every column of every table (any type, as text) that holds ``value``: wider than
    test_erasure.hits, which reads the text and JSON columns only."""
    found = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.table_name, c.column_name FROM information_schema.columns c"
            "  JOIN information_schema.tables t ON t.table_schema = c.table_schema"
            "   AND t.table_name = c.table_name AND t.table_type = 'BASE TABLE'"
            " WHERE c.table_schema = current_schema() AND c.data_type <> 'bytea'"
            " ORDER BY 1, 2"
        )
        for table, column in cursor.fetchall():
            cursor.execute(
                f'SELECT count(*) FROM "{table}" WHERE "{column}"::text ILIKE %s',  # noqa: S608
                [f"%{value}%"],
            )
            if cursor.fetchone()[0]:
                found.append(f"{table}.{column}")
    return found


def audit_rows() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(a)::text FROM workflows_auditentry a ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


def plant_in_bobs_rows(world: dict[str, Any]) -> dict[str, Any]:
    """Copies of Ann's address in rows of Bob's runs that his runs' own columns do not show:
    what a provider, a person or an endpoint said about her while serving him."""
    bob = world["bob"]
    refusal = {"status": 422, "body": {"error": f"{ANN['email']} is already a contact",
                                       "detail": f"merge {BOB['email']} into it?"}}  # fmt: skip
    Effect.objects.filter(run_id=bob["welcome"]).update(last_response=refusal)
    StepRow.objects.filter(run_id=bob["nudge"], step_id="nap").update(
        error=f"provider said: unknown recipient <{ANN['email'].upper()}>"
    )
    RunEvent.objects.create(org_id=Run.objects.get(pk=bob["refund"]).org_id, run_id=bob["refund"],
                            kind="note", detail={"said": f"cc {ANN['email']}"})  # fmt: skip
    ApprovalRequest.objects.filter(run_id=bob["refund"]).update(comment=f"ask {ANN['email']} first")
    Delivery.objects.filter(run_id=bob["welcome"]).update(
        last_response=f"rejected: {ANN['email']} unsubscribed"
    )
    Timer.objects.filter(run_id=bob["nudge"]).update(error=f"for {ANN['email']}")
    # The admin's change log names an object by its display: her suppression, added there.
    clerk = User.objects.create_user("clerk", "clerk@example.invalid", "pw", is_staff=True)
    suppression = Suppression.objects.get(channel="email")
    LogEntry.objects.log_actions(clerk.pk, [suppression], ADDITION, change_message="[]")
    return refusal


def test_a_copy_in_another_persons_effect_answer_is_erased_and_no_column_holds_it(
    org, eraser, world
) -> None:
    refusal = plant_in_bobs_rows(world)
    bob = world["bob"]
    assert Run.objects.get(pk=bob["welcome"]).input == BOB  # his run's row does not name her
    planted = every_column_holding(ANN["email"])
    assert {"effects_effect.last_response", "django_admin_log.object_repr"} <= set(planted)

    answer = erase(eraser, email=ANN["email"])

    assert answer.status_code == 201, answer.json()
    # (a) The provider's answer in Bob's effect no longer names her; the rest of it stays.
    effect = Effect.objects.get(run_id=bob["welcome"])
    body = {"error": MARKER, "detail": refusal["body"]["detail"]}
    assert effect.last_response == {"status": 422, "body": body}
    assert effect.state == "settled" and (effect.request or {})["body"]["to"] == BOB["email"]
    # Bob's runs are among those scrubbed (each says so in its history), and keep running.
    scrubbed = set(answer.json()["runs_scrubbed"])
    assert {bob["welcome"], bob["nudge"], bob["refund"]} <= scrubbed
    assert RunEvent.objects.filter(run_id=bob["welcome"], kind="run.erased").exists()
    assert all(Run.objects.get(pk=r).status == "running" for r in bob.values())
    assert answer.json()["counts"]["effects_effect.last_response"] >= 1
    # (b) Every column of every table, whatever its type: nothing of her is left.
    for trace in {*ANN_TRACES, ANN["email"].upper(), ANN["customer_id"]}:
        assert every_column_holding(trace) == [], trace
    # Bob is still there, where nobody named her.
    assert Run.objects.get(pk=bob["welcome"]).input == BOB
    assert every_column_holding(BOB["email"])


def test_only_whole_values_are_taken_from_other_peoples_rows(org, eraser, world) -> None:
    bob = world["bob"]
    url = f"https://crm.example/customers/{ANN['customer_id']}/notes"
    StepRow.objects.filter(run_id=bob["welcome"], step_id="send").update(
        output={"ref": ANN["customer_id"], "sms": "+44 20 7946 0123", "n": 442079460123}
    )
    StepRow.objects.filter(run_id=bob["nudge"], step_id="nap").update(
        output={"crm": url, "order": f"order-{ANN['customer_id']}", "run": bob["nudge"]}
    )

    answer = erase(eraser, identifier=ANN["customer_id"])

    assert answer.status_code == 201, answer.json()
    # Her identifier whole, and her phone number as a token of its own, go.
    step = StepRow.objects.get(run_id=bob["welcome"], step_id="send")
    # A number in someone else's row is an id, a count or a time, even one with her digits.
    assert step.output == {"ref": MARKER, "sms": MARKER, "n": 442079460123}
    # Inside a URL or a longer id, in a row that does not name her, it is not hers.
    nap = StepRow.objects.get(run_id=bob["nudge"], step_id="nap")
    assert nap.output == {"crm": url, "order": f"order-{ANN['customer_id']}", "run": bob["nudge"]}
    assert bob["nudge"] not in answer.json()["runs_scrubbed"]


def test_the_strict_matcher_takes_whole_values_only() -> None:
    strict = Matcher([Value("identifier", "18999"), Value("email", "ann@x.org"),
                      Value("phone", "442079460123")], strict=True)  # fmt: skip
    document = {
        "url": "https://x.example/orders/18999", "order": "order-18999", "id": 18999,
        "ref": "18999", "18999": "key", "mail": "Write to Ann <ANN@x.org> today",
        "link": "https://x.example/u?e=ann@x.org", "joann": "joann@x.org",
        "sms": "call +44 20 7946 0123.", "path": "/t/442079460123", "tel": "+442079460123",
        "longer": "4420794601234", "run": {"id": 18999},
    }  # fmt: skip

    assert scrub_json(document, strict) == {
        "url": "https://x.example/orders/18999", "order": "order-18999", "id": 18999,
        "ref": MARKER, MARKER: "key", "mail": MARKER, "link": MARKER, "joann": "joann@x.org",
        "sms": MARKER, "path": "/t/442079460123", "tel": MARKER, "longer": "4420794601234",
        "run": {"id": 18999},
    }  # fmt: skip


def test_a_short_or_undeclared_identifier_is_refused_with_a_code(org, eraser, world) -> None:
    for short in ("5", "a", "abc", "  ab  "):
        answer = erase(eraser, identifier=short)
        assert answer.status_code == 400, answer.json()
        assert answer.json()["code"] == "identifier_too_short"
    # An organisation none of whose definitions declares personal_data.identifiers.
    other = Organisation.objects.create(slug="plain", name="Plain")
    automation_publish_definition(org=other, slug="nudge", definition=NUDGE)
    run_id = run_start(org=other, automation_slug="nudge", run_input={"contact": "cust-zed-77"},
                       start_key="zed").run_id  # fmt: skip
    _, raw = api_key_create(org=other, name="eraser", scopes=["erasure"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")

    answer = erase(client, identifier="cust-zed-77")

    assert answer.status_code == 400, answer.json()
    assert answer.json()["code"] == "identifier_not_declared"
    assert Run.objects.get(pk=run_id).input == {"contact": "cust-zed-77"}
    assert not Erasure.objects.exists()


def test_a_write_key_without_the_erasure_scope_is_refused(org, api, eraser, world) -> None:
    for body in ({"email": ANN["email"]}, {"email": ANN["email"], "dry_run": False}):
        answer = api.post("/api/v1/erasures", body, format="json")
        assert answer.status_code == 403, answer.json()
        assert answer.json()["code"] == "scope_required"
    _, raw = api_key_create(org=org, name="reader", read_only=True, scopes=["erasure"])
    reader = APIClient()
    reader.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert reader.post("/api/v1/erasures", {"email": ANN["email"]},
                       format="json").json()["code"] == "read_only_key"  # fmt: skip
    # Checked at the moment of use: a scope taken away is refused on the next request.
    ApiKey.objects.filter(name="eraser").update(scopes=[])
    assert erase(eraser, email=ANN["email"]).json()["code"] == "scope_required"
    assert not Erasure.objects.exists()
    assert hits([ANN["email"]])  # nothing was changed
    # Listing the tombstones (no value in them) is a read: any key.
    assert api.get("/api/v1/erasures").status_code == 200


def test_the_admin_needs_its_own_permission_to_erase(org, world) -> None:
    staff = User.objects.create_user("clerk", "clerk@example.invalid", "pw", is_staff=True)
    Membership.objects.create(user=staff, org=org)
    staff.user_permissions.set(
        Permission.objects.filter(content_type__app_label="workflows").exclude(
            codename="erase_person"
        )
    )
    client = Client()
    client.force_login(staff)
    url = "/admin/workflows/erasure/add/"
    form = {"org": org.pk, "kind": "email", "value": ANN["email"], "confirmed": "yes"}

    assert client.get(url).status_code == 403  # add_erasure is not enough
    assert client.post(url, form).status_code == 403
    assert not Erasure.objects.exists()
    staff.user_permissions.add(Permission.objects.get(codename="erase_person"))
    staff = User.objects.get(pk=staff.pk)  # permissions are cached per user object
    client.force_login(staff)
    assert client.get(url).status_code == 200
    assert client.post(url, form).status_code == 302
    assert Erasure.objects.get().actor_kind == "user"


def test_an_erasure_is_a_dry_run_unless_asked_otherwise(org, eraser, world) -> None:
    before = hits(ANN_TRACES)

    answer = eraser.post("/api/v1/erasures", {"email": ANN["email"]}, format="json")
    outcome = erase_person(org=org, subject=subject_of(email=ANN["email"]), actor="command:t")

    assert answer.status_code == 200, answer.json()
    assert answer.json()["dry_run"] is True and answer.json()["id"] is None
    assert outcome.dry_run is True and outcome.erasure is None
    assert answer.json()["counts"] == outcome.as_json()["counts"]
    assert hits(ANN_TRACES) == before and not Erasure.objects.exists()
    assert Run.objects.get(pk=world["ann"]["welcome"]).status == "running"


ZED = {"email": "zed@example.org", "name": "Zed Zorn", "phone": "+44 20 7946 0555",
       "customer_id": "18999"}  # fmt: skip


def test_the_audit_log_is_byte_identical_after_an_erasure(org, api, eraser, world) -> None:
    zed_run = run_start(org=org, automation_slug="refund", run_input=ZED,
                        start_key="refund:zed").run_id  # fmt: skip
    cancelled = api.post(f"/api/v1/runs/{world['bob']['nudge']}/cancel", format="json")
    assert cancelled.status_code == 200, cancelled.json()
    with transaction.atomic():  # entries whose own fields hold the run ids and the number
        record_audit(org=org, actor=Actor.system("test"), action="note.add", target_type="run",
                     target_id=zed_run, detail={"url": "https://hooks.example/in/18999",
                                                "run": zed_run, "id": "18999"})  # fmt: skip
        record_audit(org=org, actor=Actor.system("test"), action="note.add", target_type="run",
                     target_id="18999", detail={"count": 18999})  # fmt: skip
    before = audit_rows()
    assert any("18999" in row for row in before)

    answer = erase(eraser, identifier="18999")

    assert answer.status_code == 201, answer.json()
    assert answer.json()["runs_finishing"] == [zed_run]  # a refund finishes without the data
    after = audit_rows()
    assert after[: len(before)] == before  # every entry byte for byte
    (added,) = after[len(before) :]
    assert json.loads(added)["action"] == "person.erase"
    assert "18999" not in json.dumps(json.loads(added)["detail"])
    assert Run.objects.get(pk=zed_run).input["customer_id"] == MARKER
    # Nor can anything change an entry any more: the trigger has no exception for erasures.
    with (
        pytest.raises(Exception, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("SELECT set_config('waymark.audit_erasure_org', %s, true)", [str(org.pk)])
        cursor.execute("UPDATE workflows_auditentry SET detail = '{}' WHERE org_id = %s", [org.pk])


def test_a_persons_words_in_a_resolution_stay_out_of_the_audit(org, eraser, world) -> None:
    effect = Effect.objects.get(run_id=world["bob"]["welcome"])
    Effect.objects.filter(pk=effect.pk).update(state="needs_review")
    resolve_effect(effect.pk, "fail", by="admin:clerk", reason=f"{ANN['email']} asked us to stop")

    (entry,) = AuditEntry.objects.filter(action="effect.resolve")
    assert entry.detail["reason_given"] is True and ANN["email"] not in json.dumps(entry.detail)
    (event,) = RunEvent.objects.filter(kind="effect.resolved")
    assert "asked us to stop" in (event.detail or {})["reason"]  # the run's history keeps it
    assert erase(eraser, email=ANN["email"]).status_code == 201
    assert hits([ANN["email"]]) == []


def test_the_command_gives_a_key_the_erasure_scope_and_refuses_an_unknown_one(org) -> None:
    call_command("create_api_key", "--org", org.slug, "--name", "dpo", "--scope", "erasure",
                 stdout=StringIO(), stderr=StringIO())  # fmt: skip

    assert ApiKey.objects.get(name="dpo").scopes == ["erasure"]
    (created,) = AuditEntry.objects.filter(action="api_key.create")
    assert created.detail["scopes"] == ["erasure"]
    with pytest.raises(CommandError):
        call_command("create_api_key", "--org", org.slug, "--scope", "everything",
                     stdout=StringIO(), stderr=StringIO())  # fmt: skip
    with pytest.raises(InvalidInput):
        api_key_create(org=org, name="x", scopes=["everything"])


def greeting(name: str) -> str:
    return f"Dear {name}"


DECLARED = {"identifiers": ["input.customer_id"], "fields": ["input.name"], "on_erasure": "finish"}


@workflow("code-greeting", version=1, personal_data=DECLARED)
def greet_then_wait(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    said = ctx.run("greeting", greeting, run_input["name"])
    ctx.wait_signal("reply", signal="reply", correlation=run_input["order"], timeout="1d")
    return {"said": said}


def test_a_code_workflow_declares_its_personal_data_as_a_definition_does(
    org: Organisation, eraser: APIClient
) -> None:
    # The organisation's only automation is a code workflow: its declaration is the one an
    # erasure by identifier needs.
    publish_code_workflow(org=org, name="code-greeting", version=1)
    run_id, other = (
        run_start(org=org, automation_slug="code-greeting", run_input={**who, "order": order},
                  start_key=f"greeting:{order}").run_id
        for who, order in ((ANN, "o-ann"), (BOB, "o-bob"))
    )  # fmt: skip
    drive()
    assert hits([ANN["name"]]), "the scan must find her name before (else it proves nothing)"

    answer = erase(eraser, identifier=ANN["customer_id"])

    assert answer.status_code == 201, answer.json()
    assert answer.json()["runs_finishing"] == [run_id]  # on_erasure: finish
    assert hits([ANN["name"]]) == []  # her input, the ctx.run result, the decider's record
    run = Run.objects.get(pk=run_id)
    assert run.status == "running" and run.input["name"] == MARKER
    assert Run.objects.get(pk=other).input == {**BOB, "order": "o-bob"}
    # It goes on without her name: the signal it waits on ends it.
    signal_send(org=org, name="reply", correlation="o-ann", payload={})
    drive()
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert ANN["name"] not in json.dumps(run.output)


def test_a_code_workflows_personal_data_is_checked_at_registration() -> None:
    with pytest.raises(CodeWorkflowError) as refused:
        workflow("code-bad-personal", version=1,
                 personal_data={"fields": ["name"], "on_erasure": "later"})  # fmt: skip
    assert refused.value.code == "invalid_workflow"
    assert "'name' is not a path like" in refused.value.detail
    assert "on_erasure must be one of cancel, finish" in refused.value.detail


# --- a phone number's digits in ids, an address in a URL --------------------------------------

ORDERS = {"start": "nap", "steps": [{"id": "nap", "type": "wait", "duration": "1d", "next": "done"},
                                    {"id": "done", "type": "end"}]}  # fmt: skip


@pytest.mark.parametrize(
    "held", [{"order": 7946012}, {"invoice": "INV-7946012"}, {"ref": "7946012x"}]
)
def test_an_id_holding_a_phone_numbers_digits_is_not_the_persons(
    org: Organisation, eraser: APIClient, held: dict[str, Any]
) -> None:
    """A run whose definition declares nothing is the person's when a value of its input is
    their phone number: written as one (digits and separators), not a JSON number (an order
    number, a count) nor an id with letters that happens to hold the same digits."""
    automation_publish_definition(org=org, slug="orders", definition=ORDERS)
    ann = run_start(
        org=org,
        automation_slug="orders",
        start_key="ann",
        run_input={"contact": "ann@example.org", "phone": "794 6012"},
    ).run_id
    bob_input = {"contact": "bob@example.org", **held}
    bob = run_start(org=org, automation_slug="orders", start_key="bob", run_input=bob_input).run_id

    answer = erase(eraser, phone="794 6012")

    assert answer.status_code == 201, answer.json()
    assert ann in answer.json()["runs_cancelled"]
    assert bob not in answer.json()["runs_cancelled"] + answer.json()["runs_scrubbed"]
    bob_run = Run.objects.get(pk=bob)
    assert (bob_run.status, bob_run.input) == ("running", bob_input)


def test_an_address_a_template_percent_encoded_in_a_url_is_erased(
    org: Organisation, eraser: APIClient, provider_stub: Any
) -> None:
    """Her run looks her up by her address in a query string (`urlencode`): the effect's
    stored request holds it as `ann%40example.org`, the same address written whole."""
    connect(org, base_url=provider_stub.url)
    url = provider_stub.url + "/items?email={{ input.email | urlencode }}&tag=a%2Bb"
    definition = {"start": "look", "steps": [
        {"id": "look", "type": "http", "connection": "api", "next": "done",
         "request": {"method": "POST", "url": url, "body": {"n": 1}}},
        {"id": "done", "type": "end"}]}  # fmt: skip
    automation_publish_definition(org=org, slug="lookup", definition=definition)
    ann = run_start(org=org, automation_slug="lookup", start_key="k-ann",
                    run_input={"email": "ann+crm@example.org"}).run_id  # fmt: skip
    drive(lane="io")
    request = Effect.objects.get(run_id=ann).request
    assert request is not None and "ann%2Bcrm%40example.org" in request["url"]

    answer = erase(eraser, email="ann+crm@example.org")

    assert answer.status_code == 201, answer.json()
    assert ann in answer.json()["runs_scrubbed"]
    assert hits(["ann%2Bcrm%40example.org", "ann+crm@example.org"]) == []
    request = Effect.objects.get(run_id=ann).request
    assert request is not None and request["url"] == MARKER  # a string holding it
