"""The egress allowlist has a ceiling (effects/egress.py, effects/allowlist.py).

An organisation allowlists internal hosts its outside calls may reach; the operator decides
what may be allowlisted at all (WAYMARK_EGRESS_ALLOWABLE, nothing by default), and cloud
metadata and link-local addresses never open, whatever either says. The ceiling holds when
an entry is saved (API, admin, command: 400 ``egress_not_allowable``) and again when it is
used: an entry saved before the ceiling was lowered opens nothing.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.test import APIClient

from effects.egress import Allowlist, EgressRefused, egress_client
from effects.models import EgressAllow
from workflows.models import Membership, Organisation, Run, Step
from workflows.services.tenancy import api_key_create

from .effect_setup import connect, drive, one_step, post_item, start

pytestmark = pytest.mark.django_db

URL = "/api/v1/egress-allowlist"

# Every form of a metadata or link-local address an entry could take, and networks that
# would swallow one (refused even when the operator opens everything).
NEVER = [
    "169.254.169.254", "169.254.0.0/16", "169.254.169.0/24", "169.0.0.0/8", "0.0.0.0/0",
    "fd00:ec2::254", "fd00:ec2::/32", "100.100.100.200", "100.64.0.0/10", "fe80::1",
    "fe80::/10", "::ffff:169.254.169.254", "::ffff:0:0/96", "2002:a9fe:a9fe::/48",
    "64:ff9b::a9fe:a9fe", "::/0",
]  # fmt: skip


def set_ceiling(settings: Any, *entries: str) -> None:
    settings.EFFECTS = {**settings.EFFECTS, "EGRESS_ALLOWABLE": list(entries)}


@pytest.fixture
def writer(org: Organisation) -> APIClient:
    return api_for(org)


def api_for(org: Organisation, *, read_only: bool = False) -> APIClient:
    _, raw = api_key_create(org=org, name="egress", read_only=read_only)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def code_of(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["code"]


# --- the API ------------------------------------------------------------------------------------


def test_the_api_adds_lists_reads_and_removes_entries(writer: APIClient, settings) -> None:
    set_ceiling(settings, "127.0.0.0/8", ".corp.example")

    added = writer.post(URL, {"entry": " 127.0.0.1 ", "note": "the stub"}, format="json")
    named = writer.post(URL, {"entry": "DB.corp.example."}, format="json")
    again = writer.post(URL, {"entry": "127.0.0.1/32"}, format="json")
    listed = writer.get(URL)
    read = writer.get(f"{URL}/{added.json()['id']}")
    removed = writer.delete(f"{URL}/{added.json()['id']}")
    after = writer.get(f"{URL}/")  # the slash form answers too

    assert added.status_code == 201, added.content
    assert {k: added.json()[k] for k in ("entry", "note", "in_force")} == {
        "entry": "127.0.0.1/32", "note": "the stub", "in_force": True}  # fmt: skip
    assert named.status_code == 201 and named.json()["entry"] == "db.corp.example"
    assert code_of(again) == (409, "already_exists") and again.json()["id"] == added.json()["id"]
    assert [e["entry"] for e in listed.json()["results"]] == ["db.corp.example", "127.0.0.1/32"]
    assert read.json() == added.json()
    assert removed.status_code == 204
    assert [e["entry"] for e in after.json()["results"]] == ["db.corp.example"]


def test_another_organisations_entries_are_invisible(writer, org, other_api, other_org, settings):
    set_ceiling(settings, "127.0.0.0/8")
    mine = writer.post(URL, {"entry": "127.0.0.1"}, format="json").json()["id"]
    theirs = other_api.post(URL, {"entry": "127.0.0.1"}, format="json")  # their own, same text

    assert theirs.status_code == 201
    assert code_of(other_api.get(f"{URL}/{mine}")) == (404, "unknown_egress_entry")
    assert code_of(other_api.delete(f"{URL}/{mine}")) == (404, "unknown_egress_entry")
    assert [e["id"] for e in other_api.get(URL).json()["results"]] == [theirs.json()["id"]]
    assert EgressAllow.objects.filter(pk=mine, org=org).exists()


@pytest.mark.parametrize("entry", NEVER)
def test_metadata_and_link_local_never_open_whatever_the_ceiling(writer, settings, entry):
    set_ceiling(settings, "0.0.0.0/0", "::/0")

    refused = writer.post(URL, {"entry": entry}, format="json")

    assert code_of(refused) == (400, "egress_not_allowable"), refused.content
    assert "metadata or link-local" in refused.json()["detail"]
    assert not EgressAllow.objects.exists()


@pytest.mark.parametrize(
    "entry", ["10.0.0.1", "126.0.0.0/7", "localhost", ".example", "corp.example", "8.8.8.8"]
)
def test_entries_outside_the_ceiling_are_refused(writer, settings, entry):
    set_ceiling(settings, "127.0.0.0/8", ".corp.example")

    refused = writer.post(URL, {"entry": entry}, format="json")

    assert code_of(refused) == (400, "egress_not_allowable"), refused.content
    assert "WAYMARK_EGRESS_ALLOWABLE" in refused.json()["detail"]
    assert "127.0.0.0/8" not in refused.json()["detail"]  # the operator's ranges stay private
    assert not EgressAllow.objects.exists()


def test_by_default_nothing_may_be_allowlisted(writer, settings) -> None:
    set_ceiling(settings)

    assert code_of(writer.post(URL, {"entry": "127.0.0.1"}, format="json")) == (
        400, "egress_not_allowable")  # fmt: skip


@pytest.mark.parametrize(
    "body", [{"entry": "https://db.corp"}, {"entry": "10.0.0.1/8"}, {"entry": ""}, {},
             {"entry": "127.0.0.1", "org": 1}, {"entry": "127.0.0.1", "note": "x" * 201}],
)  # fmt: skip
def test_bad_entries_are_invalid_input(writer, settings, body) -> None:
    set_ceiling(settings, "0.0.0.0/0")

    assert code_of(writer.post(URL, body, format="json")) == (400, "invalid_input")


def test_a_read_only_key_reads_and_cannot_change(org, settings) -> None:
    set_ceiling(settings, "127.0.0.0/8")
    row = EgressAllow.objects.create(org=org, entry="127.0.0.1/32")
    reader = api_for(org, read_only=True)

    assert reader.get(URL).status_code == 200
    assert code_of(reader.post(URL, {"entry": "127.0.0.2"}, format="json")) == (
        403, "read_only_key")  # fmt: skip
    assert code_of(reader.delete(f"{URL}/{row.pk}")) == (403, "read_only_key")


def test_an_entry_the_ceiling_no_longer_covers_shows_it(writer, org, settings) -> None:
    set_ceiling(settings, "127.0.0.0/8")
    EgressAllow.objects.create(org=org, entry="10.1.0.0/16")  # saved under an older ceiling

    listed = writer.get(URL).json()["results"]

    assert [(e["entry"], e["in_force"]) for e in listed] == [("10.1.0.0/16", False)]


def test_the_endpoints_are_in_the_schema() -> None:
    paths = APIClient().get("/api/v1/schema/?format=json").json()["paths"]

    assert set(paths[URL]) == {"get", "post"}
    assert set(paths[f"{URL}/{{entry_id}}"]) == {"get", "delete"}
    assert f"{URL}/" not in paths
    created = paths[URL]["post"]["responses"]
    assert {"201", "400", "409"} <= set(created)


# --- the command --------------------------------------------------------------------------------


def run(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command("egress_allow", *args, stdout=out)
    return out.getvalue()


def test_the_command_adds_lists_and_removes(org, settings) -> None:
    set_ceiling(settings, "127.0.0.0/8")
    EgressAllow.objects.create(org=org, entry="10.0.0.0/8", note="old")

    added = run("--org", org.slug, "add", "127.0.0.1", "--note", "stub")
    listed = run("--org", org.slug, "list")
    removed = run("--org", org.slug, "remove", "127.0.0.1")

    assert added == f"added 127.0.0.1/32 for {org.slug}\n"
    assert listed == ("10.0.0.0/8  (outside the ceiling: unused)  # old\n"
                      "127.0.0.1/32  # stub\n")  # fmt: skip
    assert removed == f"removed 127.0.0.1 for {org.slug}\n"
    assert list(EgressAllow.objects.values_list("entry", flat=True)) == ["10.0.0.0/8"]


@pytest.mark.parametrize(
    ("args", "code"),
    [(["add", "169.254.169.254"], "egress_not_allowable"),
     (["add", "10.0.0.1"], "egress_not_allowable"),
     (["add", "http://x"], "invalid_input"),
     (["add"], "invalid_input"),
     (["list", "127.0.0.1"], "invalid_input"),
     (["remove", "127.0.0.9"], "unknown_egress_entry")],
)  # fmt: skip
def test_the_command_refuses_with_a_code(org, settings, args: list[str], code: str) -> None:
    set_ceiling(settings, "127.0.0.0/8", "169.254.0.0/16")

    with pytest.raises(CommandError, match=f"^{code}: "):
        run("--org", org.slug, *args)
    assert not EgressAllow.objects.exists()


def test_the_command_names_an_unknown_organisation(db) -> None:
    with pytest.raises(CommandError, match=r"^unknown_organisation: "):
        run("--org", "nobody", "list")


# --- the admin ----------------------------------------------------------------------------------


def staff_of(org: Organisation) -> Client:
    """A staff member (not a superuser) of ``org`` who may manage its egress allowlist."""
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="effects"))
    Membership.objects.create(user=user, org=org)
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("entry", ["169.254.169.254", "127.0.0.1", "fe80::/10"])
def test_staff_cannot_allowlist_beyond_the_ceiling_in_the_admin(org, settings, entry) -> None:
    set_ceiling(settings, "10.0.0.0/8", "169.254.0.0/16")  # an operator's mistake: still never

    page = staff_of(org).post("/admin/effects/egressallow/add/",
                              {"org": str(org.pk), "entry": entry, "note": ""})  # fmt: skip

    assert page.status_code == 200 and "errorlist" in page.content.decode()
    assert not EgressAllow.objects.exists()


def test_superusers_are_held_to_the_ceiling_too(admin_client, org, settings) -> None:
    set_ceiling(settings, "10.0.0.0/8")
    form = {"org": str(org.pk), "note": ""}

    refused = admin_client.post("/admin/effects/egressallow/add/", {**form, "entry": "127.0.0.1"})
    saved = admin_client.post("/admin/effects/egressallow/add/", {**form, "entry": "10.0.0.1"})

    assert refused.status_code == 200 and "WAYMARK_EGRESS_ALLOWABLE" in refused.content.decode()
    assert saved.status_code == 302
    assert list(EgressAllow.objects.values_list("entry", flat=True)) == ["10.0.0.1/32"]


# --- at use -------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_old_entry_outside_the_ceiling_opens_nothing(org, settings, provider_stub) -> None:
    # connect() allowlists 127.0.0.1/32 for the organisation, as if saved long ago.
    connect(org, base_url=provider_stub.url)
    assert EgressAllow.objects.filter(org=org, entry="127.0.0.1/32").exists()
    set_ceiling(settings, "10.0.0.0/8")  # the operator no longer lets tenants reach loopback

    refused = start(org, one_step(post_item(provider_stub.url)), key="lowered")
    drive()
    set_ceiling(settings, "127.0.0.1/32")  # the same row, back under the ceiling
    allowed = start(org, one_step(post_item(provider_stub.url)), key="raised")
    drive()

    assert Run.objects.get(pk=refused).status == "failed"
    step = Step.objects.get(run_id=refused, step_id="send")
    assert "refused 127.0.0.1" in step.error and step.attempt == 1
    assert Run.objects.get(pk=allowed).status == "succeeded"
    assert len(provider_stub.created) == 1  # only the run under the raised ceiling reached it


@pytest.mark.django_db(transaction=True)
def test_an_old_entry_for_a_mail_server_opens_nothing_either(org, settings, smtp_stub) -> None:
    connect(org, provider="email", name="mail",
            options={"host": smtp_stub.host, "port": smtp_stub.port})  # fmt: skip
    email = {"type": "email", "connection": "mail", "to": "ann@example.com", "subject": "Hi",
             "body": "Hello"}  # fmt: skip
    set_ceiling(settings)  # nothing may be allowlisted now

    refused = start(org, one_step(email, output="{{ steps.send.output }}"))
    drive()

    step = Step.objects.get(run_id=refused, step_id="send")
    assert Run.objects.get(pk=refused).status == "failed" and "refused 127.0.0.1" in step.error
    assert smtp_stub.messages == []


def test_a_bad_ceiling_is_named(settings) -> None:
    from effects.egress import tenant_ceiling

    set_ceiling(settings, "10.0.0.0/8", "https://internal")

    with pytest.raises(ImproperlyConfigured, match="WAYMARK_EGRESS_ALLOWABLE: 'https://internal'"):
        tenant_ceiling()


@pytest.fixture
def outside_connects(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every TCP connect this process attempts; one to a non-loopback address is recorded
    and refused here, so no test can ever send a packet towards a metadata address."""
    attempted: list[Any] = []
    real_connect = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> None:
        if not str(address[0]).startswith("127."):
            attempted.append(address[:2])
            raise ConnectionRefusedError("test: no connects beyond loopback")
        real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    yield attempted


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Host name -> the one address DNS answers for it (other names: the real resolver)."""
    chosen: dict[str, str] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in chosen:
            return real(host, port, *args, **kwargs)
        family = socket.AF_INET6 if ":" in chosen[host] else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (chosen[host], int(port)))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return chosen


@pytest.mark.parametrize(
    ("allowlisted", "url"),
    [(["169.254.0.0/16"], "http://169.254.169.254/latest/meta-data/"),
     (["::/0"], "http://[::ffff:169.254.169.254]/"),
     (["fd00:ec2::254"], "http://[fd00:ec2::254]/"),
     (["100.100.100.200"], "http://100.100.100.200/"),
     (["metadata.corp"], "http://metadata.corp/")],
)  # fmt: skip
def test_no_allowlist_opens_a_metadata_address_at_use(
    allowlisted: list[str], url: str, outside_connects: list[Any], answers: dict[str, str]
) -> None:
    """Even an allowlist that names it (a row written before any ceiling, straight into the
    table) cannot open it: the guard refuses before connecting."""
    answers["metadata.corp"] = "169.254.169.254"
    allow = Allowlist.parse(allowlisted)
    with egress_client(allow=allow, timeout=3) as client, pytest.raises(EgressRefused) as caught:
        client.get(url)

    assert "no allowlist can open it" in str(caught.value)
    assert outside_connects == []


def test_the_tenant_allowlist_is_cut_to_the_ceiling(settings) -> None:
    set_ceiling(settings, "10.0.0.0/8", ".corp.example", "0.0.0.0/0")
    stored = ["10.1.0.0/16", "db.corp.example", "db.other.example", "169.254.0.0/16",
              "not a valid entry", "172.16.0.0/12"]  # fmt: skip

    usable = Allowlist.for_tenant(stored)

    assert usable.hosts == {"db.corp.example"}
    assert [str(n) for n in usable.networks] == ["10.1.0.0/16", "172.16.0.0/12"]
