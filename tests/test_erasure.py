"""Erasing a person: after it, no copy of their email address, phone number or name is left in
any text or JSON column of any table; other people's runs and rows are byte-for-byte as
before; their live runs are cancelled (or go on without the data where the definition says
so); a tombstone and an audit entry say what happened without the value; an unknown person
changes nothing; the API, the admin and the command all erase; and a worker whose call was
under way when the person was erased writes nothing of theirs back."""

from __future__ import annotations

import time
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import Client
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from approvals.services import content_digest
from effects.consent import suppression
from effects.models import Effect, Suppression
from effects.secrets import encrypt
from timers.models import Schedule, Timer
from webhooks.models import Delivery, Subscription
from workflows.definitions.validator import validate_definition
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim
from workflows.engine.worker import Attempt, Worker
from workflows.models import AuditEntry, Erasure, Organisation, Run, RunEvent, Signal
from workflows.plugins.audit import Actor, record_audit
from workflows.plugins.erasure import MARKER, Matcher, scrub_json
from workflows.services.automations import automation_publish_definition
from workflows.services.erasure import erase_person, subject_of
from workflows.services.erasure.scrub import Value
from workflows.services.runs import run_start
from workflows.services.tenancy import api_key_create

from .effect_setup import connect, drive
from .processes import running, spawn_worker, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ANN = {"email": "Ann.Quist@Example.org", "name": "Annabel Quist", "phone": "+44 20 7946 0123",
       "customer_id": "cust-ann-7"}  # fmt: skip
BOB = {"email": "bob.vance@example.org", "name": "Robert Vance", "phone": "+44 20 7946 0999",
       "customer_id": "cust-bob-9"}  # fmt: skip
# What must be found nowhere once Ann is erased: her address (as written and as a mailbox),
# her phone number and her name.
ANN_TRACES = [ANN["email"], ANN["email"].lower(), ANN["phone"], ANN["name"], "7946 0123"]


def welcome(url: str) -> dict[str, Any]:
    """Declared: her email identifies her; her name and phone are hers. Sends (an http effect:
    the stub's answer holds what it created), takes a reply signal, waits for another."""
    body = {"to": "{{ input.email }}", "name": "{{ input.name }}", "phone": "{{ input.phone }}"}
    return {
        "personal_data": {"identifiers": ["input.email"], "fields": ["input.name", "input.phone"]},
        "start": "send",
        "steps": [
            {"id": "send", "type": "http", "connection": "api", "next": "reply",
             "request": {"method": "POST", "url": f"{url}/items", "body": body}},
            {"id": "reply", "type": "wait_signal", "signal": "reply",
             "correlation": "{{ input.email }}", "timeout": "1d", "next": "confirm"},
            {"id": "confirm", "type": "wait_signal", "signal": "confirm",
             "correlation": "{{ input.email }}", "timeout": "1d", "next": "done"},
            {"id": "done", "type": "end", "output": "{{ input.name }} done"},
        ],
    }  # fmt: skip


REFUND: dict[str, Any] = {
    # Declared, and finishes without the data: an approval of a refund to the customer.
    "personal_data": {
        "identifiers": ["input.customer_id", "input.email"],
        "fields": ["input.name", "input.phone"],
        "on_erasure": "finish",
    },
    "start": "ask",
    "steps": [
        {"id": "ask", "type": "approval", "approvers": ["group:finance"],
         "message": "Refund {{ input.name }} ({{ input.email }})?",
         "content": {"customer": "{{ input.name }}", "phone": "{{ input.phone }}"},
         "deadline": "1d", "next": {"approved": "done", "rejected": "done", "timed_out": "done"}},
        {"id": "done", "type": "end"},
    ],
}  # fmt: skip

# Declares nothing: a run references the person when a value of its input is theirs.
NUDGE: dict[str, Any] = {
    "start": "nap",
    "steps": [
        {"id": "nap", "type": "wait", "duration": "1d", "next": "done"},
        {"id": "done", "type": "end", "output": "{{ input.contact }}"},
    ],
}


@pytest.fixture
def eraser(org: Organisation) -> APIClient:
    """A client whose key has the erasure scope (a plain write key may not erase)."""
    _, raw = api_key_create(org=org, name="eraser", scopes=["erasure"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def erase(client: APIClient, **given: Any) -> Any:
    """POST /api/v1/erasures: erasing, unless ``dry_run`` is given."""
    return client.post("/api/v1/erasures", {"dry_run": False, **given}, format="json")


def start(org: Organisation, slug: str, person: dict[str, str], key: str = "", **extra: Any) -> int:
    """A run of ``slug`` for ``person``, its start key naming them (unless ``key``)."""
    run_input = {**person, **extra}
    if slug == "nudge":
        run_input = {"contact": person["email"]}
    return run_start(org=org, automation_slug=slug, run_input=run_input,
                     start_key=key or f"{slug}:{person['email']}").run_id  # fmt: skip


@pytest.fixture
def world(org: Organisation, api: Any, provider_stub: Any) -> dict[str, Any]:
    """Ann and Bob, each with a run of every automation, their effects made, their waits
    and approvals open, signals, webhook deliveries, a timer, a suppression, an audit entry
    and a schedule that name them."""
    connect(org, base_url=provider_stub.url)
    Subscription.objects.create(
        org=org, url="https://hooks.example.org/in", secret_encrypted=encrypt("s"),
        event_types=["run.started", "run.cancelled", "approval.requested"],
    )  # fmt: skip
    for slug, definition in (("welcome", welcome(provider_stub.url)), ("refund", REFUND),
                             ("nudge", NUDGE)):  # fmt: skip
        automation_publish_definition(org=org, slug=slug, definition=definition)
    runs: dict[str, dict[str, int]] = {"ann": {}, "bob": {}}
    for who, person in (("ann", ANN), ("bob", BOB)):
        for slug in ("welcome", "refund", "nudge"):
            runs[who][slug] = start(org, slug, person)
    drive(lane="io")
    drive(lane="human")
    for person in (ANN, BOB):
        sent = api.post("/api/v1/signals", {"name": "reply", "correlation": person["email"],
                                            "payload": {"from": person["name"],
                                                        "text": f"yes, {person['phone']}"}},
                        format="json")  # fmt: skip
        assert sent.status_code in (200, 201), sent.json()
        assert sent.json()["status"] == "consumed"
    # Pending, bound to no run: a signal that names her and waits for a step that never comes.
    api.post("/api/v1/signals", {"name": "late", "correlation": ANN["email"],
                                 "payload": {"note": ANN["name"]}}, format="json")  # fmt: skip
    Suppression.objects.create(org=org, channel="email", address=ANN["email"], reason="unsub")
    Schedule.objects.create(org=org, automation_id=Run.objects.get(pk=runs["ann"]["nudge"])
                            .automation_id, name="weekly", cron="0 9 * * 1",
                            input={"contact": ANN["email"]})  # fmt: skip
    with transaction.atomic():  # the audit names her run by its id, never her
        record_audit(org=org, actor=Actor.system("test"), action="note.add", target_type="run",
                     target_id=runs["ann"]["welcome"],
                     detail={"url": f"/runs/{runs['ann']['welcome']}"})  # fmt: skip
    # Everything is where it should be: the waits and the approval open, the effects made.
    for who in ("ann", "bob"):
        assert Run.objects.get(pk=runs[who]["welcome"]).status == "running"
        assert Effect.objects.get(run_id=runs[who]["welcome"]).state == "settled"
        assert ApprovalRequest.objects.get(run_id=runs[who]["refund"]).status == "pending"
        assert Timer.objects.filter(run_id=runs[who]["nudge"]).exists()
    assert Delivery.objects.filter(run_id=runs["ann"]["welcome"]).exists()
    return runs


def text_columns() -> list[tuple[str, str]]:
    """Every text, varchar, json, jsonb and array column of every table of the schema."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.table_name, c.column_name FROM information_schema.columns c"
            "  JOIN information_schema.tables t ON t.table_schema = c.table_schema"
            "   AND t.table_name = c.table_name AND t.table_type = 'BASE TABLE'"
            " WHERE c.table_schema = current_schema()"
            "   AND c.data_type IN ('text', 'character varying', 'json', 'jsonb', 'ARRAY')"
            " ORDER BY 1, 2"
        )
        return [(row[0], row[1]) for row in cursor.fetchall()]


def hits(values: list[str]) -> list[str]:
    """Where any of ``values`` is found, as "table.column: value"."""
    found = []
    with connection.cursor() as cursor:
        for table, column in text_columns():
            for value in values:
                cursor.execute(
                    f'SELECT count(*) FROM "{table}" WHERE "{column}"::text ILIKE %s',  # noqa: S608
                    [f"%{value}%"],
                )
                if cursor.fetchone()[0]:
                    found.append(f"{table}.{column}: {value}")
    return found


def rows_of(run_ids: list[int]) -> dict[str, list[str]]:
    """Every row tied to these runs, in every table that has a run_id (and the runs), as
    text: to compare byte for byte."""
    tables = {t for t, c in text_columns()}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND column_name = 'run_id'"
        )
        with_run = sorted({row[0] for row in cursor.fetchall()} & tables)
        snapshot = {}
        for table in ["workflows_run", *with_run]:
            key = "id" if table == "workflows_run" else "run_id"
            cursor.execute(
                f'SELECT row_to_json(t)::text FROM "{table}" t WHERE {key} = ANY(%s) '  # noqa: S608
                "ORDER BY 1",
                [run_ids],
            )
            snapshot[table] = [row[0] for row in cursor.fetchall()]
    return snapshot


def test_after_erasing_no_copy_is_left_and_other_people_are_untouched(
    org, api, eraser, world
) -> None:
    assert hits(ANN_TRACES), "the scan must find her before (else it proves nothing)"
    bob_runs = sorted(world["bob"].values())
    bob_before = rows_of(bob_runs)
    bob_signals = list(Signal.objects.filter(correlation=BOB["email"]).values())

    answer = erase(eraser, email=ANN["email"].upper())

    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert hits(ANN_TRACES) == []
    assert rows_of(bob_runs) == bob_before
    assert list(Signal.objects.filter(correlation=BOB["email"]).values()) == bob_signals
    ann = world["ann"]
    # Her live runs: the declared-cancel and the undeclared one cancelled; the refund goes on.
    assert sorted(body["runs_cancelled"]) == sorted([ann["welcome"], ann["nudge"]])
    assert body["runs_finishing"] == [ann["refund"]]
    assert sorted(body["runs_scrubbed"]) == sorted(ann.values())
    for slug in ("welcome", "nudge"):
        run = Run.objects.get(pk=ann[slug])
        assert run.status == "cancelled"
        assert RunEvent.objects.filter(run=run, kind="run.cancelled").exists()
    refund = Run.objects.get(pk=ann["refund"])
    assert refund.status == "running" and refund.input["name"] == MARKER
    request = ApprovalRequest.objects.get(run=refund)
    assert request.content["content"]["customer"] == MARKER
    assert request.digest == content_digest(request.content)  # decided on what is shown now
    assert all(Run.objects.get(pk=r).status == "running" for r in world["bob"].values())
    # The tombstone and the audit entry: who, what, how much; no value.
    erasure = Erasure.objects.get(pk=body["id"])
    assert erasure.subject_kind == "email" and erasure.actor_kind == "api_key"
    assert erasure.counts == body["counts"] and erasure.counts["workflows_run.input"] == 3
    entry = AuditEntry.objects.get(action="person.erase")
    assert entry.target_id == str(erasure.pk)
    assert entry.detail["runs_cancelled"] == 2
    # Still suppressed, by the keyed hash alone.
    assert Suppression.objects.get(org=org).address.startswith("hmac-sha256:")
    with connection.cursor() as cursor:
        assert suppression(cursor, org.pk, "email", ANN["email"].lower()) == "unsub"
        assert suppression(cursor, org.pk, "email", BOB["email"]) is None
    listed = api.get("/api/v1/erasures").json()["results"]
    assert [e["id"] for e in listed] == [erasure.pk]
    # The run left to finish still can: its approval is decided, and it ends.
    decided = api.post(f"/api/v1/approvals/{request.pk}/decide", {"decision": "approve"},
                       format="json")  # fmt: skip
    assert decided.status_code == 200, decided.json()
    assert Run.objects.get(pk=ann["refund"]).status == "succeeded"
    assert hits(ANN_TRACES) == []


def test_a_dry_run_counts_what_erasing_would_change_and_keeps_nothing(org, eraser, world) -> None:
    before = hits(ANN_TRACES)
    answer = eraser.post("/api/v1/erasures", {"email": ANN["email"]}, format="json")

    assert answer.status_code == 200, answer.json()
    assert answer.json()["id"] is None and answer.json()["rows_changed"] > 0
    assert hits(ANN_TRACES) == before
    assert not Erasure.objects.exists()
    assert not AuditEntry.objects.filter(action="person.erase").exists()
    assert Run.objects.get(pk=world["ann"]["welcome"]).status == "running"
    done = erase(eraser, email=ANN["email"]).json()
    assert done["counts"] == answer.json()["counts"]


def test_an_unknown_person_is_404_and_nothing_is_written(org, eraser, world) -> None:
    audit = AuditEntry.objects.count()
    events = RunEvent.objects.count()
    for given in ({"email": "nobody@example.org"}, {"phone": "+1 555 010 9999"},
                  {"identifier": "cust-nobody"}):  # fmt: skip
        answer = erase(eraser, **given)
        assert answer.status_code == 404, answer.json()
        assert answer.json()["code"] == "unknown_person"
    assert not Erasure.objects.exists()
    assert (AuditEntry.objects.count(), RunEvent.objects.count()) == (audit, events)
    assert hits(["nobody@example.org", "cust-nobody"]) == []


@pytest.mark.parametrize(
    "given",
    [{}, {"email": "not an address"}, {"email": "a@b.org, c@d.org"}, {"phone": "12"},
     {"phone": "call me"}, {"identifier": " "}, {"email": "a@b.org", "phone": "+44 1"},
     {"email": "a@b.org", "colour": "red"}],
)  # fmt: skip
def test_bad_input_is_refused_with_a_code_and_changes_nothing(org, eraser, given) -> None:
    answer = erase(eraser, **given)

    assert answer.status_code == 400, answer.json()
    assert answer.json()["code"] in ("invalid_person", "invalid_input", "unknown_field")
    assert not Erasure.objects.exists()


def test_a_phone_or_a_declared_identifier_finds_the_same_person(org, eraser, world) -> None:
    by_id = erase(eraser, identifier=ANN["customer_id"])

    assert by_id.status_code == 201, by_id.json()
    # The refund declares the customer id; its email leads to her other runs.
    assert sorted(by_id.json()["runs_scrubbed"]) == sorted(world["ann"].values())
    assert hits([*ANN_TRACES, ANN["customer_id"]]) == []
    by_phone = erase(eraser, phone="+44 20-7946-0999")
    assert by_phone.status_code == 201, by_phone.json()
    assert world["bob"]["welcome"] in by_phone.json()["runs_scrubbed"]


def test_a_later_run_of_an_erased_person_is_not_touched_by_the_old_tombstone(
    org, eraser, world
) -> None:
    first = erase(eraser, email=ANN["email"]).json()
    again = start(org, "nudge", {**ANN, "email": "ann.quist@example.org"}, key="nudge:again")

    run = Run.objects.get(pk=again)
    assert run.status == "running" and run.input == {"contact": "ann.quist@example.org"}
    assert again not in Erasure.objects.get(pk=first["id"]).runs_scrubbed
    second = erase(eraser, email=ANN["email"]).json()
    assert second["repeat_of"] == first["id"] and second["runs_cancelled"] == [again]
    assert Erasure.objects.get(pk=first["id"]).runs_scrubbed == first["runs_scrubbed"]
    assert hits(ANN_TRACES) == []


def test_a_run_of_someone_else_that_names_them_keeps_running_without_the_value(org, world) -> None:
    referral = start(org, "welcome", BOB, key="referral", referrer=ANN["email"])  # Bob's run

    outcome = erase_person(
        org=org, subject=subject_of(email=ANN["email"]), actor="command:t", dry_run=False
    )

    run = Run.objects.get(pk=referral)
    assert referral in outcome.runs_scrubbed and referral not in outcome.runs_cancelled
    assert run.status == "running"
    assert run.input == {**BOB, "referrer": MARKER}


def test_the_admin_previews_then_erases(org, world) -> None:
    admin = User.objects.create_superuser("root", "root@example.invalid", "pw")
    client = Client()
    client.force_login(admin)
    url = "/admin/workflows/erasure/add/"
    form = {"org": org.pk, "kind": "email", "value": ANN["email"]}

    assert client.get(url).status_code == 200
    preview = client.post(url, form)
    assert preview.status_code == 200 and b"would be cancelled" in preview.content
    assert not Erasure.objects.exists()
    done = client.post(url, {**form, "confirmed": "yes"})
    assert done.status_code == 302
    erasure = Erasure.objects.get()
    assert erasure.actor_kind == "user"
    assert hits(ANN_TRACES) == []
    page = client.get(f"/admin/workflows/erasure/{erasure.pk}/change/")
    assert page.status_code == 200 and ANN["email"].encode() not in page.content
    unknown = client.post(url, {**form, "value": "nobody@example.org"})
    assert b"unknown_person" in unknown.content


def test_the_command_counts_without_yes_and_erases_with_it(org, world) -> None:
    out = StringIO()
    call_command("erase_person", "--org", org.slug, "--email", ANN["email"], stdout=out)
    assert "dry run" in out.getvalue() and not Erasure.objects.exists()

    call_command("erase_person", "--org", org.slug, "--email", ANN["email"], "--yes", stdout=out)
    assert Erasure.objects.get().actor_kind == "command"
    assert hits(ANN_TRACES) == []
    with pytest.raises(CommandError, match="unknown_person"):
        call_command("erase_person", "--org", org.slug, "--email", "nobody@example.org", "--yes")


def test_json_is_scrubbed_at_any_depth_keys_included_and_only_whole_values() -> None:
    matcher = Matcher([Value("email", "ann@x.org"), Value("phone", "442079460123")])
    document = {"to": "Ann <ANN@x.org>", "cc": ["joann@x.org", "ann@x.org.uk"],
                "ann@x.org": {"n": 442079460123, "tel": "+44 20 7946 0123", "ok": 4420794601234},
                "deep": [[{"k": "write to ann@x.org."}]], "flag": True}  # fmt: skip

    assert scrub_json(document, matcher) == {
        "to": MARKER, "cc": ["joann@x.org", "ann@x.org.uk"],
        MARKER: {"n": MARKER, "tel": MARKER, "ok": 4420794601234},
        "deep": [[{"k": MARKER}]], "flag": True,
    }  # fmt: skip
    untouched = {"a": ["b", {"c": 1}]}
    assert scrub_json(untouched, matcher) is untouched


# --- racing a real worker -----------------------------------------------------------------------


def test_a_worker_answering_after_the_erasure_writes_nothing_back(org, provider_stub) -> None:
    connect(org, base_url=provider_stub.url)
    automation_publish_definition(org=org, slug="welcome", definition=welcome(provider_stub.url))
    provider_stub.hold()
    run_id = start(org, "welcome", ANN)
    worker = spawn_worker("io", concurrency=1)
    with running(worker):
        assert provider_stub.wait_arrived(1, timeout=120)  # her data is in the call now
        effect = Effect.objects.get(run_id=run_id)
        assert effect.state == "in_flight" and ANN["email"] in str(effect.request)

        erase_person(
            org=org, subject=subject_of(email=ANN["email"]), actor="command:t", dry_run=False
        )
        provider_stub.release()
        # The provider answers with her data (it echoes what it created); the worker then
        # tries to record the answer and settle the step. Once it has exited (SIGTERM: it
        # finishes what it holds within its grace), whatever it was to write is written.
        wait_for(lambda: provider_stub.created, what="the provider created the item")
        assert stop(worker, timeout=60) == 0

    assert hits(ANN_TRACES) == []
    effect.refresh_from_db()
    assert (effect.state, effect.result) == ("outcome_unknown", None)
    assert Run.objects.get(pk=run_id).status == "cancelled"


def test_an_attempt_that_began_before_the_erasure_claims_no_effect_after_it(
    org, provider_stub
) -> None:
    connect(org, base_url=provider_stub.url)
    automation_publish_definition(org=org, slug="welcome", definition=welcome(provider_stub.url))
    run_id = start(org, "welcome", ANN)
    worker = Worker(lane_policy("io"), concurrency=1, name="test-worker")
    (step,) = claim(policy=worker.policy, worker=worker.name, limit=1)  # read her data

    erase_person(org=org, subject=subject_of(email=ANN["email"]), actor="command:t", dry_run=False)
    attempt: Attempt | None = Attempt(step, deadline=time.monotonic() + 60,
                                      extended=time.monotonic())  # fmt: skip
    while attempt is not None:
        attempt = worker._execute(attempt)

    assert not Effect.objects.filter(run_id=run_id).exists()
    assert provider_stub.created == []  # nothing was called
    assert hits(ANN_TRACES) == []


def test_the_validator_checks_the_personal_data_declaration() -> None:
    good = {**NUDGE, "personal_data": {"identifiers": ["input.contact"],
                                       "fields": ["vars.x", "outputs.nap.y"],
                                       "on_erasure": "finish"}}  # fmt: skip
    assert validate_definition(good) == []
    bad = {**NUDGE, "personal_data": {"identifiers": ["vars.x", 3], "fields": "input.name",
                                      "on_erasure": "later", "keep": True}}  # fmt: skip
    issues = {(i.code, i.field) for i in validate_definition(bad)}
    assert issues == {
        ("invalid_field", "personal_data.identifiers"),
        ("invalid_field", "personal_data.fields"),
        ("invalid_field", "personal_data.on_erasure"),
        ("unknown_field", "personal_data.keep"),
    }
    assert validate_definition({**NUDGE, "personal_data": []})[0].field == "personal_data"


# --- what a found identifier leads to, and what it never rewrites ----------------------------

WAITS_A_DAY = [{"id": "nap", "type": "wait", "duration": "1d", "next": "done"},
               {"id": "done", "type": "end"}]  # fmt: skip


def test_an_identifier_two_people_share_leads_to_neither_one_s_other_runs(
    org: Organisation, eraser: APIClient
) -> None:
    """Ann's run names a joint account she shares with Bob: his joint run is found by it, but
    what his run names (his own email) leads nowhere: his run of another automation, which
    holds nothing of Ann's, is untouched (it was cancelled and scrubbed as hers)."""
    joint = {"personal_data": {"identifiers": ["input.account", "input.email"],
                               "fields": ["input.name"]},
             "start": "nap", "steps": WAITS_A_DAY}  # fmt: skip
    solo = {"personal_data": {"identifiers": ["input.email"], "fields": ["input.name"]},
            "start": "nap", "steps": WAITS_A_DAY}  # fmt: skip
    automation_publish_definition(org=org, slug="joint", definition=joint)
    automation_publish_definition(org=org, slug="solo", definition=solo)
    account = {"account": "acct-joint-77"}
    ann_joint = run_start(org=org, automation_slug="joint", start_key="j-ann",
                          run_input={**ANN, **account}).run_id  # fmt: skip
    bob_joint = run_start(org=org, automation_slug="joint", start_key="j-bob",
                          run_input={**BOB, **account}).run_id  # fmt: skip
    bob_solo = run_start(org=org, automation_slug="solo", start_key="s-bob",
                         run_input=BOB).run_id  # fmt: skip
    before = rows_of([bob_solo])
    answer = erase(eraser, email=ANN["email"])
    assert answer.status_code == 201, answer.json()
    assert {ann_joint, bob_joint} <= set(answer.json()["runs_cancelled"])
    assert bob_solo not in answer.json()["runs_cancelled"] + answer.json()["runs_scrubbed"]
    assert rows_of([bob_solo]) == before
    assert Run.objects.get(pk=bob_solo).status == "running"


def test_a_numeric_identifier_never_rewrites_the_engine_s_own_numbers(
    org: Organisation, eraser: APIClient
) -> None:
    """A customer id that happens to equal a row id the run's outputs keep for the engine
    (a re-run's cut, under "~replay"): the person's values go, the cut stays (it was
    rewritten as text, and the run's next turn failed on it, the run running for ever)."""
    definition = {"personal_data": {"identifiers": ["input.customer_id"],
                                    "fields": ["input.name"], "on_erasure": "finish"},
                  "start": "nap", "steps": WAITS_A_DAY}  # fmt: skip
    automation_publish_definition(org=org, slug="numbered", definition=definition)
    run_id = run_start(org=org, automation_slug="numbered", start_key="n-ann",
                       run_input={"customer_id": "48203", "name": ANN["name"]}).run_id  # fmt: skip
    cuts = [{"after_row": 48203, "kept": 1}]
    Run.objects.filter(pk=run_id).update(outputs={"~replay": cuts, "note": {"id": 48203}})
    answer = erase(eraser, identifier="48203")
    assert answer.status_code == 201, answer.json()
    run = Run.objects.get(pk=run_id)
    assert run.outputs["~replay"] == cuts  # the engine's: kept as it was
    assert run.outputs["note"] == {"id": MARKER}  # a step's output: the person's value goes
    assert ANN["name"] not in str(run.input)
