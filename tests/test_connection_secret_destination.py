"""A connection's secret goes only where it was given for: settings alone (which an API key or
a staff member may change without ever knowing the secret) never send it to another host.

- A change of ``base_url`` to another origin (for email: another SMTP host or port, or TLS
  turned off) without the secret given again is refused, 409 ``secret_required`` in the API
  and a form error in the admin; with the secret it is made.
- A URL of the connection's options on another origin than ``base_url`` (``health_url``,
  ``lookup_url``) is asked without the credentials.

Real clients against local stub servers that record what reaches them."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from effects.destinations import where_it_goes
from effects.models import Connection
from effects.perform import PROVIDERS, load_connection
from effects.providers.base import Request
from effects.providers.http import HttpProvider
from effects.secrets import decrypt
from tests.stubs.redirect import RecordingStub
from workflows.models import Organisation

from .effect_setup import connect, drive, one_step, start

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "tok-stored-secret-9f3a"
NEW_SECRET = "tok-given-again-7c21"


def connection(org: Organisation, name: str = "api") -> Connection:
    return Connection.objects.get(org=org, name=name)


def posted_to(stub: RecordingStub, org: Organisation, key: str = "k1") -> None:
    """A run whose http step posts to ``stub`` through the connection ``api``."""
    step = {
        "type": "http",
        "connection": "api",
        "request": {"method": "POST", "url": stub.url + "/x", "body": {}},
    }
    start(org, one_step(step), key=key)
    drive()


def test_moving_base_url_to_another_origin_needs_the_secret_again(
    org: Organisation, api: APIClient
) -> None:
    with RecordingStub({"id": 1}) as vetted, RecordingStub({"id": 1}) as elsewhere:
        connect(org, base_url=vetted.url, secret=SECRET)

        moved = api.patch("/api/v1/connections/api", {"base_url": elsewhere.url}, format="json")

        assert moved.status_code == 409, moved.content
        assert moved.json()["code"] == "secret_required"
        assert SECRET not in moved.content.decode()
        assert connection(org).base_url == vetted.url  # nothing of the change was written
        posted_to(elsewhere, org)
        assert not elsewhere.saw(SECRET)
        assert elsewhere.requests, "the step still reached the other host, without credentials"

        # Given again, the change is made, and the new secret goes to the new origin.
        moved = api.patch(
            "/api/v1/connections/api",
            {"base_url": elsewhere.url, "secret": NEW_SECRET},
            format="json",
        )
        assert moved.status_code == 200, moved.content
        posted_to(elsewhere, org, key="k2")
        assert elsewhere.saw(NEW_SECRET) and not elsewhere.saw(SECRET)


def test_a_change_that_keeps_the_origin_keeps_the_secret(org: Organisation, api: APIClient) -> None:
    with RecordingStub({"id": 1}) as vetted:
        connect(org, base_url=vetted.url + "/v1", secret=SECRET)
        same_origin = vetted.url + "/v2/"
        patched = api.patch(
            "/api/v1/connections/api",
            {"base_url": same_origin, "timeout_seconds": 9},
            format="json",
        )
        assert patched.status_code == 200, patched.content
        assert decrypt(connection(org).secret_encrypted) == SECRET
        posted_to(vetted, org)
        assert vetted.saw(SECRET)


def test_a_connection_without_a_secret_moves_freely(org: Organisation, api: APIClient) -> None:
    connect(org, base_url="https://one.example")
    patched = api.patch(
        "/api/v1/connections/api", {"base_url": "https://two.example"}, format="json"
    )
    assert patched.status_code == 200, patched.content


def test_a_health_url_elsewhere_is_checked_without_the_credentials(
    org: Organisation, api: APIClient
) -> None:
    with RecordingStub({"ok": True}) as vetted, RecordingStub({"ok": True}) as elsewhere:
        connect(org, base_url=vetted.url, secret=SECRET)
        patched = api.patch(
            "/api/v1/connections/api",
            {"options": {"health_url": elsewhere.url + "/h"}},
            format="json",
        )
        assert patched.status_code == 200, patched.content  # the secret does not move

        api.post("/api/v1/connections/api/check")

        assert elsewhere.requests and not elsewhere.saw(SECRET)
        # On the connection's own origin, the check carries them.
        api.patch(
            "/api/v1/connections/api", {"options": {"health_url": vetted.url + "/h"}}, format="json"
        )
        api.post("/api/v1/connections/api/check")
        assert vetted.saw(SECRET)


@pytest.mark.parametrize("provider", ["http", "crm_upsert"])
def test_a_health_url_elsewhere_gets_no_credentials_from_any_provider(
    org: Organisation, provider: str
) -> None:
    with RecordingStub({"ok": True}) as vetted, RecordingStub({"ok": True}) as elsewhere:
        connect(
            org,
            provider=provider,
            base_url=vetted.url,
            secret=SECRET,
            options={"health_url": elsewhere.url + "/h"},
        )
        conn = load_connection(org.pk, "api", PROVIDERS[provider])
        assert conn is not None
        PROVIDERS[provider].probe(conn)
        assert elsewhere.requests and not elsewhere.saw(SECRET)


def test_a_lookup_url_elsewhere_is_asked_without_the_credentials(org: Organisation) -> None:
    with RecordingStub({"items": []}) as vetted, RecordingStub({"items": []}) as elsewhere:
        connect(
            org,
            base_url=vetted.url,
            secret=SECRET,
            options={"lookup_url": elsewhere.url + "/effects?key={key}"},
        )
        http = PROVIDERS["http"]
        http.lookup(
            Request(payload={}, summary={}), "run/step/1", load_connection(org.pk, "api", http)
        )
        assert elsewhere.requests and not elsewhere.saw(SECRET)


@pytest.mark.parametrize(
    ("options", "moved"),
    [
        ({"host": "smtp.other.example", "port": 587, "use_tls": True}, True),
        ({"host": "smtp.example", "port": 2525, "use_tls": True}, True),
        ({"host": "smtp.example", "port": 587, "use_tls": False}, True),  # in the clear
        (
            {"host": "SMTP.example", "port": 587, "use_tls": True, "from_address": "a@b.example"},
            False,
        ),
    ],
)
def test_an_smtp_password_moves_only_with_the_password(
    org: Organisation, api: APIClient, options: dict[str, Any], moved: bool
) -> None:
    connect(
        org,
        provider="email",
        secret=SECRET,
        options={"host": "smtp.example", "port": 587, "use_tls": True},
    )
    patched = api.patch("/api/v1/connections/api", {"options": options}, format="json")
    if moved:
        assert (patched.status_code, patched.json()["code"]) == (409, "secret_required")
        assert connection(org).options["host"] == "smtp.example"
    else:
        assert patched.status_code == 200, patched.content


def test_a_slack_token_follows_no_base_url_change(org: Organisation, api: APIClient) -> None:
    connect(org, provider="slack_message", secret="xoxb-stored-token-1234")
    patched = api.patch(
        "/api/v1/connections/api", {"base_url": "https://evil.example/api/"}, format="json"
    )
    assert (patched.status_code, patched.json()["code"]) == (409, "secret_required")
    # The default written out is the same place.
    patched = api.patch(
        "/api/v1/connections/api", {"base_url": "https://slack.com/api/"}, format="json"
    )
    assert patched.status_code == 200, patched.content


def test_the_admin_form_refuses_to_move_the_secret_without_it(
    admin_client: Client, org: Organisation
) -> None:
    conn = connect(org, base_url="https://crm.example", secret=SECRET)
    form = {
        "base_url": "https://collector.example",
        "options": "{}",
        "secret": "",
        "max_concurrency": "4",
        "timeout_seconds": "30",
    }
    change = f"/admin/effects/connection/{conn.pk}/change/"

    refused = admin_client.post(change, form)

    assert refused.status_code == 200  # the form again, with its error
    assert "enter the secret again to make it" in refused.content.decode()
    conn.refresh_from_db()
    assert conn.base_url == "https://crm.example"
    saved = admin_client.post(change, {**form, "secret": NEW_SECRET})
    assert saved.status_code == 302, saved.content.decode()
    conn.refresh_from_db()
    assert (conn.base_url, decrypt(conn.secret_encrypted)) == (
        "https://collector.example",
        NEW_SECRET,
    )


@pytest.mark.parametrize(
    "base_url",
    ["x", "javascript:alert(1)", "ftp://files.example", "https://user:pw@api.example",
     "https://api.example:notaport", "https://api.example:99999"],
)  # fmt: skip
def test_a_base_url_that_cannot_be_one_is_refused_in_the_api_and_the_admin(
    org: Organisation, api: APIClient, admin_client: Client, base_url: str
) -> None:
    """A credential in the URL would be shown wherever the URL is (every read), which the
    secret never is; a scheme no provider calls is a typo."""
    created = api.post("/api/v1/connections", {"name": "c1", "provider": "http",
                                               "base_url": base_url}, format="json")  # fmt: skip
    assert (created.status_code, created.json()["code"]) == (400, "invalid_input")
    assert "base_url" in created.json()["errors"]
    conn = connect(org, base_url="https://api.example")
    patched = api.patch("/api/v1/connections/api", {"base_url": base_url}, format="json")
    assert patched.status_code == 400
    form = {"base_url": base_url, "options": "{}", "secret": "", "max_concurrency": "4",
            "timeout_seconds": "30"}  # fmt: skip
    refused = admin_client.post(f"/admin/effects/connection/{conn.pk}/change/", form)
    assert refused.status_code == 200 and "The base URL must be" in refused.content.decode()
    conn.refresh_from_db()
    assert conn.base_url == "https://api.example"


class VaultProvider(HttpProvider):
    """A provider that places its secret by an option, not by base_url."""

    name = "vault_http"
    destination_in_words = "another vault (options' vault)"

    def secret_destination(self, base_url: str, options: Mapping[str, Any]) -> Hashable:
        return str(options.get("vault", ""))


def test_each_provider_says_where_its_secret_goes_in_the_refusal(
    org: Organisation, api: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The words of the refusal are the provider's own (Provider.destination_in_words),
    # as where the secret goes is (secret_destination): none is special-cased.
    monkeypatch.setitem(PROVIDERS, VaultProvider.name, VaultProvider())
    assert where_it_goes("vault_http") == "another vault (options' vault)"
    assert where_it_goes("email").startswith("another SMTP server")
    assert (
        where_it_goes("http")
        == where_it_goes("slack_message")
        == ("another origin (base_url's scheme, host and port)")
    )
    connect(org, provider="vault_http", secret=SECRET, options={"vault": "ours"})
    patched = api.patch("/api/v1/connections/api", {"options": {"vault": "theirs"}},
                        format="json")  # fmt: skip
    assert (patched.status_code, patched.json()["code"]) == (409, "secret_required")
    assert "another vault (options' vault)" in patched.json()["detail"]
