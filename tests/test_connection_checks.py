"""Connection checks cannot hold the web tier (effects/checks.py).

A check probes a connection's provider from a web request, and the connection's timeout is
the tenant's to set. Against a silent host (a real TCP server that accepts and never
answers, tests/stubs/tarpit.py) the old check held a web thread for all of that timeout, so
a handful of concurrent checks held every thread: /livez and other organisations timed out.
Now a check waits at most WAYMARK_CONNECTION_CHECK_SECONDS, one connection is checked once
at a time (409 ``check_in_progress``) and an organisation has at most
WAYMARK_CONNECTION_CHECKS_PER_ORG checks in flight (429 ``checks_busy``).

The web tests run the real server (``runengine --web-only``: waitress and its thread pool)
with real concurrent HTTP requests; every wait is for an event (the tarpit saw the client,
an answer arrived), never for a time an idle machine would need.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from effects.models import Connection
from workflows.models import Organisation
from workflows.services.tenancy import api_key_create

from .effect_setup import connect
from .factories import OrganisationFactory
from .processes import kill_tree, wait_for
from .stubs.tarpit import Tarpit
from .test_web_server import start_web

pytestmark = pytest.mark.django_db(transaction=True)

# The tenant's own timeout: what the old check held a web thread for.
TENANT_TIMEOUT = 600.0
# How long a test's client waits for an answer that must come much sooner (never reached
# when the code works: a missing answer fails the test instead of hanging it).
PATIENCE = 120.0


@pytest.fixture
def tarpit() -> Iterator[Tarpit]:
    with Tarpit() as server:
        yield server


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=16) as executor:
        yield executor


def key_of(org: Organisation) -> str:
    return api_key_create(org=org, name="checks")[1]


def call(port: int, method: str, path: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=PATIENCE) as client:
        return client.request(method, path, headers=headers)


def check(port: int, key: str, name: str) -> httpx.Response:
    return call(port, "POST", f"/api/v1/connections/{name}/check", key)


def silent_connections(org: Organisation, tarpit: Tarpit, *names: str) -> None:
    for name in names:
        connect(org, name=name, base_url=tarpit.url, timeout_seconds=TENANT_TIMEOUT)


# --- the web tier -----------------------------------------------------------------------------


def test_checks_of_a_silent_host_leave_the_web_tier_to_everyone_else(
    procs, tmp_path: Path, tarpit: Tarpit, pool: ThreadPoolExecutor
) -> None:
    ours, theirs = OrganisationFactory.create(), OrganisationFactory.create()
    silent_connections(ours, tarpit, *(f"a{i}" for i in range(1, 9)))
    silent_connections(theirs, tarpit, "b1")
    our_key, their_key = key_of(ours), key_of(theirs)
    # Four web threads, and a bound far longer than any answer below needs: every check
    # that reaches the tarpit is still in flight when the test looks.
    port = start_web(procs, tmp_path, WAYMARK_WEB_PROCESSES="1", WAYMARK_WEB_THREADS="4",
                     WAYMARK_CONNECTION_CHECK_SECONDS=str(PATIENCE))  # fmt: skip

    first = pool.submit(check, port, our_key, "a1")
    tarpit.wait_accepted(1)
    again = check(port, our_key, "a1")  # the same connection, while its check is in flight
    second = pool.submit(check, port, our_key, "a2")
    tarpit.wait_accepted(2)
    # A flood of checks (each held a web thread for the tenant's 600 s before).
    flood = [pool.submit(check, port, our_key, f"a{i}") for i in range(3, 9)]
    refused = [future.result() for future in flood]
    livez = call(port, "GET", "/livez")
    listed = call(port, "GET", "/api/v1/connections", their_key)
    their_check = pool.submit(check, port, their_key, "b1")
    tarpit.wait_accepted(3)  # another organisation's check goes through

    assert (again.status_code, again.json()["code"]) == (409, "check_in_progress")
    assert [(r.status_code, r.json()["code"]) for r in refused] == [(429, "checks_busy")] * 6
    assert all(int(r.headers["Retry-After"]) >= 1 for r in refused)
    assert livez.status_code == 200
    assert listed.status_code == 200 and [c["name"] for c in listed.json()["results"]] == ["b1"]
    # All of it answered while our two checks (and theirs) were still waiting at the tarpit.
    assert not first.done() and not second.done() and not their_check.done()
    assert tarpit.accepted == 3 and tarpit.still_open() == 3
    kill_tree(procs[-1])  # the checks still in flight end with the server, not at the bound


def test_a_check_of_a_silent_host_answers_within_the_operators_bound(
    procs, tmp_path: Path, tarpit: Tarpit
) -> None:
    org = OrganisationFactory.create()
    silent_connections(org, tarpit, "slow")
    key = key_of(org)
    port = start_web(procs, tmp_path, WAYMARK_CONNECTION_CHECK_SECONDS="2")

    began = time.monotonic()
    answer = check(port, key, "slow")
    took = time.monotonic() - began

    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["result"].startswith("failed: no answer within 2 s"), body
    assert body["status"] == "ok" and body["checked_at"] is not None  # left as it was
    assert tarpit.accepted == 1  # it did reach the host
    # Bounded by the operator's 2 s, not the tenant's 600 (a loaded machine's margin aside).
    assert took < TENANT_TIMEOUT / 10
    # The probe gives up too (its timeouts are cut to the bound) and frees the connection.
    wait_for(lambda: not Connection.objects.filter(name="slow", check_token__gt="").exists(),
             timeout=PATIENCE, what="the abandoned probe to release its lease")  # fmt: skip
    assert check(port, key, "slow").json()["result"].startswith("failed: no answer within")


# --- leases -------------------------------------------------------------------------------------


def lease(conn: Connection, *, seconds: float) -> None:
    """Mark ``conn`` as being checked by someone else until ``seconds`` from now."""
    until = timezone.now() + timedelta(seconds=seconds)
    Connection.objects.filter(pk=conn.pk).update(check_token="someone", check_until=until)


def test_one_check_per_connection_and_a_few_per_organisation(api, org, other_api, other_org):
    # Connections without a URL: nothing to probe, a check passes at once.
    mine = [connect(org, name=f"c{i}") for i in range(3)]
    connect(other_org, name="c0")

    lease(mine[0], seconds=60)
    busy_connection = api.post("/api/v1/connections/c0/check")
    lease(mine[1], seconds=60)
    busy_org = api.post("/api/v1/connections/c2/check")
    other = other_api.post("/api/v1/connections/c0/check")

    assert (busy_connection.status_code, busy_connection.json()["code"]) == (
        409, "check_in_progress")  # fmt: skip
    assert (busy_org.status_code, busy_org.json()["code"]) == (429, "checks_busy")
    assert busy_org["Retry-After"] == "5"
    assert other.status_code == 200 and other.json()["result"] == "ok"


def test_a_lapsed_lease_of_a_check_that_died_does_not_block(api, org) -> None:
    conn = connect(org, name="c")
    lease(conn, seconds=-1)  # its holder died mid-check; the lease ran out

    checked = api.post("/api/v1/connections/c/check")

    assert checked.status_code == 200 and checked.json()["result"] == "ok"
    conn.refresh_from_db()
    assert (conn.check_token, conn.check_until) == ("", None)  # released after the check


def test_the_organisations_cap_is_a_setting(api, org, settings) -> None:
    settings.EFFECTS = {**settings.EFFECTS, "CONNECTION_CHECKS_PER_ORG": 3}
    for i in range(3):
        connect(org, name=f"c{i}")
    lease(Connection.objects.get(name="c0"), seconds=60)
    lease(Connection.objects.get(name="c1"), seconds=60)

    assert api.post("/api/v1/connections/c2/check").json()["result"] == "ok"


def test_an_admin_click_checks_within_one_bound(
    admin_user: User, tarpit: Tarpit, settings: Any
) -> None:
    settings.EFFECTS = {**settings.EFFECTS, "CONNECTION_CHECK_SECONDS": 1.0}
    org = OrganisationFactory.create()
    silent_connections(org, tarpit, "s1", "s2", "s3")
    client = Client()
    client.force_login(admin_user)
    chosen = [str(pk) for pk in Connection.objects.values_list("pk", flat=True)]

    action = {"action": "check_now", "_selected_action": chosen}
    clicked = client.post("/admin/effects/connection/", action, follow=True)

    said = [str(m) for m in clicked.context["messages"]]
    assert said[0].startswith("s1: failed: no answer within 1 s"), said
    assert said[1] == "Not checked, this click's 1 s being spent: s2, s3; check them again."
    wait_for(lambda: not Connection.objects.filter(check_token__gt="").exists(),
             timeout=PATIENCE, what="the abandoned probe to release its lease")  # fmt: skip


def test_a_probe_that_outlives_its_request_keeps_the_connection_until_it_ends(
    api: Any, org: Organisation, settings: Any
) -> None:
    """A host that answers one byte at a time never trips a timeout per read: the request
    answers at the bound, and its probe, still reading, keeps the connection's lease (the
    connection and the organisation's slot stay taken) until the probe ends; then the probe
    releases it itself."""
    settings.EFFECTS = {**settings.EFFECTS, "CONNECTION_CHECK_SECONDS": 1.0}
    with Tarpit(trickle=0.2) as trickler:
        silent_connections(org, trickler, "s")

        first = api.post("/api/v1/connections/s/check")
        again = api.post("/api/v1/connections/s/check")
        trickler.hang_up()
        wait_for(lambda: not Connection.objects.filter(name="s", check_token__gt="").exists(),
                 timeout=PATIENCE, what="the probe to end and release the connection")  # fmt: skip

    assert first.json()["result"].startswith("failed: no answer within 1 s"), first.json()
    assert (again.status_code, again.json()["code"]) == (409, "check_in_progress")
    assert trickler.accepted == 1
