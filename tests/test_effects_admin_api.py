"""Connections, suppressions and the effect ledger through the API and the admin: secrets are
write-only, every organisation sees only its own, read-only keys cannot write, bad input is
a 400 or a form error (never a 500), and a person's resolution of an effect in review is
recorded in the run's history and moves the effect on."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from effects.admin import ConnectionForm, ModelBudgetForm
from effects.models import Connection, Effect, EgressAllow, ModelBudget, Suppression
from effects.secrets import decrypt, encrypt
from workflows.models import AuditEntry, Membership, Organisation, Run, RunEvent
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start
from workflows.services.tenancy import api_key_create

from .factories import IO_DEFINITION, OrganisationFactory

pytestmark = pytest.mark.django_db

SECRET = "sk-live-Pl41nT3xt-never-shown-0042"
NEW_SECRET = "sk-live-R0tat3d-never-shown-0043"
ADMIN = "/admin/effects"


# --- fixtures ---------------------------------------------------------------------------------


def client_for(org: Organisation, *, read_only: bool = False) -> APIClient:
    _, raw = api_key_create(org=org, name="reader" if read_only else "writer", read_only=read_only)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def start_run(org: Organisation) -> Run:
    """A run of the io definition: it stays running (no worker runs here)."""
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    started = run_start(org=org, automation_slug="io", run_input={}, start_key="k")
    return Run.objects.get(pk=started.run_id)


def in_review(run: Run, *, step_id: str = "work", state: str = "needs_review") -> Effect:
    """An effect parked for a person: a call was made and its outcome is unknown."""
    now = timezone.now()
    return Effect.objects.create(
        org_id=run.org_id, run=run, step_id=step_id, iteration=0,
        key=f"{run.pk}/{step_id}/0", provider="http", state=state, calls=2,
        first_attempt_at=now, last_attempt_at=now,
        request={"method": "POST", "url": "https://crm.example/contacts"},
        last_response={"status": 502, "body": "bad gateway"},
        error="the provider failed (502): it may have acted",
    )  # fmt: skip


def make_connection(org: Organisation, name: str = "crm", **fields: Any) -> Connection:
    values: dict[str, Any] = {"provider": "http", "secret_encrypted": encrypt(SECRET)} | fields
    return Connection.objects.create(org=org, name=name, **values)


def staff_user(username: str, *orgs: Organisation, codenames: tuple[str, ...] = ()) -> User:
    """A staff member of ``orgs`` with every permission on the effects app, or only those
    named by ``codenames``."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    perms = Permission.objects.filter(content_type__app_label="effects")
    user.user_permissions.set(perms.filter(codename__in=codenames) if codenames else perms)
    for org in orgs:
        Membership.objects.create(user=user, org=org)
    return user


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def resolved_events(effect: Effect) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=effect.run_id, kind="effect.resolved"))


def details(effect: Effect) -> list[dict[str, Any]]:
    """The detail of each effect.resolved event of the effect's run, in order."""
    found = []
    for event in resolved_events(effect):
        assert isinstance(event.detail, dict)
        found.append(event.detail)
    return found


@pytest.fixture
def writer(org: Organisation) -> APIClient:
    return client_for(org)


@pytest.fixture
def reader(org: Organisation) -> APIClient:
    return client_for(org, read_only=True)


@pytest.fixture
def run(org: Organisation) -> Run:
    return start_run(org)


@pytest.fixture
def their_run(other_org: Organisation) -> Run:
    return start_run(other_org)


# --- connections: the secret is write-only ----------------------------------------------------


def assert_no_secret(body: bytes | str, *secrets: str) -> None:
    text = body.decode() if isinstance(body, bytes) else body
    for secret in secrets:
        assert secret not in text
    assert "secret_encrypted" not in text


def test_a_connection_is_created_with_a_secret_that_is_never_returned(
    writer: APIClient, org: Organisation
) -> None:
    body = {"name": "crm", "provider": "http", "base_url": "https://crm.example",
            "options": {"auth_scheme": "Token"}, "secret": SECRET, "max_concurrency": 2,
            "timeout_seconds": 5}  # fmt: skip

    created = writer.post("/api/v1/connections", body, format="json")

    assert created.status_code == 201, created.content
    answer = created.json()
    assert answer["has_secret"] is True and "secret" not in answer
    assert answer["max_concurrency"] == 2 and answer["status"] == "ok"
    conn = Connection.objects.get(org=org, name="crm")
    assert conn.secret_encrypted and SECRET not in conn.secret_encrypted
    assert decrypt(conn.secret_encrypted) == SECRET
    pages = [
        created,
        writer.get("/api/v1/connections"),
        writer.get("/api/v1/connections/crm"),
        writer.patch("/api/v1/connections/crm", {"max_concurrency": 3}, format="json"),
        writer.post("/api/v1/connections/crm/repair"),
    ]
    for page in pages:
        assert page.status_code == 200 or page.status_code == 201, page.content
        assert_no_secret(page.content, SECRET, conn.secret_encrypted)
    assert writer.get("/api/v1/connections").json()["results"][0]["name"] == "crm"


def test_a_connection_without_a_secret_says_so(writer: APIClient) -> None:
    created = writer.post(
        "/api/v1/connections", {"name": "public", "provider": "http"}, format="json"
    )

    assert created.status_code == 201, created.content
    assert created.json()["has_secret"] is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "crm", "provider": "fax"}, "provider"),
        ({"name": "crm"}, "provider"),
        ({"name": "has space", "provider": "http"}, "name"),
        ({"name": "crm", "provider": "http", "options": ["not", "an", "object"]}, "options"),
        ({"name": "crm", "provider": "http", "max_concurrency": 0}, "max_concurrency"),
        # Past what the operator allows a tenant (WAYMARK_EFFECTS_MAX_*, 64 and 120 s).
        ({"name": "crm", "provider": "http", "max_concurrency": 10_000}, "max_concurrency"),
        ({"name": "crm", "provider": "http", "timeout_seconds": 3600}, "timeout_seconds"),
        ({"name": "crm", "provider": "http", "timeout_seconds": "nan"}, "timeout_seconds"),
        # A whole number past what a float holds: 400, not an OverflowError's 500.
        ({"name": "crm", "provider": "http", "timeout_seconds": 10**400}, "timeout_seconds"),
        ({"name": "crm", "provider": "http", "secret": ""}, "secret"),
        ({"name": "crm", "provider": "http", "max_concurency": 2}, "max_concurency"),
    ],
)
def test_bad_connection_input_is_a_400_naming_the_field(
    writer: APIClient, body: dict[str, Any], field: str
) -> None:
    refused = writer.post("/api/v1/connections", body, format="json")

    assert refused.status_code == 400, refused.content
    assert refused.json()["code"] == "invalid_input"
    assert field in refused.json()["errors"]
    assert not Connection.objects.exists()


def test_an_unknown_provider_lists_the_known_ones(writer: APIClient) -> None:
    refused = writer.post("/api/v1/connections", {"name": "crm", "provider": "fax"}, format="json")

    (message,) = refused.json()["errors"]["provider"]
    assert "'fax'" in message and "http" in message and "email" in message


def test_text_postgresql_cannot_store_is_a_400(writer: APIClient) -> None:
    body = '{"name": "crm", "provider": "http", "secret": "a\\ud800b"}'  # a lone surrogate

    refused = writer.post("/api/v1/connections", body, content_type="application/json")

    assert refused.status_code == 400, refused.content
    assert "secret" in refused.json()["errors"]
    assert not Connection.objects.exists()


def test_a_body_that_is_not_an_object_or_not_json_is_a_400(writer: APIClient) -> None:
    listed = writer.post("/api/v1/connections", ["crm"], format="json")
    broken = writer.post("/api/v1/connections", "{", content_type="application/json")

    assert (listed.status_code, listed.json()["code"]) == (400, "invalid_input")
    assert (broken.status_code, broken.json()["code"]) == (400, "malformed_request")


def test_a_taken_name_is_a_409(writer: APIClient, org: Organisation) -> None:
    make_connection(org, "crm")

    refused = writer.post(
        "/api/v1/connections", {"name": "crm", "provider": "email"}, format="json"
    )

    assert refused.status_code == 409
    assert refused.json()["code"] == "already_exists" and refused.json()["name"] == "crm"
    assert Connection.objects.get(org=org, name="crm").provider == "http"


def test_patching_a_new_secret_repairs_a_broken_connection(
    writer: APIClient, org: Organisation
) -> None:
    conn = make_connection(org, status="broken", broken_reason="reconnect crm: 401",
                           broken_at=timezone.now(), circuit="open")  # fmt: skip

    patched = writer.patch("/api/v1/connections/crm", {"secret": NEW_SECRET}, format="json")

    assert patched.status_code == 200, patched.content
    assert patched.json()["status"] == "ok" and patched.json()["broken_reason"] == ""
    assert_no_secret(patched.content, SECRET, NEW_SECRET)
    conn.refresh_from_db()
    assert (conn.status, conn.circuit) == ("ok", "closed")
    assert decrypt(conn.secret_encrypted) == NEW_SECRET


def test_patching_settings_keeps_the_secret_and_a_broken_connection_broken(
    writer: APIClient, org: Organisation
) -> None:
    conn = make_connection(org, status="broken", broken_reason="reconnect crm: 401")

    patched = writer.patch("/api/v1/connections/crm", {"timeout_seconds": 9}, format="json")

    assert patched.status_code == 200, patched.content
    conn.refresh_from_db()
    assert (conn.timeout_seconds, conn.status) == (9.0, "broken")
    assert decrypt(conn.secret_encrypted) == SECRET


@pytest.mark.parametrize("field", ["name", "provider"])
def test_a_connections_name_and_provider_cannot_be_patched(
    writer: APIClient, org: Organisation, field: str
) -> None:
    make_connection(org)

    refused = writer.patch("/api/v1/connections/crm", {field: "email"}, format="json")

    assert refused.status_code == 400
    assert "Cannot be changed" in refused.json()["errors"][field][0]
    assert Connection.objects.get(org=org).name == "crm"


def test_checking_a_broken_connection_that_works_repairs_it(
    writer: APIClient, org: Organisation
) -> None:
    # An http connection without a URL has nothing to probe: the check passes at once.
    make_connection(org, status="broken", broken_reason="reconnect crm: 401")

    checked = writer.post("/api/v1/connections/crm/check")

    assert checked.status_code == 200, checked.content
    assert checked.json()["result"] == "ok" and checked.json()["status"] == "ok"
    assert checked.json()["checked_at"] is not None
    assert Connection.objects.get(org=org).status == "ok"


def test_repair_and_delete(writer: APIClient, org: Organisation) -> None:
    make_connection(org, status="broken", broken_reason="reconnect crm: 401")

    repaired = writer.post("/api/v1/connections/crm/repair/")  # with a trailing slash too
    deleted = writer.delete("/api/v1/connections/crm")

    assert repaired.status_code == 200
    assert repaired.json() == {"name": "crm", "status": "ok", "woken": 0}
    assert deleted.status_code == 204
    assert not Connection.objects.exists()
    assert writer.get("/api/v1/connections/crm").json()["code"] == "unknown_connection"


# --- suppressions -----------------------------------------------------------------------------


def test_a_suppression_is_stored_lowercased_and_a_duplicate_is_a_409(
    writer: APIClient, org: Organisation
) -> None:
    body = {"channel": "email", "address": "  Ann@Example.COM ", "reason": "bounced"}
    created = writer.post("/api/v1/suppressions", body, format="json")
    again = writer.post(
        "/api/v1/suppressions", {"channel": "email", "address": "ann@example.com"}, format="json"
    )

    assert created.status_code == 201, created.content
    assert created.json()["address"] == "ann@example.com"
    assert again.status_code == 409
    assert again.json()["code"] == "already_exists"
    assert again.json()["id"] == created.json()["id"]
    assert Suppression.objects.get(org=org).reason == "bounced"


def test_a_suppression_written_with_a_name_is_stored_as_its_mailbox_and_found_so(
    writer: APIClient, org: Organisation
) -> None:
    body = {"channel": "email", "address": 'Ann <"Ann"@Example.COM>'}
    created = writer.post("/api/v1/suppressions", body, format="json")
    again = writer.post("/api/v1/suppressions", {"channel": "email", "address": "ann@example.com"},
                        format="json")  # fmt: skip
    found = writer.get("/api/v1/suppressions?address=<ANN@example.com>").json()["results"]

    assert created.status_code == 201, created.content
    assert created.json()["address"] == "ann@example.com"
    assert again.status_code == 409
    assert [s["id"] for s in found] == [created.json()["id"]]


def test_suppressions_are_listed_filtered_and_deleted(writer: APIClient, org: Organisation) -> None:
    email = writer.post(
        "/api/v1/suppressions", {"channel": "email", "address": "a@x.example"}, format="json"
    )
    writer.post("/api/v1/suppressions", {"address": "b@x.example"}, format="json")  # "any"

    listed = writer.get("/api/v1/suppressions?channel=email").json()["results"]
    by_address = writer.get("/api/v1/suppressions?address=B@X.example").json()["results"]
    deleted = writer.delete(f"/api/v1/suppressions/{email.json()['id']}")

    assert [s["address"] for s in listed] == ["a@x.example"]
    assert [(s["address"], s["channel"]) for s in by_address] == [("b@x.example", "any")]
    assert deleted.status_code == 204
    assert list(Suppression.objects.values_list("address", flat=True)) == ["b@x.example"]


@pytest.mark.parametrize(
    "body", [{"channel": "fax", "address": "a@x.example"}, {"address": ""}, {"reason": "no"}]
)
def test_bad_suppression_input_is_a_400(writer: APIClient, body: dict[str, str]) -> None:
    refused = writer.post("/api/v1/suppressions", body, format="json")

    assert refused.status_code == 400 and refused.json()["code"] == "invalid_input"
    assert not Suppression.objects.exists()


NOT_AN_EMAIL_ADDRESS = [
    ("email", "not-an-email"),
    ("email", "a@b@c.example"),
    ("email", "ann@"),
    ("email", "Ann <ann@x.example>, Bob <bob@x.example>"),
    ("any", "a@b@c.example"),
    ("any", "ann@"),
]


@pytest.mark.parametrize(("channel", "address"), NOT_AN_EMAIL_ADDRESS)
def test_a_suppression_that_needs_an_email_address_and_has_none_is_a_400_naming_it(
    writer: APIClient, channel: str, address: str
) -> None:
    # Kept, it would match no recipient: a send checks the mailbox a recipient names.
    refused = writer.post("/api/v1/suppressions", {"channel": channel, "address": address},
                          format="json")  # fmt: skip

    assert refused.status_code == 400, refused.content
    assert refused.json()["code"] == "invalid_input"
    assert list(refused.json()["errors"]) == ["address"]
    assert "one email address" in refused.json()["errors"]["address"][0]
    assert not Suppression.objects.exists()


@pytest.mark.parametrize(("channel", "address"), [("any", "C0123ABC"), ("slack", "#General"),
                                                  ("any", "Ann <ann@x.example>")])  # fmt: skip
def test_a_slack_channel_or_an_email_address_is_taken_where_the_channel_allows_it(
    writer: APIClient, channel: str, address: str
) -> None:
    created = writer.post("/api/v1/suppressions", {"channel": channel, "address": address},
                          format="json")  # fmt: skip

    assert created.status_code == 201, created.content


# --- effects and their resolution through the API ---------------------------------------------


def test_effects_are_listed_by_state_and_run(
    writer: APIClient, org: Organisation, run: Run
) -> None:
    waiting = in_review(run)
    settled = in_review(run, step_id="other", state="settled")
    another_run = run_start(org=org, automation_slug="io", run_input={}, start_key="k2")
    elsewhere = in_review(Run.objects.get(pk=another_run.run_id))

    in_state = writer.get("/api/v1/effects?state=needs_review").json()["results"]
    of_run = writer.get(f"/api/v1/effects?run={run.pk}").json()["results"]
    both = writer.get(f"/api/v1/effects?state=needs_review&run={run.pk}").json()["results"]

    assert {e["id"] for e in in_state} == {waiting.pk, elsewhere.pk}
    assert {e["id"] for e in of_run} == {waiting.pk, settled.pk}
    assert [e["id"] for e in both] == [waiting.pk]
    assert both[0]["key"] == waiting.key and both[0]["run"] == run.pk
    assert both[0]["last_response"] == {"status": 502, "body": "bad gateway"}


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("state=done", "invalid_input"),
        ("run=abc", "invalid_input"),
        ("stat=needs_review", "invalid_query"),
        ("limit=0", "invalid_query"),
        ("cursor=bogus", "invalid_input"),
    ],
)
def test_bad_effect_filters_are_refused(writer: APIClient, query: str, code: str) -> None:
    refused = writer.get(f"/api/v1/effects?{query}")

    assert refused.status_code == 400, refused.content
    assert refused.json()["code"] == code


def test_resolving_done_through_the_api_settles_it_and_records_the_event(
    writer: APIClient, run: Run
) -> None:
    effect = in_review(run)

    answer = writer.post(
        f"/api/v1/effects/{effect.pk}/resolve",
        {"action": "done", "result": {"id": "c_17"}, "reason": "found it in the CRM"},
        format="json",
    )

    assert answer.status_code == 200, answer.content
    assert answer.json()["state"] == "settled" and answer.json()["result"] == {"id": "c_17"}
    effect.refresh_from_db()
    assert (effect.state, effect.result) == ("settled", {"id": "c_17"})
    assert effect.resolved_by.startswith("api_key:")
    (detail,) = details(effect)
    assert detail["action"] == "done" and detail["key"] == effect.key
    assert detail["reason"] == "found it in the CRM"
    assert detail["by"] == effect.resolved_by


@pytest.mark.parametrize("action", ["retry", "fail"])
def test_retry_and_fail_through_the_api_leave_it_failed(
    writer: APIClient, run: Run, action: str
) -> None:
    effect = in_review(run)

    answer = writer.post(
        f"/api/v1/effects/{effect.pk}/resolve/", {"action": action, "reason": "dup"}, format="json"
    )

    assert answer.status_code == 200, answer.content
    effect.refresh_from_db()
    assert effect.state == "failed"
    assert ("dup" in effect.error) is (action == "fail")
    assert [d["action"] for d in details(effect)] == [action]


def test_resolving_an_effect_not_in_review_is_a_409(writer: APIClient, run: Run) -> None:
    effect = in_review(run, state="settled")

    refused = writer.post(
        f"/api/v1/effects/{effect.pk}/resolve", {"action": "retry"}, format="json"
    )

    assert refused.status_code == 409
    assert refused.json()["code"] == "not_in_review"
    assert resolved_events(effect) == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "done"}, "result"),
        ({"action": "done", "result": None}, "result"),
        ({"action": "retry", "result": {"id": 1}}, "result"),
        ({"action": "undo"}, "action"),
        ({"action": "done", "result": {"a": "nul\u0000"}}, "result"),
        ({"action": "fail", "reason": "x" * 501}, "reason"),
        ({"action": "fail", "why": "typo"}, "why"),
    ],
)
def test_a_bad_resolution_is_a_400_and_changes_nothing(
    writer: APIClient, run: Run, body: dict[str, Any], field: str
) -> None:
    effect = in_review(run)

    refused = writer.post(f"/api/v1/effects/{effect.pk}/resolve", body, format="json")

    assert refused.status_code == 400, refused.content
    assert refused.json()["code"] == "invalid_input" and field in refused.json()["errors"]
    effect.refresh_from_db()
    assert effect.state == "needs_review" and resolved_events(effect) == []


def test_a_result_nested_too_deeply_is_a_400(writer: APIClient, run: Run) -> None:
    effect = in_review(run)
    deep: Any = "bottom"
    for _ in range(40):
        deep = [deep]

    refused = writer.post(
        f"/api/v1/effects/{effect.pk}/resolve", {"action": "done", "result": deep}, format="json"
    )

    assert refused.status_code == 400 and "nests deeper" in refused.json()["errors"]["result"][0]
    effect.refresh_from_db()
    assert effect.state == "needs_review"


# --- organisations and read-only keys ---------------------------------------------------------


def test_another_organisations_objects_are_not_found_and_left_alone(
    writer: APIClient, other_org: Organisation, their_run: Run
) -> None:
    conn = make_connection(other_org, "theirs", status="broken", broken_reason="401")
    suppression = Suppression.objects.create(org=other_org, address="x@theirs.example")
    effect = in_review(their_run)
    attempts = [
        ("get", "/api/v1/connections/theirs", None),
        ("patch", "/api/v1/connections/theirs", {"secret": NEW_SECRET}),
        ("delete", "/api/v1/connections/theirs", None),
        ("post", "/api/v1/connections/theirs/check", None),
        ("post", "/api/v1/connections/theirs/repair", None),
        ("get", f"/api/v1/suppressions/{suppression.pk}", None),
        ("delete", f"/api/v1/suppressions/{suppression.pk}", None),
        ("get", f"/api/v1/effects/{effect.pk}", None),
        ("post", f"/api/v1/effects/{effect.pk}/resolve", {"action": "done", "result": 1}),
    ]

    for method, url, body in attempts:
        response = getattr(writer, method)(url, body, format="json")
        assert response.status_code == 404, (method, url, response.content)
        assert response.json()["code"].startswith("unknown_"), (method, url)

    for listing in ("connections", "suppressions", "effects"):
        assert writer.get(f"/api/v1/{listing}").json()["results"] == [], listing
    conn.refresh_from_db()
    effect.refresh_from_db()
    assert (conn.status, decrypt(conn.secret_encrypted)) == ("broken", SECRET)
    assert Suppression.objects.filter(pk=suppression.pk).exists()
    assert effect.state == "needs_review" and resolved_events(effect) == []


def test_a_read_only_key_reads_and_cannot_write(
    reader: APIClient, org: Organisation, run: Run
) -> None:
    make_connection(org, status="broken", broken_reason="401")
    suppression = Suppression.objects.create(org=org, address="a@x.example")
    effect = in_review(run)
    for url in ("/api/v1/connections", "/api/v1/connections/crm", "/api/v1/suppressions",
                f"/api/v1/effects/{effect.pk}", "/api/v1/effects?state=needs_review"):  # fmt: skip
        assert reader.get(url).status_code == 200, url
    writes = [
        ("post", "/api/v1/connections", {"name": "new", "provider": "http"}),
        ("patch", "/api/v1/connections/crm", {"secret": NEW_SECRET}),
        ("delete", "/api/v1/connections/crm", None),
        ("post", "/api/v1/connections/crm/check", None),
        ("post", "/api/v1/connections/crm/repair", None),
        ("post", "/api/v1/suppressions", {"address": "b@x.example"}),
        ("delete", f"/api/v1/suppressions/{suppression.pk}", None),
        ("post", f"/api/v1/effects/{effect.pk}/resolve", {"action": "retry"}),
    ]

    for method, url, body in writes:
        response = getattr(reader, method)(url, body, format="json")
        assert response.status_code == 403, (method, url)
        assert response.json()["code"] == "read_only_key", (method, url)

    conn = Connection.objects.get(org=org)
    assert (conn.status, decrypt(conn.secret_encrypted)) == ("broken", SECRET)
    assert list(Suppression.objects.values_list("address", flat=True)) == ["a@x.example"]
    effect.refresh_from_db()
    assert effect.state == "needs_review"


def test_the_endpoints_are_in_the_schema_without_their_slash_forms() -> None:
    schema = APIClient().get("/api/v1/schema/?format=json").json()
    paths = schema["paths"]

    assert set(paths["/api/v1/connections"]) == {"get", "post"}
    assert set(paths["/api/v1/connections/{name}"]) == {"get", "patch", "delete"}
    assert set(paths["/api/v1/connections/{name}/check"]) == {"post"}
    assert set(paths["/api/v1/connections/{name}/repair"]) == {"post"}
    assert set(paths["/api/v1/suppressions"]) == {"get", "post"}
    assert set(paths["/api/v1/suppressions/{suppression_id}"]) == {"get", "delete"}
    assert set(paths["/api/v1/effects"]) == {"get"}
    assert set(paths["/api/v1/effects/{effect_id}"]) == {"get"}
    assert set(paths["/api/v1/effects/{effect_id}/resolve"]) == {"post"}
    assert "/api/v1/effects/" not in paths
    listed = {p["name"] for p in paths["/api/v1/effects"]["get"]["parameters"]}
    assert {"state", "run", "cursor", "limit"} <= listed
    components = schema["components"]["schemas"]
    assert "secret" not in components["ConnectionOut"]["properties"]
    assert components["ConnectionIn"]["properties"]["secret"]["writeOnly"] is True
    assert "ActionEnum" in components  # the runs API's enum keeps its name


# --- the admin: connections -------------------------------------------------------------------


def connection_form(org: Organisation, **overrides: str) -> dict[str, str]:
    return {"org": str(org.pk), "name": "crm", "provider": "http", "base_url": "",
            "options": "{}", "secret": SECRET, "max_concurrency": "4",
            "timeout_seconds": "30"} | overrides  # fmt: skip


def test_the_admin_stores_the_secret_encrypted_and_never_shows_it(
    admin_client: Client, org: Organisation
) -> None:
    added = admin_client.post(f"{ADMIN}/connection/add/", connection_form(org))

    assert added.status_code == 302, added.content.decode()
    conn = Connection.objects.get(org=org, name="crm")
    assert decrypt(conn.secret_encrypted) == SECRET
    for url in (f"{ADMIN}/connection/", f"{ADMIN}/connection/{conn.pk}/change/",
                f"{ADMIN}/connection/add/"):  # fmt: skip
        page = admin_client.get(url)
        assert page.status_code == 200, url
        html = page.content.decode()
        assert SECRET not in html and conn.secret_encrypted not in html, url
    change = admin_client.get(f"{ADMIN}/connection/{conn.pk}/change/").content.decode()
    assert 'type="password" name="secret"' in change
    assert 'name="secret" value=' not in change  # never filled in again


def test_saving_the_admin_form_without_a_secret_keeps_the_current_one(
    admin_client: Client, org: Organisation
) -> None:
    conn = make_connection(org, base_url="https://crm.example/v1")
    # (The same origin: settings that would send the secret elsewhere need it again,
    # tests/test_connection_secret_destination.py.)
    form = {"base_url": "https://crm.example", "options": '{"auth_scheme": "Token"}',
            "secret": "", "max_concurrency": "2", "timeout_seconds": "10"}  # fmt: skip

    saved = admin_client.post(f"{ADMIN}/connection/{conn.pk}/change/", form)

    assert saved.status_code == 302, saved.content.decode()
    conn.refresh_from_db()
    assert decrypt(conn.secret_encrypted) == SECRET
    assert (conn.base_url, conn.options, conn.max_concurrency) == (
        "https://crm.example", {"auth_scheme": "Token"}, 2,
    )  # fmt: skip


def test_saving_a_connection_keeps_the_health_the_engine_wrote_meanwhile(
    admin_client: Client, org: Organisation, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = make_connection(org)
    clean = ConnectionForm.clean_max_concurrency

    def circuit_opens_meanwhile(form: ConnectionForm) -> int:
        Connection.objects.filter(pk=conn.pk).update(circuit="open", consecutive_failures=5)
        return clean(form)

    monkeypatch.setattr(ConnectionForm, "clean_max_concurrency", circuit_opens_meanwhile)
    form = {"base_url": "", "options": "{}", "secret": "", "max_concurrency": "7",
            "timeout_seconds": "30"}  # fmt: skip

    saved = admin_client.post(f"{ADMIN}/connection/{conn.pk}/change/", form)

    assert saved.status_code == 302
    conn.refresh_from_db()
    assert (conn.max_concurrency, conn.circuit, conn.consecutive_failures) == (7, "open", 5)


def test_a_new_secret_in_the_admin_repairs_a_broken_connection(
    admin_client: Client, org: Organisation
) -> None:
    conn = make_connection(org, status="broken", broken_reason="reconnect crm: 401 from CRM",
                           broken_at=timezone.now())  # fmt: skip
    page = admin_client.get(f"{ADMIN}/connection/{conn.pk}/change/").content.decode()
    assert 'id="connection-broken"' in page and "reconnect crm: 401 from CRM" in page
    listing = admin_client.get(f"{ADMIN}/connection/").content.decode()
    assert "connection-broken" in listing and "reconnect crm: 401 from CRM" in listing
    form = {"base_url": "", "options": "{}", "secret": NEW_SECRET, "max_concurrency": "4",
            "timeout_seconds": "30"}  # fmt: skip

    saved = admin_client.post(f"{ADMIN}/connection/{conn.pk}/change/", form, follow=True)

    assert saved.status_code == 200
    conn.refresh_from_db()
    assert (conn.status, conn.broken_reason) == ("ok", "")
    assert decrypt(conn.secret_encrypted) == NEW_SECRET
    assert any("repaired with the new secret" in m for m in messages_of(saved))
    assert NEW_SECRET not in saved.content.decode()


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"provider": "fax"}, "Select a valid choice"),
        ({"options": "[1, 2]"}, "JSON object"),
        ({"options": "{not json"}, "Enter a valid JSON"),
        ({"options": "[" * 5000 + "]" * 5000}, "nests too deeply"),
        ({"name": "has space"}, "letters, digits"),
        ({"max_concurrency": "0"}, "At least 1"),
        ({"max_concurrency": "10000"}, "At most 64"),
        ({"timeout_seconds": "3600"}, "At most 120"),
    ],
)
def test_bad_connection_forms_are_form_errors(
    admin_client: Client, org: Organisation, overrides: dict[str, str], error: str
) -> None:
    page = admin_client.post(f"{ADMIN}/connection/add/", connection_form(org, **overrides))

    assert page.status_code == 200
    assert error in page.content.decode()
    assert SECRET not in page.content.decode()  # not even back in the form with its errors
    assert not Connection.objects.exists()


def test_the_admin_actions_check_and_repair_connections(
    admin_client: Client, org: Organisation
) -> None:
    broken = make_connection(org, "broken", status="broken", broken_reason="401")
    unreadable = make_connection(org, "unreadable", secret_encrypted="not-a-fernet-token")
    mended = make_connection(org, "mended", status="broken", broken_reason="401")

    checked = admin_client.post(
        f"{ADMIN}/connection/",
        {"action": "check_now", "_selected_action": [str(broken.pk), str(unreadable.pk)]},
        follow=True,
    )
    repaired = admin_client.post(
        f"{ADMIN}/connection/",
        {"action": "mark_repaired", "_selected_action": [str(mended.pk)]},
        follow=True,
    )

    said = messages_of(checked)
    assert any(m.startswith("broken: ok") for m in said), said
    assert any(m.startswith("unreadable: failed:") for m in said), said
    assert any(m.startswith("mended: repaired by hand") for m in messages_of(repaired))
    statuses = dict(Connection.objects.values_list("name", "status"))
    assert statuses == {"broken": "ok", "unreadable": "ok", "mended": "ok"}
    broken.refresh_from_db()
    assert broken.checked_at is not None


# --- the admin: effects -----------------------------------------------------------------------


def effect_url(effect: Effect, tail: str = "change/") -> str:
    return f"{ADMIN}/effect/{effect.pk}/{tail}"


def resolve(client: Client, effect: Effect, action: str, **data: str) -> Any:
    return client.post(effect_url(effect, f"resolve/{action}/"), data, follow=True)


def test_the_effect_page_shows_what_is_known_and_the_three_resolutions(
    admin_client: Client, run: Run
) -> None:
    effect = in_review(run)

    html = admin_client.get(effect_url(effect)).content.decode()

    for shown in (effect.key, "needs_review", "bad gateway", "crm.example/contacts",
                  "it may have acted"):  # fmt: skip
        assert shown in html, shown
    for action in ("done", "retry", "fail"):
        assert effect_url(effect, f"resolve/{action}/") in html, action
    assert "Mark done with result" in html and "Fail the step" in html
    assert 'id="id_done_result">\n</textarea>' in html  # empty, not "null"
    assert 'name="_save"' not in html  # read-only: nothing to save


def test_a_settled_effect_has_no_resolutions(admin_client: Client, run: Run) -> None:
    effect = in_review(run, state="settled")

    html = admin_client.get(effect_url(effect)).content.decode()

    assert "resolve/done/" not in html


def test_marking_done_in_the_admin_settles_it_and_records_the_event(
    admin_client: Client, run: Run
) -> None:
    effect = in_review(run)

    done = resolve(admin_client, effect, "done", result='{"id": "c_17", "ok": true}')

    assert done.status_code == 200
    assert done.redirect_chain[-1][0] == effect_url(effect)
    effect.refresh_from_db()
    # Named as run control names people in the history (admin:<user>), and audited as them.
    assert (effect.state, effect.result, effect.resolved_by) == (
        "settled", {"id": "c_17", "ok": True}, "admin:admin",
    )  # fmt: skip
    (event,) = resolved_events(effect)
    (detail,) = details(effect)
    assert (detail["action"], detail["by"], event.worker) == ("done", "admin:admin", "admin:admin")
    assert any("marked done" in m for m in messages_of(done))
    (entry,) = AuditEntry.objects.filter(action="effect.resolve", target_id=str(effect.pk))
    assert (entry.actor_kind, entry.actor_display, entry.detail["action"]) == (
        "user", "admin", "done",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("action", "data", "error_has"),
    [("retry", {}, "same key"), ("fail", {"reason": "customer cancelled"}, "customer cancelled")],
)
def test_retry_and_fail_in_the_admin(
    admin_client: Client, run: Run, action: str, data: dict[str, str], error_has: str
) -> None:
    effect = in_review(run)

    resolve(admin_client, effect, action, **data)

    effect.refresh_from_db()
    assert effect.state == "failed" and error_has in effect.error
    assert [d["action"] for d in details(effect)] == [action]


@pytest.mark.parametrize(
    ("result", "error"),
    [
        ("{not json", "Enter a valid JSON"),
        ("", "This field is required"),
        ("null", "This field is required"),
        ("NaN", "NaN or Infinity"),
        ('{"a": "\\u0000"}', "cannot be stored"),
        ("[" * 5000 + "]" * 5000, "nest"),
    ],
)
def test_a_bad_result_is_a_form_error_and_changes_nothing(
    admin_client: Client, run: Run, result: str, error: str
) -> None:
    effect = in_review(run)

    page = admin_client.post(effect_url(effect, "resolve/done/"), {"result": result})

    assert page.status_code == 200
    assert "admin/effects/effect/resolve.html" in [t.name for t in page.templates]
    assert error in page.content.decode()
    effect.refresh_from_db()
    assert effect.state == "needs_review" and resolved_events(effect) == []


@pytest.mark.django_db(transaction=True)
def test_two_resolutions_at_once_one_wins_and_the_other_is_told_who(org: Organisation) -> None:
    """Two keys resolve the same effect at once (done, retry): one is applied; the other is
    409 ``not_in_review`` naming the winner's key and action, as the run's history does."""
    from .concurrency import race

    done: dict[str, Any] = {"action": "done", "result": {"id": "c_1"}}
    bodies = [done, {"action": "retry"}]
    clients = [client_for(org), client_for(org)]
    for round_no in range(6):
        effect = in_review(start_run_keyed(org, f"k{round_no}"))
        answers = race(2, resolving(clients, effect, bodies))

        codes = sorted(answer.status_code for answer in answers)
        assert codes == [200, 409], [answer.content for answer in answers]
        loser = next(answer.json() for answer in answers if answer.status_code == 409)
        (winner,) = details(effect)  # one resolution recorded
        effect.refresh_from_db()
        assert effect.state == ("settled" if winner["action"] == "done" else "failed")
        assert loser["code"] == "not_in_review"
        assert f"resolved by {winner['by']} ({winner['action']})" in loser["detail"], loser


def resolving(clients: list[APIClient], effect: Effect, bodies: list[dict[str, Any]]) -> Any:
    """Client ``i`` sends resolution ``i`` of the effect."""
    url = f"/api/v1/effects/{effect.pk}/resolve"
    return lambda i: clients[i].post(url, bodies[i], format="json")


def start_run_keyed(org: Organisation, key: str) -> Run:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    return Run.objects.get(pk=run_start(org=org, automation_slug="io", run_input={},
                                        start_key=key).run_id)  # fmt: skip


def test_a_refused_resolution_is_an_admin_error_message(admin_client: Client, run: Run) -> None:
    effect = in_review(run)
    resolve(admin_client, effect, "retry")  # resolved once; the page's buttons are stale now

    again = resolve(admin_client, effect, "done", result='{"id": 1}')

    assert any("not_in_review" in m for m in messages_of(again)), messages_of(again)
    effect.refresh_from_db()
    assert effect.state == "failed" and len(resolved_events(effect)) == 1


def test_an_unknown_resolution_is_not_found(admin_client: Client, run: Run) -> None:
    effect = in_review(run)

    assert admin_client.post(effect_url(effect, "resolve/undo/")).status_code == 404
    assert admin_client.post(f"{ADMIN}/effect/999999/resolve/retry/").status_code == 404


def test_a_member_sees_and_resolves_only_their_organisations_effects(
    org: Organisation, other_org: Organisation, run: Run, their_run: Run
) -> None:
    mine, theirs = in_review(run), in_review(their_run)
    client = logged_in(staff_user("ana", org))

    listing = client.get(f"{ADMIN}/effect/").content.decode()
    assert effect_url(mine) in listing and effect_url(theirs) not in listing
    assert other_org.slug not in listing  # not even in the organisation filter
    assert client.get(effect_url(mine)).status_code == 200
    assert client.get(effect_url(theirs)).status_code == 404
    for action, data in (("done", {"result": "1"}), ("retry", {}), ("fail", {"reason": "x"})):
        assert client.post(effect_url(theirs, f"resolve/{action}/"), data).status_code == 404

    theirs.refresh_from_db()
    assert theirs.state == "needs_review" and resolved_events(theirs) == []
    resolve(client, mine, "retry")
    mine.refresh_from_db()
    assert mine.state == "failed"
    assert details(mine)[0]["by"] == "admin:ana"


def test_resolving_needs_the_change_permission_at_the_moment_of_the_post(
    org: Organisation, run: Run
) -> None:
    effect = in_review(run)
    user = staff_user("ben", org)
    client = logged_in(user)
    page = client.get(effect_url(effect)).content.decode()
    assert effect_url(effect, "resolve/retry/") in page  # rendered with its buttons

    user.user_permissions.remove(Permission.objects.get(codename="change_effect"))

    refused = client.post(effect_url(effect, "resolve/retry/"))
    assert refused.status_code == 403
    effect.refresh_from_db()
    assert effect.state == "needs_review"
    viewer = client.get(effect_url(effect))
    assert viewer.status_code == 200  # still viewable: view_effect
    assert "resolve/retry/" not in viewer.content.decode()

    Membership.objects.filter(user=user).delete()  # and membership is read at every request
    user.user_permissions.add(Permission.objects.get(codename="change_effect"))
    assert client.post(effect_url(effect, "resolve/retry/")).status_code == 404
    effect.refresh_from_db()
    assert effect.state == "needs_review" and resolved_events(effect) == []


def test_effects_cannot_be_added_edited_or_deleted(admin_client: Client, run: Run) -> None:
    effect = in_review(run)

    assert admin_client.get(f"{ADMIN}/effect/add/").status_code == 403
    forged = admin_client.post(effect_url(effect), {"state": "settled", "key": "forged"})
    assert forged.status_code == 403
    assert admin_client.post(effect_url(effect, "delete/"), {"post": "yes"}).status_code == 403
    effect.refresh_from_db()
    assert (effect.state, effect.key) == ("needs_review", f"{run.pk}/work/0")


def test_effects_are_filtered_by_state_and_provider_and_searched_by_key(
    admin_client: Client, org: Organisation, run: Run
) -> None:
    waiting = in_review(run)
    settled = in_review(run, step_id="other", state="settled")
    Effect.objects.filter(pk=settled.pk).update(provider="email")

    by_state = admin_client.get(f"{ADMIN}/effect/?state=needs_review").content.decode()
    by_provider = admin_client.get(f"{ADMIN}/effect/?provider=email").content.decode()
    by_key = admin_client.get(f"{ADMIN}/effect/?q={run.pk}/other").content.decode()

    assert effect_url(waiting) in by_state and effect_url(settled) not in by_state
    assert effect_url(settled) in by_provider and effect_url(waiting) not in by_provider
    assert effect_url(settled) in by_key and effect_url(waiting) not in by_key


# --- the admin: suppressions, budgets, egress -------------------------------------------------


def test_a_suppression_added_in_the_admin_is_lowercased_and_unique(
    admin_client: Client, org: Organisation
) -> None:
    form = {"org": str(org.pk), "channel": "email", "address": "Ann@Example.com", "reason": ""}

    added = admin_client.post(f"{ADMIN}/suppression/add/", form)
    again = admin_client.post(f"{ADMIN}/suppression/add/", form | {"address": "ANN@example.COM"})

    assert added.status_code == 302
    assert again.status_code == 200 and "already exists" in again.content.decode()
    assert list(Suppression.objects.values_list("address", flat=True)) == ["ann@example.com"]


def test_the_admin_refuses_a_suppression_on_email_that_is_not_an_email_address(
    admin_client: Client, org: Organisation
) -> None:
    form = {"org": str(org.pk), "channel": "email", "address": "not-an-email", "reason": ""}

    refused = admin_client.post(f"{ADMIN}/suppression/add/", form)

    assert refused.status_code == 200 and "one email address" in refused.content.decode()
    assert not Suppression.objects.exists()


def test_a_member_adds_suppressions_only_to_their_organisations(
    org: Organisation, other_org: Organisation
) -> None:
    client = logged_in(staff_user("cat", org))
    theirs = Suppression.objects.create(org=other_org, address="x@theirs.example")

    smuggled = client.post(
        f"{ADMIN}/suppression/add/",
        {"org": str(other_org.pk), "channel": "any", "address": "y@theirs.example"},
    )

    assert smuggled.status_code == 200 and "Select a valid choice" in smuggled.content.decode()
    assert client.get(f"{ADMIN}/suppression/{theirs.pk}/change/").status_code == 404
    assert (
        client.post(f"{ADMIN}/suppression/{theirs.pk}/delete/", {"post": "yes"}).status_code == 404
    )
    assert Suppression.objects.filter(org=other_org).count() == 1


def test_raising_a_budget_wakes_what_waits_for_it_and_keeps_what_is_reserved(
    admin_client: Client, org: Organisation, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = ModelBudget.objects.create(org=org, limit=Decimal("10"), reserved=Decimal("2"))
    calls: list[int] = []

    def budget_raised(org_id: int, *, by: str) -> int:
        calls.append(org_id)
        return 0

    monkeypatch.setattr("effects.admin.budget_raised", budget_raised)
    url = f"{ADMIN}/modelbudget/{budget.pk}/change/"

    admin_client.post(url, {"limit": "5"})
    assert calls == []  # lowered: nothing to wake
    # The engine reserves while the form is being saved: the save must not undo it.
    clean_limit = ModelBudgetForm.clean_limit

    def engine_reserves_meanwhile(form: ModelBudgetForm) -> Decimal:
        ModelBudget.objects.filter(pk=budget.pk).update(reserved=Decimal("7"))
        return clean_limit(form)

    monkeypatch.setattr(ModelBudgetForm, "clean_limit", engine_reserves_meanwhile)
    raised = admin_client.post(url, {"limit": "20"}, follow=True)

    assert calls == [org.pk]
    assert any("Budget raised" in m for m in messages_of(raised))
    budget.refresh_from_db()
    assert (budget.limit, budget.reserved) == (Decimal("20"), Decimal("7"))


def test_raising_a_budget_through_the_real_service(admin_client: Client, org: Organisation) -> None:
    budget = ModelBudget.objects.create(org=org, limit=Decimal("1"))

    raised = admin_client.post(
        f"{ADMIN}/modelbudget/{budget.pk}/change/", {"limit": "2"}, follow=True
    )

    assert "Budget raised; 0 parked step(s) woke." in messages_of(raised)


@pytest.mark.parametrize(
    ("entry", "accepted"),
    [("db.corp", True), ("10.0.0.0/8", True), ("https://db.corp", False), ("10.0.0.1/8", False)],
)
def test_egress_entries_are_validated(
    admin_client: Client, org: Organisation, entry: str, accepted: bool, settings
) -> None:
    settings.EFFECTS = {**settings.EFFECTS, "EGRESS_ALLOWABLE": [".corp", "10.0.0.0/8"]}
    response = admin_client.post(
        f"{ADMIN}/egressallow/add/", {"org": str(org.pk), "entry": entry, "note": ""}
    )

    assert (response.status_code == 302) is accepted, response.content.decode()[:2000]
    assert EgressAllow.objects.filter(entry=entry).exists() is accepted
    if not accepted:
        assert "errorlist" in response.content.decode()


def test_every_effects_admin_page_answers(admin_client: Client, org: Organisation) -> None:
    """The change lists and add pages render (no template or query error)."""
    other = OrganisationFactory.create()
    make_connection(other, "x")
    for model in ("connection", "effect", "suppression", "modelbudget", "egressallow"):
        assert admin_client.get(f"{ADMIN}/{model}/").status_code == 200, model
    for model in ("connection", "suppression", "modelbudget", "egressallow"):
        assert admin_client.get(f"{ADMIN}/{model}/add/").status_code == 200, model
