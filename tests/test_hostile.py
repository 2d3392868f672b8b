"""The attacks of the "hostile tenants" review, replayed over real HTTP (a live server on a
socket, httpx as the client), each against its bound. The finer cases are in test_limits.py
(rate limits, quotas, keys), test_production.py (settings, secrets), test_web_server.py (slow
clients, the server's own errors) and test_template_budget.py (template bombs)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from django.core.cache import caches

from workflows.api.throttles import WindowThrottle
from workflows.models import Organisation
from workflows.services import quotas
from workflows.services.automations import automation_publish_definition
from workflows.services.tenancy import api_key_create

from .factories import IO_DEFINITION

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def limits(settings, monkeypatch) -> None:
    """The production limits, smaller; the throttles' clock pinned mid-window."""
    monkeypatch.setattr(WindowThrottle, "timer", staticmethod(lambda: 960_000_030.0))
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {
            "api_key": "50/min", "run_starts": "1000/min", "auth_failures": "20/min",
        },
    }  # fmt: skip
    quotas.forget_running_counts()
    caches["default"].clear()  # counts of earlier tests (committed: live-server tests commit)


@pytest.fixture
def http(live_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        yield client


def bearer(raw: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {raw}"}


def test_two_hundred_guessed_keys_end_in_429_not_200_401s(http) -> None:
    codes = [
        http.get("/api/v1/runs", headers=bearer(f"wmk_0123456789ab_guess{n}")).status_code
        for n in range(200)
    ]
    assert codes[:20] == [401] * 20
    assert set(codes[20:]) == {429}


def test_one_key_flooding_is_cut_off_and_other_organisations_are_served(http) -> None:
    flooder = Organisation.objects.create(slug="flood", name="Flood")
    victim = Organisation.objects.create(slug="victim", name="Victim")
    _, flood_raw = api_key_create(org=flooder, name="k")
    _, victim_raw = api_key_create(org=victim, name="k")
    codes = [http.get("/api/v1/runs", headers=bearer(flood_raw)).status_code for _ in range(60)]
    assert codes.count(200) == 50 and codes[50:] == [429] * 10
    assert http.get("/api/v1/runs", headers=bearer(victim_raw)).status_code == 200


def test_a_tenant_cannot_pile_up_running_runs_past_its_quota(http) -> None:
    org = Organisation.objects.create(slug="piler", name="Piler", quota_running_runs=3)
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    _, raw = api_key_create(org=org, name="k")
    started = []
    for n in range(5):
        quotas.forget_running_counts()  # count every time: the test does not wait 5 s
        body = {"automation": "io", "input": {"n": n}}
        started.append(http.post("/api/v1/runs", json=body, headers=bearer(raw)))
    assert [r.status_code for r in started] == [201, 201, 201, 429, 429]
    assert started[3].json()["code"] == "quota_exceeded"
    assert started[3].headers["Retry-After"] == "30"


def test_a_read_only_key_cannot_start_runs_over_http(http) -> None:
    org = Organisation.objects.create(slug="ro", name="Ro")
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    _, raw = api_key_create(org=org, name="reader", read_only=True)
    refused = http.post("/api/v1/runs", json={"automation": "io", "input": {}},
                        headers=bearer(raw))  # fmt: skip
    assert refused.status_code == 403 and refused.json()["code"] == "read_only_key"
    assert http.get("/api/v1/runs", headers=bearer(raw)).status_code == 200


def test_admin_passwords_cannot_be_guessed_over_http(http, django_user_model) -> None:
    django_user_model.objects.create_superuser("boss", "b@example.com", "right-Pass-123")
    http.get("/admin/login/")  # the CSRF cookie
    token = http.cookies["csrftoken"]

    def sign_in(password: str) -> int:
        form = {"username": "boss", "password": password, "csrfmiddlewaretoken": token}
        answer = http.post("/admin/login/", data=form, headers={"Referer": str(http.base_url)})
        return int(answer.status_code)

    assert [sign_in(f"guess{n}") for n in range(4)] == [200] * 4
    assert sign_in("guess4") == 429
    assert sign_in("right-Pass-123") == 429  # locked out, even with the right password
