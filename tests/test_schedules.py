"""Scheduled starts: cron occurrences in a zone across daylight-saving changes, each occurrence
started once (by its start key, even across a crash between starting and moving on), the
catch-up policies after downtime, refusals recorded without stopping the others, and the
API and the admin: bad input named by field, organisations isolated, read-only keys."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

import timers.schedules as schedules
from timers.calendar import resolve_local
from timers.models import CatchUp, Schedule
from timers.schedules import (
    CATCH_UP_MAX,
    cron_problem,
    fire_due_schedules,
    latest_occurrence,
    next_occurrence,
    occurrences_to_start,
    start_key,
)
from workflows.code.registry import unregister
from workflows.models import Automation, Membership, Organisation, Run
from workflows.plugins.code import Context, publish_code_workflow, workflow
from workflows.services import quotas
from workflows.services.automations import automation_create, automation_publish_definition
from workflows.services.runs import run_start
from workflows.services.tenancy import api_key_create

from .factories import IO_DEFINITION, OrganisationFactory, linear_definition

BERLIN = ZoneInfo("Europe/Berlin")
SPRING_DAY = datetime(2026, 3, 29, tzinfo=UTC)  # Berlin: 02:00 CET -> 03:00 CEST
AUTUMN_DAY = datetime(2026, 10, 25, tzinfo=UTC)  # Berlin: 03:00 CEST -> 02:00 CET

db = pytest.mark.django_db
transactional = pytest.mark.django_db(transaction=True)


def berlin(instant: datetime) -> tuple[int, int, int, str | None]:
    local = instant.astimezone(BERLIN)
    return local.day, local.hour, local.minute, local.tzname()


def following(cron: str, zone: ZoneInfo, after: datetime, until: datetime) -> list[datetime]:
    found, at = [], after
    while (at := next_occurrence(cron, zone, at)) <= until:
        found.append(at)
    return found


# --- occurrences: pure, no database ------------------------------------------------------------


def test_a_time_in_the_spring_gap_moves_forward_by_the_gap() -> None:
    days = following(
        "30 2 * * *", BERLIN, SPRING_DAY - timedelta(days=2), SPRING_DAY + timedelta(days=2)
    )
    assert [berlin(at) for at in days] == [
        (27, 2, 30, "CET"),
        (28, 2, 30, "CET"),
        (29, 3, 30, "CEST"),
        (30, 2, 30, "CEST"),
    ]
    assert days[2] == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)


def test_a_time_in_the_autumn_fold_fires_once_at_its_first_occurrence() -> None:
    days = following(
        "30 2 * * *", BERLIN, AUTUMN_DAY - timedelta(hours=12), AUTUMN_DAY + timedelta(days=2)
    )
    assert [berlin(at) for at in days] == [
        (25, 2, 30, "CEST"),
        (26, 2, 30, "CET"),
    ]
    assert days[0] == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # summer time: the first


def test_several_times_an_hour_across_the_changes_each_instant_once() -> None:
    spring = following(
        "*/30 * * * *",
        BERLIN,
        datetime(2026, 3, 29, 0, 0, tzinfo=UTC),
        datetime(2026, 3, 29, 2, 0, tzinfo=UTC),
    )
    # 02:00 and 02:30 do not exist: they are 03:00 and 03:30, which also match: once each.
    assert [berlin(at)[1:3] for at in spring] == [(1, 30), (3, 0), (3, 30), (4, 0)]
    autumn = following(
        "*/30 * * * *",
        BERLIN,
        datetime(2026, 10, 24, 23, 50, tzinfo=UTC),
        datetime(2026, 10, 25, 2, 0, tzinfo=UTC),
    )
    # The repeated hour (02:00-02:59 CET) is the second occurrence of times already fired.
    assert [berlin(at)[1:] for at in autumn] == [
        (2, 0, "CEST"),
        (2, 30, "CEST"),
        (3, 0, "CET"),
    ]


def test_the_next_occurrence_after_an_instant_inside_a_changed_day_is_not_skipped() -> None:
    # Created at 03:10 CEST on the spring day: 02:30 moved to 03:30, still ahead.
    after = datetime(2026, 3, 29, 1, 10, tzinfo=UTC)
    assert berlin(next_occurrence("30 2 * * *", BERLIN, after)) == (29, 3, 30, "CEST")
    assert berlin(latest_occurrence("30 2 * * *", BERLIN, after + timedelta(hours=1)) or after) == (
        29,
        3,
        30,
        "CEST",
    )


@pytest.mark.parametrize("zone", ["Europe/Berlin", "Australia/Lord_Howe", "America/Santiago"])
@pytest.mark.parametrize("cron", ["*/20 * * * *", "30 2 * * *", "10,50 0-3 * * *", "0 0 * * *"])
def test_occurrences_are_every_matching_wall_time_resolved_by_the_policy(zone, cron) -> None:
    """Against a plain enumeration: every naive wall-clock time croniter matches, resolved
    with resolve_local, as a set of instants, around both of the year's changes."""
    tz = ZoneInfo(zone)
    for day in _change_days(tz, 2026):
        lo, hi = day - timedelta(days=1), day + timedelta(days=1)
        walls = croniter(cron, (lo - timedelta(days=2)).replace(tzinfo=None), ret_type=datetime)
        expected: set[datetime] = set()
        while (wall := walls.get_next()) < (hi + timedelta(days=1)).replace(tzinfo=None):
            expected.add(resolve_local(wall, tz))
        assert following(cron, tz, lo, hi) == sorted(a for a in expected if lo < a <= hi)
        probe = lo + timedelta(minutes=7)
        while probe < hi:
            assert latest_occurrence(cron, tz, probe) == max(a for a in expected if a <= probe)
            probe += timedelta(minutes=53)


def _change_days(tz: ZoneInfo, year: int) -> list[datetime]:
    """The UTC midnights before the zone's offset changes in ``year``."""
    days, at = [], datetime(year, 1, 1, tzinfo=UTC)
    while at.year == year:
        if at.astimezone(tz).utcoffset() != (at + timedelta(days=1)).astimezone(tz).utcoffset():
            days.append(at)
        at += timedelta(days=1)
    assert len(days) == 2, (tz, days)
    return days


def test_the_start_key_is_the_schedule_and_the_instant_in_utc() -> None:
    at = datetime(2026, 3, 29, 3, 30, tzinfo=BERLIN)
    assert start_key(7, at) == "schedule:7:2026-03-29T01:30:00Z"


@pytest.mark.parametrize(
    ("cron", "expected"),
    [
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("61 * * * *", "not a valid cron expression"),
        ("* * * *", "5 fields"),
        ("0 0 * * * *", "5 fields"),
        ("@daily", "nicknames"),
        ("R * * * *", "random or hashed"),
        ("H 9 * * *", "random or hashed"),
        ("", "required"),
        ("0 0 * * bogus", "not a valid cron expression"),
    ],
)
def test_impossible_rules_are_refused_with_the_reason(cron: str, expected: str) -> None:
    problem = cron_problem(cron)
    assert problem is not None and expected in problem, problem


@pytest.mark.parametrize("cron", ["30 9 * * mon-fri", "0 0 29 2 *", "0 0 L * *", "*/5 * * * *"])
def test_possible_rules_are_taken(cron: str) -> None:
    assert cron_problem(cron) is None


def test_the_catch_up_policies_choose_from_the_missed_occurrences() -> None:
    now = datetime(2026, 6, 1, 12, 10, tzinfo=UTC)
    missed = now - timedelta(days=3)  # hourly: 72 occurrences came due since
    plans = {
        policy: occurrences_to_start(
            cron="0 * * * *",
            zone="UTC",
            catch_up=policy,
            next_at=missed.replace(minute=0, second=0),
            now=now,
        )
        for policy in CatchUp.values
    }
    assert plans["latest"].starts == [datetime(2026, 6, 1, 12, tzinfo=UTC)]
    assert plans["none"].starts == []  # 12:00 is 10 minutes late: missed too
    for late in (timedelta(seconds=30), timedelta(minutes=5)):  # on time: started
        on_time = occurrences_to_start(
            cron="0 * * * *",
            zone="UTC",
            catch_up="none",
            next_at=missed,
            now=datetime(2026, 6, 1, 12, tzinfo=UTC) + late,
        )
        assert on_time.starts == [datetime(2026, 6, 1, 12, tzinfo=UTC)], late
    assert len(plans["all"].starts) == 73
    assert plans["all"].starts[0] == datetime(2026, 5, 29, 12, tzinfo=UTC)
    for policy in ("latest", "none", "all"):
        assert plans[policy].next_at == datetime(2026, 6, 1, 13, tzinfo=UTC), policy


# --- the sweep ----------------------------------------------------------------------------------


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        row = cursor.fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


def published(org: Organisation, slug: str = "nightly", definition: Any = None) -> Automation:
    automation_publish_definition(
        org=org, slug=slug, definition=definition or linear_definition("a")
    )
    return Automation.objects.get(org=org, slug=slug)


def scheduled(
    automation: Automation,
    *,
    cron: str = "*/5 * * * *",
    zone: str = "Europe/Berlin",
    catch_up: str = CatchUp.LATEST,
    next_at: datetime | None = None,
    name: str = "every-five",
    run_input: dict | None = None,
) -> Schedule:
    return Schedule.objects.create(
        org_id=automation.org_id,
        automation=automation,
        name=name,
        cron=cron,
        timezone=zone,
        catch_up=catch_up,
        input=run_input or {"from": "schedule"},
        next_at=next_at or _latest(cron, zone),
    )


def _latest(cron: str, zone: str) -> datetime:
    latest = latest_occurrence(cron, zone, db_now())
    assert latest is not None
    return latest


def runs_of(schedule: Schedule) -> list[Run]:
    return list(
        Run.objects.filter(start_key__startswith=f"schedule:{schedule.pk}:").order_by("start_key")
    )


@transactional
def test_a_due_occurrence_starts_once(org) -> None:
    schedule = scheduled(published(org))
    due = schedule.next_at
    assert fire_due_schedules("test") == 1
    assert fire_due_schedules("test") == 0
    [run] = runs_of(schedule)
    assert run.start_key == start_key(schedule.pk, due)
    assert run.input == {"from": "schedule"} and run.status == "succeeded"
    schedule.refresh_from_db()
    assert schedule.next_at == next_occurrence(schedule.cron, BERLIN, due) > db_now()
    assert (schedule.last_started_at, schedule.last_run_id) == (due, run.pk)
    assert schedule.claimed_until is None and schedule.last_error == ""


@transactional
def test_a_schedule_not_yet_due_or_disabled_starts_nothing(org) -> None:
    automation = published(org)
    soon = scheduled(automation, name="soon")
    Schedule.objects.filter(pk=soon.pk).update(next_at=db_now() + timedelta(minutes=1))
    off = scheduled(automation, name="off")
    Schedule.objects.filter(pk=off.pk).update(enabled=False)
    assert fire_due_schedules("test") == 0
    assert Run.objects.count() == 0


@transactional
def test_a_crash_between_starting_and_moving_on_does_not_start_it_twice(org, monkeypatch) -> None:
    schedule = scheduled(published(org))
    due = schedule.next_at

    def crash(*args: object) -> None:
        raise RuntimeError("killed before next_at moved")

    monkeypatch.setattr(schedules, "_advance", crash)
    assert fire_due_schedules("test") == 0  # the failure is caught: the sweep goes on
    assert len(runs_of(schedule)) == 1  # the run was started (its own transaction) ...
    schedule.refresh_from_db()
    assert schedule.next_at == due  # ... and the schedule did not move on
    assert "killed before next_at moved" in schedule.last_error
    assert schedule.claimed_until is not None
    assert fire_due_schedules("test") == 0  # still claimed by the one that "died"
    monkeypatch.undo()
    Schedule.objects.filter(pk=schedule.pk).update(claimed_until=db_now())  # the claim lapses
    assert fire_due_schedules("test") == 0  # the same key: the run it started, not a new one
    [run] = runs_of(schedule)
    schedule.refresh_from_db()
    assert schedule.next_at > db_now()
    assert schedule.last_run_id == run.pk and schedule.claimed_until is None


@transactional
def test_after_downtime_latest_starts_only_the_most_recent_missed(org) -> None:
    now = db_now()
    schedule = scheduled(
        published(org), next_at=next_occurrence("*/5 * * * *", BERLIN, now - timedelta(days=2))
    )
    assert fire_due_schedules("test") == 1
    [run] = runs_of(schedule)
    latest = latest_occurrence(schedule.cron, BERLIN, db_now())
    assert latest is not None and run.start_key == start_key(schedule.pk, latest)
    schedule.refresh_from_db()
    assert schedule.next_at > db_now()
    assert fire_due_schedules("test") == 0


@transactional
def test_after_downtime_all_starts_every_missed_bounded_per_tick(org) -> None:
    first = next_occurrence("0 * * * *", BERLIN, db_now() - timedelta(days=5))  # ~120 missed
    schedule = scheduled(published(org), cron="0 * * * *", catch_up=CatchUp.ALL, next_at=first)
    assert fire_due_schedules("test") == CATCH_UP_MAX  # bounded
    ticks = [fire_due_schedules("test") for _ in range(3)]
    assert ticks[0] > 0 and ticks[-1] == 0, ticks
    keys = [run.start_key for run in runs_of(schedule)]
    expected, at = [], first
    while at <= db_now():
        expected.append(start_key(schedule.pk, at))
        at = next_occurrence(schedule.cron, BERLIN, at)
    assert len(expected) > CATCH_UP_MAX
    assert sorted(keys) == sorted(expected)  # every missed occurrence, once each
    schedule.refresh_from_db()
    assert schedule.next_at == at > db_now()


@transactional
def test_after_downtime_none_skips_the_missed_and_waits_for_the_next(org) -> None:
    now = db_now()
    cron = f"{(now.minute + 30) % 60} * * * *"  # hourly; the latest was half an hour ago
    schedule = scheduled(
        published(org),
        cron=cron,
        catch_up=CatchUp.NONE,
        next_at=next_occurrence(cron, BERLIN, now - timedelta(days=2)),
    )
    assert fire_due_schedules("test") == 0
    assert runs_of(schedule) == []
    schedule.refresh_from_db()
    assert schedule.next_at == next_occurrence(cron, BERLIN, now) > db_now()


@transactional
def test_none_still_starts_an_occurrence_that_is_on_time(org) -> None:
    schedule = scheduled(published(org), cron="* * * * *", catch_up=CatchUp.NONE)
    assert db_now() - schedule.next_at < timedelta(minutes=1)
    assert fire_due_schedules("test") == 1


@transactional
def test_a_refused_start_is_recorded_and_the_other_schedules_go_on(org) -> None:
    never_published = automation_create(org=org, slug="draft-only")
    broken = scheduled(never_published, name="a-broken")
    working = scheduled(published(org), name="b-working")
    assert fire_due_schedules("test") == 1
    assert len(runs_of(working)) == 1 and runs_of(broken) == []
    broken.refresh_from_db()
    assert "no_published_version" in broken.last_error and broken.last_error_at is not None
    assert broken.next_at > db_now()  # refused for good: skipped
    working.refresh_from_db()
    assert working.last_error == ""


@transactional
def test_a_start_that_meets_a_lock_timeout_is_tried_again_not_recorded_as_an_error(org) -> None:
    """The database's passing trouble (here a lock timeout: another transaction holds the
    organisation's row, which the run's insert must share) is not the schedule's error: it
    is not recorded, and the same occurrence starts once the claim lapses."""
    import threading

    from django.db import transaction

    schedule = scheduled(published(org))
    held, release = threading.Event(), threading.Event()

    def hold_the_organisation() -> None:
        try:
            with transaction.atomic():
                Organisation.objects.select_for_update().get(pk=org.pk)
                held.set()
                release.wait(60)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_organisation, daemon=True)
    holder.start()
    try:
        assert held.wait(30)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        assert fire_due_schedules("test") == 0
    finally:
        release.set()
        holder.join(timeout=30)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    schedule.refresh_from_db()
    assert (schedule.last_error, schedule.last_started_at) == ("", None)
    Schedule.objects.filter(pk=schedule.pk).update(claimed_until=None)  # as if it lapsed
    assert fire_due_schedules("test") == 1
    assert len(runs_of(schedule)) == 1


@transactional
def test_a_start_refused_by_the_running_runs_quota_is_tried_again_with_the_same_key(org) -> None:
    io = published(org, "io", IO_DEFINITION)
    run_start(org=org, automation_slug="io", run_input={}, start_key="holds-the-quota")
    Organisation.objects.filter(pk=org.pk).update(quota_running_runs=1)
    quotas.forget_running_counts()
    schedule = scheduled(io)
    due = schedule.next_at
    try:
        assert fire_due_schedules("test") == 0
        schedule.refresh_from_db()
        assert "quota_exceeded" in schedule.last_error
        assert schedule.next_at == due  # not skipped: tried again ...
        assert schedule.claimed_until is not None and schedule.claimed_until > db_now()
        assert fire_due_schedules("test") == 0  # ... after a while, not at every tick
        Organisation.objects.filter(pk=org.pk).update(quota_running_runs=None)
        quotas.forget_running_counts()
        Schedule.objects.filter(pk=schedule.pk).update(claimed_until=db_now())
        assert fire_due_schedules("test") == 1
        [run] = runs_of(schedule)
        assert run.start_key == start_key(schedule.pk, due)
    finally:
        quotas.forget_running_counts()


@transactional
def test_an_edit_while_it_starts_is_not_overwritten(org, monkeypatch) -> None:
    schedule = scheduled(published(org))
    moved = db_now() + timedelta(days=7)
    real = schedules._advance

    def edited_meanwhile(*args: Any) -> None:
        Schedule.objects.filter(pk=schedule.pk).update(next_at=moved)  # a PATCH, say
        real(*args)

    monkeypatch.setattr(schedules, "_advance", edited_meanwhile)
    assert fire_due_schedules("test") == 1
    schedule.refresh_from_db()
    assert schedule.next_at == moved and schedule.claimed_until is None


# --- the API ------------------------------------------------------------------------------------


def client_for(org: Organisation, *, read_only: bool = False) -> APIClient:
    _, raw = api_key_create(org=org, name="reader" if read_only else "writer", read_only=read_only)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


BODY = {
    "name": "nightly-report",
    "automation": "nightly",
    "cron": "30 2 * * *",
    "timezone": "Europe/Berlin",
    "input": {"report": "daily"},
}


@db
def test_create_read_list_change_and_delete_a_schedule(org, api) -> None:
    published(org)
    created = api.post("/api/v1/schedules", BODY, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert {k: body[k] for k in BODY} == BODY
    assert (body["enabled"], body["catch_up"], body["last_started_at"]) == (True, "latest", None)
    next_at = datetime.fromisoformat(body["next_at"])
    assert next_at > db_now() and next_at.astimezone(BERLIN).hour in (2, 3)
    assert api.get("/api/v1/schedules/nightly-report").json()["next_at"] == body["next_at"]
    assert api.get("/api/v1/schedules/nightly-report/").status_code == 200  # trailing slash
    listed = api.get("/api/v1/schedules/").json()
    assert [s["name"] for s in listed["results"]] == ["nightly-report"]
    assert api.get("/api/v1/schedules?enabled=false").json()["results"] == []
    changed = api.patch(
        "/api/v1/schedules/nightly-report",
        {"cron": "0  9 * * mon-fri", "timezone": "America/New_York"},
        format="json",
    )
    assert changed.status_code == 200, changed.json()
    moved = datetime.fromisoformat(changed.json()["next_at"])
    assert changed.json()["cron"] == "0 9 * * mon-fri"
    assert moved.astimezone(ZoneInfo("America/New_York")).hour == 9
    assert api.delete("/api/v1/schedules/nightly-report").status_code == 204
    assert api.get("/api/v1/schedules/nightly-report").status_code == 404
    assert not Schedule.objects.exists()


@db
@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"cron": "every day at nine"}, "cron", "5 fields"),
        ({"cron": "61 * * * *"}, "cron", "not a valid cron expression"),
        ({"cron": "0 0 30 2 *"}, "cron", "never fires"),
        ({"timezone": "Mars/Olympus"}, "timezone", "unknown time zone"),
        ({"input": ["not", "an", "object"]}, "input", "JSON object"),
        ({"input": "text"}, "input", "JSON object"),
        ({"automation": "missing"}, "automation", "No automation"),
        ({"catch_up": "some"}, "catch_up", "latest, all, none"),
        ({"name": "has spaces"}, "name", "letters, digits"),
        ({"timezon": "UTC"}, "timezon", "Unknown field"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(org, api, change, field, says) -> None:
    published(org)
    response = api.post("/api/v1/schedules", {**BODY, **change}, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "invalid_input"
    assert list(body["errors"]) == [field], body
    assert says in " ".join(body["errors"][field]), body
    assert not Schedule.objects.exists()
    if field != "name":  # the same checks when it changes
        assert api.post("/api/v1/schedules", BODY, format="json").status_code == 201
        patched = api.patch(f"/api/v1/schedules/{BODY['name']}", change, format="json")
        assert patched.status_code == 400 and list(patched.json()["errors"]) == [field]


COUNTED = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}


@workflow("code-counted", version=1, input_schema=COUNTED)
def counted(ctx: Context, run_input: dict[str, Any]) -> int:
    return int(run_input["n"])


@db
def test_a_schedule_of_a_code_workflow_is_checked_as_its_starts_are(org, api) -> None:
    publish_code_workflow(org=org, name="code-counted", version=1)
    body = {**BODY, "automation": "code-counted", "input": {"n": "many"}}
    refused = api.post("/api/v1/schedules", body, format="json")
    assert refused.status_code == 400, refused.json()
    assert refused.json()["code"] == "invalid_input"
    assert "'many' is not of type 'integer'" in json.dumps(refused.json())
    assert not Schedule.objects.exists()

    made = api.post("/api/v1/schedules", {**body, "input": {"n": 3}}, format="json")
    assert made.status_code == 201, made.json()
    patched = api.patch(f"/api/v1/schedules/{BODY['name']}", {"input": {}}, format="json")
    assert patched.status_code == 400 and patched.json()["code"] == "invalid_input"
    assert Schedule.objects.get().input == {"n": 3}

    # Narrowed to another organisation (a later deploy): a new schedule is refused, as a
    # start is (the existing one's occurrences are refused when they fire).
    unregister("code-counted", 1)
    workflow("code-counted", version=1, organisations=["elsewhere"],
             input_schema={"type": "object"})(counted)  # fmt: skip
    try:
        narrowed = api.post("/api/v1/schedules", {**body, "name": "again", "input": {"n": 1}},
                            format="json")  # fmt: skip
        assert narrowed.status_code == 403, narrowed.json()
        assert narrowed.json()["code"] == "workflow_not_allowed"
        assert Schedule.objects.count() == 1
    finally:
        unregister("code-counted", 1)
        workflow("code-counted", version=1, input_schema=COUNTED)(counted)


@db
def test_an_input_over_the_run_input_limit_is_refused(org, api, settings) -> None:
    published(org)
    settings.WAYMARK = {**settings.WAYMARK, "MAX_INPUT_BYTES": 100}
    response = api.post("/api/v1/schedules", {**BODY, "input": {"text": "x" * 200}}, format="json")
    assert response.status_code == 400 and list(response.json()["errors"]) == ["input"]


@db
def test_a_taken_name_is_a_409_and_the_name_is_fixed(org, api) -> None:
    published(org)
    assert api.post("/api/v1/schedules", BODY, format="json").status_code == 201
    again = api.post("/api/v1/schedules", BODY, format="json")
    assert again.status_code == 409 and again.json()["code"] == "already_exists"
    renamed = api.patch("/api/v1/schedules/nightly-report", {"name": "x"}, format="json")
    assert renamed.status_code == 400 and "Cannot be changed" in renamed.json()["errors"]["name"][0]


@db
def test_enabling_again_counts_from_now(org, api) -> None:
    schedule = scheduled(published(org))
    Schedule.objects.filter(pk=schedule.pk).update(enabled=False)
    enabled = api.patch(f"/api/v1/schedules/{schedule.name}", {"enabled": True}, format="json")
    assert enabled.status_code == 200
    assert datetime.fromisoformat(enabled.json()["next_at"]) > schedule.next_at


@db
def test_organisations_see_and_change_only_their_own(org, api, other_org, other_api) -> None:
    published(org)
    published(other_org)
    assert api.post("/api/v1/schedules", BODY, format="json").status_code == 201
    url = f"/api/v1/schedules/{BODY['name']}"
    for response in (
        other_api.get(url),
        other_api.patch(url, {"enabled": False}, format="json"),
        other_api.delete(url),
    ):
        assert response.status_code == 404 and response.json()["code"] == "unknown_schedule"
    assert other_api.get("/api/v1/schedules").json()["results"] == []
    # The same name in another organisation is another schedule.
    assert other_api.post("/api/v1/schedules", BODY, format="json").status_code == 201
    assert Schedule.objects.get(org=org).enabled
    # Another organisation's automation cannot be named.
    automation_create(org=other_org, slug="theirs")
    theirs = api.post(
        "/api/v1/schedules", {**BODY, "name": "x", "automation": "theirs"}, format="json"
    )
    assert theirs.status_code == 400 and list(theirs.json()["errors"]) == ["automation"]


@db
def test_a_read_only_key_reads_and_cannot_write(org, api) -> None:
    published(org)
    assert api.post("/api/v1/schedules", BODY, format="json").status_code == 201
    reader = client_for(org, read_only=True)
    url = f"/api/v1/schedules/{BODY['name']}"
    assert reader.get(url).status_code == 200
    assert reader.get("/api/v1/schedules").status_code == 200
    for response in (
        reader.post("/api/v1/schedules", {**BODY, "name": "other"}, format="json"),
        reader.patch(url, {"enabled": False}, format="json"),
        reader.delete(url),
    ):
        assert response.status_code == 403 and response.json()["code"] == "read_only_key"
    assert Schedule.objects.get().enabled


@db
def test_an_unknown_query_parameter_is_refused(api) -> None:
    response = api.get("/api/v1/schedules?enabeld=true")
    assert response.status_code == 400 and response.json()["code"] == "invalid_query"


# --- the model and the admin --------------------------------------------------------------------


@db
def test_the_model_refuses_what_the_api_refuses(org) -> None:
    from django.core.exceptions import ValidationError

    bad = Schedule(
        org=org,
        automation=published(org),
        name="x",
        cron="0 0 30 2 *",
        timezone="Nowhere/City",
        input=[1],
    )
    with pytest.raises(ValidationError) as refused:
        bad.full_clean()
    assert set(refused.value.message_dict) >= {"cron", "timezone", "input"}


def staff_member(*orgs: Organisation) -> Client:
    user = User.objects.create_user("scheduler", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="timers"))
    for org in orgs:
        Membership.objects.create(user=user, org=org)
    client = Client()
    client.force_login(user)
    return client


@db
def test_the_admin_shows_and_changes_only_the_users_organisations(org, other_org) -> None:
    mine, theirs = (
        scheduled(published(org), name="mine"),
        scheduled(published(other_org), name="theirs"),
    )
    admin = staff_member(org)
    listing = admin.get("/admin/timers/schedule/")
    assert listing.status_code == 200
    assert b"mine" in listing.content and b"theirs" not in listing.content
    assert admin.get(f"/admin/timers/schedule/{theirs.pk}/change/").status_code == 404
    page = admin.get(f"/admin/timers/schedule/{mine.pk}/change/")
    assert page.status_code == 200
    form = {
        "automation": mine.automation_id,
        "cron": "0 0 30 2 *",
        "timezone": "Mars/Olympus",
        "input": "{}",
        "enabled": "on",
        "catch_up": "latest",
    }
    refused = admin.post(f"/admin/timers/schedule/{mine.pk}/change/", form)
    assert refused.status_code == 200  # the form again, with its errors
    errors = refused.context["adminform"].form.errors
    assert "never fires" in errors["cron"][0] and "unknown time zone" in errors["timezone"][0]
    form |= {"cron": "0 7 * * *", "timezone": "Asia/Tokyo"}
    saved = admin.post(f"/admin/timers/schedule/{mine.pk}/change/", form)
    assert saved.status_code == 302
    mine.refresh_from_db()
    assert (mine.cron, mine.next_at.astimezone(ZoneInfo("Asia/Tokyo")).hour) == ("0 7 * * *", 7)


@db
def test_the_admin_adds_a_schedule_with_its_first_occurrence(org) -> None:
    automation = published(org)
    admin = staff_member(org)
    form = {
        "org": org.pk,
        "automation": automation.pk,
        "name": "morning",
        "cron": "0 7 * * *",
        "timezone": "UTC",
        "input": '{"a": 1}',
        "enabled": "on",
        "catch_up": "all",
    }
    assert admin.post("/admin/timers/schedule/add/", form).status_code == 302
    added = Schedule.objects.get(name="morning")
    assert added.next_at > db_now() and added.next_at.hour == 7 and added.input == {"a": 1}
    other = OrganisationFactory.create()
    theirs = published(other, "theirs")
    form |= {"name": "sneaky", "automation": theirs.pk}
    assert admin.post("/admin/timers/schedule/add/", form).status_code == 200  # not a choice
    root = Client()
    root.force_login(User.objects.create_superuser("root", password="pw"))
    mixed = root.post("/admin/timers/schedule/add/", form)  # a superuser sees every automation
    assert mixed.status_code == 200
    assert "organisation" in mixed.context["adminform"].form.errors["automation"][0]
    assert not Schedule.objects.filter(name="sneaky").exists()
