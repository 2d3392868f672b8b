"""Quotas hold on every path that makes a run, a schedule or a pending signal, and under races.

The start quotas (running runs, starts per minute) are admitted where a run starts
(services/runs.py, services/quotas.py), so the API, signal-with-start, schedules firing and the
commands all meet them; racing starts against a quota of k start exactly k. Schedules are
bounded where they are created (the API, the admin), pending signals where a signal is kept.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from timers.models import Schedule
from timers.schedules import fire_due_schedules
from workflows.engine import sql
from workflows.errors import (
    PendingSignalsQuota,
    QuotaExceeded,
    RunningRunsQuota,
    StartsPerMinuteQuota,
)
from workflows.models import Organisation, QuotaUsage, Run, Signal
from workflows.services import quotas
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start
from workflows.services.signals import signal_send
from workflows.services.tenancy import api_key_create

from .concurrency import race
from .factories import IO_DEFINITION, SIGNAL_WAIT_DEFINITION
from .test_schedules import db_now, published, scheduled, staff_member

pytestmark = pytest.mark.django_db(transaction=True)

# What the running-runs count (sql.RUNNING_RUNS_UP_TO) reads, as captured (parameters bound).
COUNTS_RUNNING = "status = 'running' LIMIT"
assert COUNTS_RUNNING in sql.RUNNING_RUNS_UP_TO

# The middle of a minute: a starts-per-minute count never straddles two windows.
MID_MINUTE = 960_000_030.0


@pytest.fixture(autouse=True)
def pinned_minute(monkeypatch, settings) -> None:
    monkeypatch.setattr(quotas, "clock", lambda: MID_MINUTE)
    # The API's own starts throttle off: what is tested here is the quota where runs start.
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"api_key": None, "run_starts": None, "auth_failures": None},
    }


def limited(org: Organisation, **quota: int) -> Organisation:
    """The organisation with these quotas (the others: none), as a request would load it."""
    fields = {"running_runs": 0, "starts_per_minute": 0, **quota}
    Organisation.objects.filter(pk=org.pk).update(**{f"quota_{k}": v for k, v in fields.items()})
    return Organisation.objects.get(pk=org.pk)


def client_of(org: Organisation) -> APIClient:
    _, raw = api_key_create(org=org, name="k")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def start(org: Organisation, n: int, slug: str = "io") -> Any:
    """One start; the refusal, if refused."""
    try:
        return run_start(org=org, automation_slug=slug, run_input={"n": n}, start_key=f"k{n}")
    except QuotaExceeded as refused:
        return refused


# --- the start quotas, on every path --------------------------------------------------------------


def test_racing_starts_against_a_running_runs_quota_start_exactly_that_many(org) -> None:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    org = limited(org, running_runs=3)
    outcomes = race(12, lambda n: start(org, n))
    refused = [o for o in outcomes if isinstance(o, RunningRunsQuota)]
    assert len(refused) == 9, outcomes
    assert Run.objects.filter(org=org, status="running").count() == 3


def test_racing_starts_against_a_starts_per_minute_quota_start_exactly_that_many(org) -> None:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    org = limited(org, starts_per_minute=4)
    outcomes = race(10, lambda n: start(org, n))
    refused = [o for o in outcomes if isinstance(o, StartsPerMinuteQuota)]
    assert len(refused) == 6, outcomes
    assert refused[0].retry_after_seconds == 30  # the rest of the pinned minute
    assert Run.objects.filter(org=org).count() == 4


def test_the_api_is_refused_past_the_running_runs_quota(org) -> None:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    api = client_of(limited(org, running_runs=2))
    codes = [
        api.post("/api/v1/runs", {"automation": "io", "input": {"n": n}}, format="json")
        for n in range(4)
    ]
    assert [c.status_code for c in codes] == [201, 201, 429, 429]
    assert codes[2].json()["code"] == "quota_exceeded" and codes[2]["Retry-After"] == "30"


def test_signal_with_start_is_refused_past_the_running_runs_quota(org) -> None:
    """The reported case: ten signal-with-starts against a quota of five started ten."""
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    api = client_of(limited(org, running_runs=5))
    answers = [
        api.post("/api/v1/signals", {"name": "go", "id": f"s{n}", "start": {
            "automation": "io", "start_key": f"order-{n}", "input": {"n": n}}}, format="json")
        for n in range(10)
    ]  # fmt: skip
    assert [a.status_code for a in answers] == [201] * 5 + [429] * 5
    assert answers[5].json()["code"] == "quota_exceeded" and answers[5]["Retry-After"] == "30"
    assert Run.objects.filter(org=org).count() == 5
    assert Signal.objects.filter(org=org).count() == 5  # a refused start keeps no signal


def test_signal_with_start_counts_against_the_starts_per_minute_quota(org) -> None:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    org = limited(org, starts_per_minute=3)
    outcomes: list[bool | str] = []
    for n in range(5):
        begin = {"automation": "io", "start_key": f"order-{n}", "input": {}}
        try:
            sent = signal_send(org=org, name="go", identity=f"s{n}", start=begin)
            outcomes.append(sent.run_created)
        except StartsPerMinuteQuota as refused:
            outcomes.append(refused.code)
    assert outcomes == [True, True, True, "quota_exceeded", "quota_exceeded"]
    # A signal for a run that already started starts nothing: no quota applies to it.
    again = signal_send(org=org, name="go", identity="s9", start={
        "automation": "io", "start_key": "order-0", "input": {}})  # fmt: skip
    assert again.run_created is False


def test_schedules_firing_past_the_starts_quota_start_nothing_and_say_why(org) -> None:
    """Twenty every-minute schedules against a quota of five started twenty."""
    automation = published(org, "io", IO_DEFINITION)
    org = limited(org, starts_per_minute=5)
    for n in range(20):
        scheduled(automation, cron="* * * * *", name=f"every-minute-{n}")
    assert fire_due_schedules("test") == 5
    assert Run.objects.filter(org=org).count() == 5
    refused = Schedule.objects.exclude(last_error="")
    assert refused.count() == 15
    assert all("quota_exceeded" in s.last_error for s in refused)
    # Not tried again at every tick: claimed until the minute is over.
    assert all(s.claimed_until is not None and s.claimed_until > db_now() for s in refused)
    assert fire_due_schedules("test") == 0
    assert Run.objects.filter(org=org).count() == 5


def test_a_start_at_the_quota_whose_key_already_started_answers_with_its_run(org) -> None:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    org = limited(org, running_runs=1)
    first = run_start(org=org, automation_slug="io", run_input={}, start_key="once")
    again = run_start(org=org, automation_slug="io", run_input={}, start_key="once")
    assert (again.run_id, again.created) == (first.run_id, False)
    with pytest.raises(RunningRunsQuota):
        run_start(org=org, automation_slug="io", run_input={}, start_key="another")


def test_refusals_at_the_quota_do_not_count_the_runs_each_time(org) -> None:
    """A count that found the quota reached is kept (RECOUNT_SECONDS): a tenant hammering
    at its quota cannot make every refusal a count of its runs."""
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    org = limited(org, running_runs=2)
    for n in range(2):
        start(org, n)
    quotas.forget_running_counts()  # the next admission must count
    with CaptureQueriesContext(connection) as first:
        assert isinstance(start(org, 7), RunningRunsQuota)
    with CaptureQueriesContext(connection) as second:
        assert isinstance(start(org, 8), RunningRunsQuota)
    counts = [
        sum(COUNTS_RUNNING in q["sql"] for q in queries.captured_queries)
        for queries in (first, second)
    ]
    assert counts == [1, 0]


def test_finished_runs_free_their_slots_at_the_next_count(org) -> None:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    org = limited(org, running_runs=2)
    assert not isinstance(start(org, 0), QuotaExceeded)
    assert not isinstance(start(org, 1), QuotaExceeded)
    Run.objects.filter(org=org).update(status="succeeded")
    quotas.forget_running_counts()  # as RECOUNT_SECONDS later
    assert not isinstance(start(org, 2), QuotaExceeded)
    assert not isinstance(start(org, 3), QuotaExceeded)
    assert isinstance(start(org, 4), RunningRunsQuota)


def test_the_starts_window_is_the_database_minute_read_by_the_admitting_statement(
    org, monkeypatch
) -> None:
    """Unpinned, a start under a starts-per-minute quota counts in the database's minute
    without a round trip to read the clock first (sql.QUOTA_MINUTE); the refusal's
    Retry-After is the rest of that minute."""
    monkeypatch.setattr(quotas, "clock", None)
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    org = limited(org, starts_per_minute=2)
    for attempt in range(3):  # again, should the database's minute turn in the middle
        QuotaUsage.objects.filter(org=org).update(window=0, window_count=0)
        before = db_now().timestamp()
        assert not isinstance(start(org, 10 * attempt), QuotaExceeded)
        with CaptureQueriesContext(connection) as admitted:
            assert not isinstance(start(org, 10 * attempt + 1), QuotaExceeded)
        refused = start(org, 10 * attempt + 2)
        after = db_now().timestamp()
        if before // 60 == after // 60:
            break
    assert not any(q["sql"] == sql.DATABASE_NOW for q in admitted.captured_queries)
    assert isinstance(refused, StartsPerMinuteQuota)
    usage = QuotaUsage.objects.get(org=org, kind=quotas.STARTS)
    assert (usage.window, usage.window_count) == (before // 60, 2)
    assert 60 - after % 60 <= refused.retry_after_seconds <= 60 - before % 60 + 1


# --- schedules ----------------------------------------------------------------------------------


def test_schedules_past_the_quota_are_refused_by_the_api_and_racing_creations(org) -> None:
    published(org, "io", IO_DEFINITION)
    Organisation.objects.filter(pk=org.pk).update(quota_schedules=3)
    api = client_of(org)

    def create(n: int) -> int:
        body = {"name": f"s{n}", "automation": "io", "cron": "0 7 * * *", "timezone": "UTC"}
        return int(client_of(org).post("/api/v1/schedules", body, format="json").status_code)

    assert sorted(race(8, create)) == [201] * 3 + [409] * 5
    assert Schedule.objects.filter(org=org).count() == 3
    body = {"name": "late", "automation": "io", "cron": "0 7 * * *", "timezone": "UTC"}
    refused = api.post("/api/v1/schedules", body, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "quota_exceeded"
    assert "3 schedules" in refused.json()["detail"]


def test_schedules_past_the_quota_are_refused_by_the_admin(org) -> None:
    automation = published(org, "io", IO_DEFINITION)
    Organisation.objects.filter(pk=org.pk).update(quota_schedules=1)
    admin = staff_member(org)
    form = {"org": org.pk, "automation": automation.pk, "cron": "0 7 * * *", "timezone": "UTC",
            "input": "{}", "enabled": "on", "catch_up": "latest"}  # fmt: skip
    assert admin.post("/admin/timers/schedule/add/", {**form, "name": "one"}).status_code == 302
    refused = admin.post("/admin/timers/schedule/add/", {**form, "name": "two"})
    assert refused.status_code == 200  # the form again, with the reason
    assert "quota_exceeded" in str(refused.context["adminform"].form.non_field_errors())
    assert Schedule.objects.filter(org=org).count() == 1


# --- pending signals ----------------------------------------------------------------------------


def test_pending_signals_past_the_quota_are_refused_and_a_matched_one_is_taken(org) -> None:
    Organisation.objects.filter(pk=org.pk).update(quota_pending_signals=2)
    api = client_of(org)
    answers = [
        api.post("/api/v1/signals", {"name": "order.paid", "correlation": f"o-{n}"}, format="json")
        for n in range(4)
    ]
    assert [a.status_code for a in answers] == [201, 201, 429, 429]
    assert answers[2].json()["code"] == "quota_exceeded"
    assert "2 signals that no step waits for" in answers[2].json()["detail"]
    assert Signal.objects.filter(org=org).count() == 2
    # A signal that a waiting step takes is not kept: the quota does not refuse it.
    automation_publish_definition(org=org, slug="waits", definition=SIGNAL_WAIT_DEFINITION)
    run = run_start(org=org, automation_slug="waits", run_input={"order": "o-9"})
    taken = api.post("/api/v1/signals", {"name": "order.paid", "correlation": "o-9"},
                     format="json")  # fmt: skip
    assert taken.status_code == 201 and taken.json()["status"] == "consumed"
    assert Run.objects.get(pk=run.run_id).status == "succeeded"


def test_racing_pending_signals_against_the_quota_keep_exactly_that_many(org) -> None:
    Organisation.objects.filter(pk=org.pk).update(quota_pending_signals=4)
    org = Organisation.objects.get(pk=org.pk)

    def send(n: int) -> str:
        try:
            signal_send(org=org, name="order.paid", correlation=f"o-{n}")
        except PendingSignalsQuota as refused:
            return refused.code
        return "kept"

    assert sorted(race(10, send)) == ["kept"] * 4 + ["quota_exceeded"] * 6
    assert Signal.objects.filter(org=org).count() == 4


def test_an_inbound_email_reply_nobody_waits_for_meets_the_quota(org) -> None:
    Organisation.objects.filter(pk=org.pk).update(quota_pending_signals=1)
    api = client_of(org)
    replies = [
        api.post("/api/v1/inbound-email", {"message_id": f"<r{n}@x>", "in_reply_to": f"<m{n}@x>",
                                           "sender": "a@example.com", "text": "yes"},
                 format="json")
        for n in range(2)
    ]  # fmt: skip
    assert [r.status_code for r in replies] == [201, 429], [r.json() for r in replies]
    assert replies[1].json()["code"] == "quota_exceeded"


def test_signal_with_start_keeps_the_signal_of_the_run_it_started_past_the_pending_quota(
    org,
) -> None:
    """The pending-signals quota full, a signal-with-start still starts its run and keeps the
    signal for it (refused, the run would wait for a signal that was never kept); a second
    signal to that run, which started before, is held to the quota."""
    Organisation.objects.filter(pk=org.pk).update(quota_pending_signals=1)
    org = Organisation.objects.get(pk=org.pk)
    api = client_of(org)
    kept = api.post("/api/v1/signals", {"name": "order.paid", "correlation": "nobody"},
                    format="json")  # fmt: skip
    assert kept.status_code == 201  # the quota's one pending signal
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    start = {"automation": "io", "start_key": "order-1", "input": {"n": 1}}
    first = api.post("/api/v1/signals", {"name": "go", "id": "s1", "start": start},
                     format="json")  # fmt: skip
    assert first.status_code == 201, first.json()
    assert first.json()["run_created"] is True
    run = Run.objects.get(org=org, start_key="order-1")
    assert list(Signal.objects.filter(run_id=run.pk).values_list("identity", flat=True)) == ["s1"]
    second = api.post("/api/v1/signals", {"name": "go", "id": "s2", "start": start},
                      format="json")  # fmt: skip
    assert second.status_code == 429 and second.json()["code"] == "quota_exceeded"
    assert Signal.objects.filter(run_id=run.pk).count() == 1
