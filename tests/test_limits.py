"""Rate limits, quotas and key scopes: one tenant's key cannot take the service from others.

Every request goes through the whole Django and DRF stack (APIClient); counts live in the
database cache, as in production. The throttles' clock is pinned to the middle of a window,
so a count never straddles two windows however slow the machine is.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import caches
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from waymark_config.pg_cache import PostgresDatabaseCache
from workflows.api.throttles import WindowThrottle
from workflows.errors import InvalidApiKey, QuotaExceeded
from workflows.models import ApiKey, Automation, Organisation
from workflows.services import quotas
from workflows.services.automations import (
    automation_create,
    automation_publish_definition,
    version_create_draft,
)
from workflows.services.tenancy import api_key_authenticate, api_key_create

from .concurrency import race
from .factories import IO_DEFINITION, linear_definition

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def pinned_clock(monkeypatch) -> None:
    monkeypatch.setattr(WindowThrottle, "timer", staticmethod(lambda: 960_000_030.0))
    quotas.forget_running_counts()
    caches["default"].clear()


@pytest.fixture
def rates(settings):
    def set_rates(**rates: str | None) -> None:
        base = {"api_key": None, "run_starts": None, "auth_failures": None}
        settings.REST_FRAMEWORK = {
            **settings.REST_FRAMEWORK,
            "DEFAULT_THROTTLE_RATES": {**base, **rates},
        }

    return set_rates


def client_with(raw: str, *, scheme: str = "Bearer", address: str = "127.0.0.1") -> APIClient:
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {raw}")
    return client


def test_a_key_over_its_rate_gets_429_with_retry_after_and_others_do_not(
    rates, org, other_org
) -> None:
    rates(api_key="3/min")
    _, raw = api_key_create(org=org, name="busy")
    _, other_raw = api_key_create(org=other_org, name="quiet")
    busy = client_with(raw)
    assert [busy.get("/api/v1/runs").status_code for _ in range(3)] == [200, 200, 200]
    refused = busy.get("/api/v1/runs")
    assert refused.status_code == 429
    assert refused.json()["code"] == "throttled"
    assert int(refused["Retry-After"]) == 30  # the rest of the pinned minute
    assert client_with(other_raw).get("/api/v1/runs").status_code == 200


def test_failed_keys_from_one_address_end_in_429(rates, org) -> None:
    rates(auth_failures="3/min")
    _, raw = api_key_create(org=org, name="real")
    guesser = "203.0.113.7"
    for n in range(3):
        wrong = client_with(f"wmk_abcdef012345_guess{n}", address=guesser).get("/api/v1/runs")
        assert wrong.status_code == 401
    blocked = client_with("wmk_abcdef012345_guess9", address=guesser).get("/api/v1/runs")
    assert blocked.status_code == 429 and blocked.json()["code"] == "throttled"
    assert "Retry-After" in blocked
    # A valid key still works (it costs no lookup of failures), from any address.
    assert client_with(raw, address=guesser).get("/api/v1/runs").status_code == 200
    assert client_with(raw, address="198.51.100.1").get("/api/v1/runs").status_code == 200
    # Another address's guesses get their 401s.
    other = client_with("wmk_abcdef012345_guess", address="198.51.100.1").get("/api/v1/runs")
    assert other.status_code == 401


def test_a_forged_x_forwarded_for_does_not_escape_the_failure_limit(rates, org) -> None:
    """No proxy is configured: the client is REMOTE_ADDR, whatever X-Forwarded-For says."""
    rates(auth_failures="3/min")
    guesser = "203.0.113.9"
    for n in range(3):
        forged = client_with(f"wmk_abcdef012345_guess{n}", address=guesser)
        forged.credentials(HTTP_AUTHORIZATION=f"Bearer wmk_abcdef012345_g{n}",
                           HTTP_X_FORWARDED_FOR=f"10.9.8.{n}")  # fmt: skip
        assert forged.get("/api/v1/runs").status_code == 401
    last = client_with("wmk_abcdef012345_guess9", address=guesser)
    last.credentials(HTTP_AUTHORIZATION="Bearer wmk_abcdef012345_x", HTTP_X_FORWARDED_FOR="1.2.3.4")
    assert last.get("/api/v1/runs").status_code == 429


def test_a_forged_x_forwarded_for_does_not_escape_the_admin_lockout(django_user_model) -> None:
    django_user_model.objects.create_superuser("boss", "boss@example.com", "right-Pass-123")
    for n in range(5):
        forged = Client(REMOTE_ADDR="192.0.2.6", HTTP_X_FORWARDED_FOR=f"10.0.0.{n}")
        forged.post("/admin/login/", {"username": "boss", "password": "wrong"})
    again = Client(REMOTE_ADDR="192.0.2.6", HTTP_X_FORWARDED_FOR="10.0.0.77")
    answer = again.post("/admin/login/", {"username": "boss", "password": "right-Pass-123"})
    assert answer.status_code == 429


def test_the_bearer_scheme_is_case_insensitive(org) -> None:
    _, raw = api_key_create(org=org, name="k")
    assert client_with(raw, scheme="bearer").get("/api/v1/runs").status_code == 200


def test_starts_per_minute_is_a_quota_of_the_organisation(rates, org, other_org) -> None:
    rates(run_starts="100/min")
    org.quota_starts_per_minute = 2
    org.save()
    for each in (org, other_org):
        automation_publish_definition(org=each, slug="q", definition=linear_definition("a"))
    _, raw = api_key_create(org=org, name="k")
    _, other_raw = api_key_create(org=other_org, name="k")
    starter = client_with(raw)
    codes = [
        starter.post("/api/v1/runs", {"automation": "q", "input": {"n": n}}, format="json")
        for n in range(3)
    ]
    assert [c.status_code for c in codes] == [201, 201, 429]
    assert codes[2].json()["code"] == "throttled" and "Retry-After" in codes[2]
    assert starter.get("/api/v1/runs").status_code == 200  # reading is not starting
    other = client_with(other_raw)
    assert (
        other.post("/api/v1/runs", {"automation": "q", "input": {}}, format="json").status_code
        == 201
    )


def test_running_runs_quota_refuses_new_starts_with_429(org) -> None:
    org.quota_running_runs = 2
    org.save()
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    _, raw = api_key_create(org=org, name="k")
    starter = client_with(raw)
    for n in range(2):  # io steps and no worker: both stay running
        started = starter.post("/api/v1/runs", {"automation": "io", "input": {"n": n}},
                               format="json")  # fmt: skip
        assert started.status_code == 201
    quotas.forget_running_counts()
    refused = starter.post("/api/v1/runs", {"automation": "io", "input": {"n": 9}}, format="json")
    assert refused.status_code == 429
    assert refused.json()["code"] == "quota_exceeded"
    assert "2 running runs" in refused.json()["detail"]
    assert refused["Retry-After"] == "30"


def test_automation_and_version_quotas_are_409(org) -> None:
    org.quota_automations, org.quota_versions = 1, 2
    org.save()
    _, raw = api_key_create(org=org, name="k")
    client = client_with(raw)
    assert client.post("/api/v1/automations", {"slug": "one"}, format="json").status_code == 201
    second = client.post("/api/v1/automations", {"slug": "two"}, format="json")
    assert second.status_code == 409 and second.json()["code"] == "quota_exceeded"
    automation = Automation.objects.get(org=org, slug="one")
    for _ in range(2):
        version_create_draft(automation=automation, definition=linear_definition("a"))
    with pytest.raises(QuotaExceeded):
        version_create_draft(automation=automation, definition=linear_definition("b"))


@pytest.mark.django_db(transaction=True)
def test_concurrent_creations_cannot_overshoot_the_quota(org) -> None:
    org.quota_automations = 3
    org.save()

    def create(n: int) -> str:
        try:
            automation_create(org=org, slug=f"a{n}")
        except QuotaExceeded:
            return "refused"
        return "created"

    outcomes = race(8, create)
    assert sorted(outcomes).count("created") == 3
    assert Automation.objects.filter(org=org).count() == 3


@pytest.mark.django_db(transaction=True)
def test_parallel_requests_cannot_pass_a_keys_rate(rates, org) -> None:
    """Twelve requests at once on a key allowed five a minute: five answers, seven 429s.
    Counting by a read and then a write lets racing requests read the same count."""
    rates(api_key="5/min")
    _, raw = api_key_create(org=org, name="burst")
    codes = race(12, lambda n: client_with(raw).get("/api/v1/runs").status_code)
    assert sorted(codes) == [200] * 5 + [429] * 7


@pytest.mark.django_db(transaction=True)
def test_a_counter_counts_every_racing_increment_once() -> None:
    cache = caches["default"]
    assert isinstance(cache, PostgresDatabaseCache)
    counts = race(8, lambda n: [cache.count_one("burst", 60) for _ in range(25)])
    assert sorted(c for thread in counts for c in thread) == list(range(1, 201))
    assert cache.peek_count("burst") == 200
    cache.count_one("done", 0)  # a timeout of 0 expires at once
    assert cache.peek_count("done") == 0 and cache.count_one("done", 60) == 1


def test_a_read_only_key_reads_and_cannot_write(org) -> None:
    automation_publish_definition(org=org, slug="q", definition=linear_definition("a"))
    _, raw = api_key_create(org=org, name="reader", read_only=True)
    reader = client_with(raw)
    assert reader.get("/api/v1/runs").status_code == 200
    refused = reader.post("/api/v1/runs", {"automation": "q", "input": {}}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "read_only_key"
    # Made read-only after creation: refused at once, no cache in between.
    key, writer_raw = api_key_create(org=org, name="writer")
    ApiKey.objects.filter(pk=key.pk).update(read_only=True)
    writer = client_with(writer_raw)
    assert writer.post("/api/v1/runs", {"automation": "q", "input": {}},
                       format="json").status_code == 403  # fmt: skip


def test_an_expired_key_is_refused(org) -> None:
    _, raw = api_key_create(org=org, name="old", expires_at=timezone.now() - timedelta(seconds=1))
    refused = client_with(raw).get("/api/v1/runs")
    assert refused.status_code == 401 and refused.json()["code"] == "api_key_expired"
    _, fresh = api_key_create(org=org, name="new", expires_at=timezone.now() + timedelta(days=1))
    assert client_with(fresh).get("/api/v1/runs").status_code == 200


def test_admin_sign_in_locks_out_after_repeated_failures(django_user_model) -> None:
    django_user_model.objects.create_superuser("boss", "boss@example.com", "right-Pass-123")
    browser = Client(REMOTE_ADDR="192.0.2.5")
    for _ in range(4):
        failed = browser.post("/admin/login/", {"username": "boss", "password": "wrong"})
        assert failed.status_code == 200 and not failed.wsgi_request.user.is_authenticated
    fifth = browser.post("/admin/login/", {"username": "boss", "password": "wrong"})
    assert fifth.status_code == 429  # the fifth failure locks the pair out
    locked = browser.post("/admin/login/", {"username": "boss", "password": "right-Pass-123"})
    assert locked.status_code == 429
    assert b"Sign-in temporarily locked" in locked.content
    # The lockout is for that user from that address: the same user elsewhere signs in.
    elsewhere = Client(REMOTE_ADDR="192.0.2.99")
    signed_in = elsewhere.post("/admin/login/", {"username": "boss", "password": "right-Pass-123"})
    assert signed_in.status_code == 302


def test_the_database_cache_sets_by_upsert_and_expires() -> None:
    cache = caches["default"]
    assert isinstance(cache, PostgresDatabaseCache)
    cache.set("count", 1, 60)
    cache.set("count", 2, 60)  # the same row, replaced
    assert cache.get("count") == 2
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM waymark_cache WHERE cache_key LIKE %s", ["%count"])
        assert cursor.fetchone()[0] == 1
    cache.set("gone", 1, 0)  # a timeout of 0 expires at once, as in Django's backends
    assert cache.get("gone") is None


def test_key_use_is_recorded_at_most_every_five_minutes(org) -> None:
    key, raw = api_key_create(org=org, name="k")
    client = client_with(raw)
    assert client.get("/api/v1/runs").status_code == 200
    key.refresh_from_db()
    first = key.last_used_at
    assert first is not None
    assert client.get("/api/v1/runs").status_code == 200
    key.refresh_from_db()
    assert key.last_used_at == first  # recent: not written again
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=first - timedelta(minutes=10))
    assert client.get("/api/v1/runs").status_code == 200
    key.refresh_from_db()
    assert key.last_used_at is not None and key.last_used_at > first - timedelta(minutes=1)


def test_authentication_loads_the_key_and_its_organisation_as_the_orm_does(org) -> None:
    """The per-request lookup is one prepared statement (sql.API_KEY_WITH_ORG): every field
    of both rows comes with it, none deferred, each as the ORM loads it. A field added to
    either model and not to the statement fails here."""
    org.quota_starts_per_minute = 7
    org.save()
    stored, raw = api_key_create(
        org=org, name="k", read_only=True, expires_at=timezone.now() + timedelta(days=1)
    )
    api_key_authenticate(raw)  # records its use: the next reads see the same row
    orm = ApiKey.objects.select_related("org").get(pk=stored.pk)
    key = api_key_authenticate(raw)
    assert key.last_used_at is not None
    assert key.get_deferred_fields() == set() and key.org.get_deferred_fields() == set()
    for field in ApiKey._meta.concrete_fields:
        assert getattr(key, field.attname) == getattr(orm, field.attname), field.name
    for field in Organisation._meta.concrete_fields:
        assert getattr(key.org, field.attname) == getattr(orm.org, field.attname), field.name
    assert not key._state.adding and key._state.db == "default"
    with pytest.raises(InvalidApiKey):
        api_key_authenticate(raw[:-1] + ("x" if raw[-1] != "x" else "y"))
    with pytest.raises(InvalidApiKey):
        api_key_authenticate("wmk_000000000000_nothing")


def test_a_cache_without_count_one_counts_with_add_and_incr(rates, org, settings) -> None:
    """Another cache backend (Redis in production; here Django's local-memory one, whose add
    and incr are atomic too) counts with add then incr, and the limit holds the same way."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    assert not hasattr(caches["default"], "count_one")
    rates(api_key="3/min")
    _, raw = api_key_create(org=org, name="busy")
    busy = client_with(raw)
    assert [busy.get("/api/v1/runs").status_code for _ in range(4)] == [200, 200, 200, 429]
