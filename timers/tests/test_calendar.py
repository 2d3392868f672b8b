"""timers.calendar: wall-clock times in IANA zones, weekly rules, DST gaps and folds, spread.

Pure functions: no database. The DST dates used here are checked against the tz database in
the first tests, so a wrong premise fails loudly rather than making a test pass vacuously.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from timers.calendar import (
    FOLD_POLICY,
    GAP_POLICY,
    WeeklyRule,
    instant_at,
    next_occurrence,
    resolve_local,
    spread_offset,
    zone_named,
)

BERLIN = zone_named("Europe/Berlin")
NEW_YORK = zone_named("America/New_York")
KOLKATA = zone_named("Asia/Kolkata")
ADELAIDE = zone_named("Australia/Adelaide")
AUCKLAND = zone_named("Pacific/Auckland")
APIA = zone_named("Pacific/Apia")


def wall(text: str) -> datetime:
    """A naive wall-clock datetime."""
    return datetime.fromisoformat(text)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def rule(time: str, *days: str) -> WeeklyRule:
    definition: dict[str, Any] = {"time": time}
    if days:
        definition["weekdays"] = list(days)
    return WeeklyRule.from_definition(definition)


def assert_utc(value: datetime, expected: str) -> None:
    assert value.tzinfo is UTC
    assert value == utc(expected), f"{value.isoformat()} != {expected}Z"


# --- the premises: the dates really are the DST days and weekdays the tests say -------------


@pytest.mark.parametrize(
    ("zone_name", "day", "before", "after"),
    [
        ("Europe/Berlin", "2026-03-29", 1.0, 2.0),  # spring forward 02:00 -> 03:00
        ("Europe/Berlin", "2026-10-25", 2.0, 1.0),  # fall back 03:00 -> 02:00
        ("America/New_York", "2026-03-08", -5.0, -4.0),
        ("America/New_York", "2026-11-01", -4.0, -5.0),
        ("Australia/Adelaide", "2026-10-04", 9.5, 10.5),  # spring forward 02:00 -> 03:00
        ("Australia/Adelaide", "2026-04-05", 10.5, 9.5),  # fall back 03:00 -> 02:00
    ],
)
def test_premise_dst_days(zone_name: str, day: str, before: float, after: float) -> None:
    zone = zone_named(zone_name)
    start = wall(f"{day}T00:00").replace(tzinfo=zone)
    end = wall(f"{day}T12:00").replace(tzinfo=zone)
    assert start.utcoffset() == timedelta(hours=before)
    assert end.utcoffset() == timedelta(hours=after)
    assert date.fromisoformat(day).weekday() == 6  # all of them are Sundays


def test_premise_weekdays_at_the_year_turn() -> None:
    assert date(2026, 12, 31).weekday() == 3  # Thursday
    assert date(2027, 1, 1).weekday() == 4  # Friday
    assert date(2027, 1, 4).weekday() == 0  # Monday


def test_policy_constants() -> None:
    assert GAP_POLICY == "forward"
    assert FOLD_POLICY == "first"


# --- resolve_local -----------------------------------------------------------------------------


def test_berlin_spring_gap_moves_forward_by_the_gap() -> None:
    resolved = resolve_local(wall("2026-03-29T02:30"), BERLIN)
    assert_utc(resolved, "2026-03-29T01:30")
    assert resolved.astimezone(BERLIN).replace(tzinfo=None) == wall("2026-03-29T03:30")
    # The first minute of the gap is 03:00 CEST; the minute before it is still CET.
    assert_utc(resolve_local(wall("2026-03-29T02:00"), BERLIN), "2026-03-29T01:00")
    assert_utc(resolve_local(wall("2026-03-29T01:59"), BERLIN), "2026-03-29T00:59")
    assert_utc(resolve_local(wall("2026-03-29T03:00"), BERLIN), "2026-03-29T01:00")


def test_berlin_spring_day_after_the_gap_is_unaffected() -> None:
    assert_utc(resolve_local(wall("2026-03-29T09:00"), BERLIN), "2026-03-29T07:00")
    assert_utc(resolve_local(wall("2026-03-28T09:00"), BERLIN), "2026-03-28T08:00")


def test_berlin_autumn_fold_takes_the_first_occurrence() -> None:
    resolved = resolve_local(wall("2026-10-25T02:30"), BERLIN)
    assert_utc(resolved, "2026-10-25T00:30")  # CEST, not the CET 01:30Z an hour later
    assert resolved.astimezone(BERLIN).utcoffset() == timedelta(hours=2)
    # The fold flag of the input does not pick the second occurrence.
    assert_utc(resolve_local(wall("2026-10-25T02:30").replace(fold=1), BERLIN), "2026-10-25T00:30")
    assert_utc(resolve_local(wall("2026-10-25T03:00"), BERLIN), "2026-10-25T02:00")
    assert_utc(resolve_local(wall("2026-10-25T09:00"), BERLIN), "2026-10-25T08:00")


def test_new_york_spring_gap_and_autumn_fold() -> None:
    assert_utc(resolve_local(wall("2026-03-08T02:30"), NEW_YORK), "2026-03-08T07:30")  # 03:30 EDT
    assert_utc(resolve_local(wall("2026-03-08T09:00"), NEW_YORK), "2026-03-08T13:00")
    assert_utc(resolve_local(wall("2026-11-01T01:30"), NEW_YORK), "2026-11-01T05:30")  # first, EDT
    assert_utc(resolve_local(wall("2026-11-01T09:00"), NEW_YORK), "2026-11-01T14:00")


def test_half_hour_offset_without_dst() -> None:
    assert_utc(resolve_local(wall("2026-03-29T09:00"), KOLKATA), "2026-03-29T03:30")
    assert_utc(resolve_local(wall("2026-07-01T02:00"), KOLKATA), "2026-06-30T20:30")


def test_half_hour_offset_with_dst_adelaide() -> None:
    # Spring (October): 02:00 ACST jumps to 03:00 ACDT; 02:30 becomes 03:30 ACDT (+10:30).
    gap = resolve_local(wall("2026-10-04T02:30"), ADELAIDE)
    assert_utc(gap, "2026-10-03T17:00")
    assert gap.astimezone(ADELAIDE).replace(tzinfo=None) == wall("2026-10-04T03:30")
    assert_utc(resolve_local(wall("2026-10-04T09:00"), ADELAIDE), "2026-10-03T22:30")
    # Autumn (April): 03:00 ACDT goes back to 02:00 ACST; 02:30 takes the first (+10:30).
    assert_utc(resolve_local(wall("2026-04-05T02:30"), ADELAIDE), "2026-04-04T16:00")
    assert_utc(resolve_local(wall("2026-04-05T09:00"), ADELAIDE), "2026-04-04T23:30")


def test_a_skipped_calendar_day_moves_forward_a_whole_day() -> None:
    # Samoa skipped Friday 2011-12-30 (UTC-10 -> UTC+14): the gap is 24 hours long.
    resolved = resolve_local(wall("2011-12-30T09:00"), APIA)
    assert resolved.astimezone(APIA).replace(tzinfo=None) == wall("2011-12-31T09:00")
    assert_utc(resolved, "2011-12-30T19:00")


def test_next_occurrence_on_a_skipped_day_follows_the_gap_policy() -> None:
    # Friday 09:00 on the skipped day is Saturday 09:00 local; found from before that day,
    # and also from Saturday 08:00 local, when the skipped Friday is already "yesterday".
    friday_0900 = rule("09:00", "fri")
    assert_utc(next_occurrence(friday_0900, APIA, utc("2011-12-29T00:00")), "2011-12-30T19:00")
    assert_utc(next_occurrence(friday_0900, APIA, utc("2011-12-30T18:00")), "2011-12-30T19:00")
    assert_utc(next_occurrence(friday_0900, APIA, utc("2011-12-30T19:00")), "2012-01-05T19:00")


def test_resolve_local_refuses_an_aware_datetime() -> None:
    with pytest.raises(ValueError, match="naive"):
        resolve_local(utc("2026-03-29T02:30"), BERLIN)


# --- next_occurrence --------------------------------------------------------------------------


def test_next_occurrence_in_the_berlin_gap_stays_on_that_day() -> None:
    at_0230 = rule("02:30")
    found = next_occurrence(at_0230, BERLIN, utc("2026-03-28T12:00"))
    assert_utc(found, "2026-03-29T01:30")
    assert found.astimezone(BERLIN).date() == date(2026, 3, 29)
    assert_utc(next_occurrence(at_0230, BERLIN, found), "2026-03-30T00:30")  # CEST from now on


def test_next_occurrence_fires_once_on_the_fold_day() -> None:
    at_0230 = rule("02:30")
    first = next_occurrence(at_0230, BERLIN, utc("2026-10-24T12:00"))
    assert_utc(first, "2026-10-25T00:30")
    # Not again at the second 02:30 (01:30Z) that day: the next is Monday 02:30 CET.
    assert_utc(next_occurrence(at_0230, BERLIN, first), "2026-10-26T01:30")
    # Even from between the two 02:30s.
    assert_utc(next_occurrence(at_0230, BERLIN, utc("2026-10-25T01:00")), "2026-10-26T01:30")


def test_next_occurrence_berlin_sunday_0900_across_the_spring_change() -> None:
    sunday_0900 = rule("09:00", "sun")
    first = next_occurrence(sunday_0900, BERLIN, utc("2026-03-28T12:00"))
    assert_utc(first, "2026-03-29T07:00")
    assert_utc(next_occurrence(sunday_0900, BERLIN, first), "2026-04-05T07:00")
    assert_utc(next_occurrence(sunday_0900, BERLIN, utc("2026-03-22T07:59")), "2026-03-22T08:00")


def test_next_occurrence_new_york_dst_days() -> None:
    assert_utc(
        next_occurrence(rule("02:30"), NEW_YORK, utc("2026-03-08T00:00")), "2026-03-08T07:30"
    )
    first = next_occurrence(rule("01:30"), NEW_YORK, utc("2026-11-01T00:00"))
    assert_utc(first, "2026-11-01T05:30")
    assert_utc(next_occurrence(rule("01:30"), NEW_YORK, first), "2026-11-02T06:30")  # EST


def test_next_occurrence_adelaide_dst_days() -> None:
    after = utc("2026-10-03T00:00")  # Saturday morning in Adelaide
    assert_utc(next_occurrence(rule("02:30", "sun"), ADELAIDE, after), "2026-10-03T17:00")
    after = utc("2026-04-04T00:00")
    first = next_occurrence(rule("02:30", "sun"), ADELAIDE, after)
    assert_utc(first, "2026-04-04T16:00")
    assert_utc(next_occurrence(rule("02:30", "sun"), ADELAIDE, first), "2026-04-11T17:00")


def test_next_occurrence_uses_the_local_weekday_in_a_half_hour_zone() -> None:
    # Monday 02:00 in Kolkata is Sunday 20:30 UTC.
    assert_utc(
        next_occurrence(rule("02:00", "mon"), KOLKATA, utc("2026-03-29T00:00")),
        "2026-03-29T20:30",
    )


def test_monday_0900_after_new_years_eve_lands_in_2027() -> None:
    monday_0900 = rule("09:00", "mon")
    new_years_eve = utc("2026-12-31T12:00")  # Thursday
    assert_utc(next_occurrence(monday_0900, BERLIN, new_years_eve), "2027-01-04T08:00")
    assert_utc(next_occurrence(monday_0900, NEW_YORK, new_years_eve), "2027-01-04T14:00")
    # From Monday 2026-12-28 after its 09:00: also the Monday in 2027.
    assert_utc(next_occurrence(monday_0900, BERLIN, utc("2026-12-28T08:00")), "2027-01-04T08:00")


def test_year_turn_east_of_utc_where_the_local_date_is_already_2027() -> None:
    after = utc("2026-12-31T12:00")  # Thursday in UTC; Friday 2027-01-01 01:00 in Auckland
    assert after.astimezone(AUCKLAND).date() == date(2027, 1, 1)
    friday = next_occurrence(rule("09:00", "fri"), AUCKLAND, after)
    assert_utc(friday, "2026-12-31T20:00")  # 2027-01-01 09:00 NZDT, still 2026 in UTC
    assert friday.astimezone(AUCKLAND).date() == date(2027, 1, 1)
    # Auckland's Thursday 2026-12-31 is over: the next Thursday is 2027-01-07 local.
    assert_utc(next_occurrence(rule("09:00", "thu"), AUCKLAND, after), "2027-01-06T20:00")


def test_year_turn_west_of_utc_where_the_local_date_is_still_2026() -> None:
    after = utc("2027-01-01T02:00")  # Friday in UTC; Thursday 2026-12-31 21:00 in New York
    assert_utc(next_occurrence(rule("22:00", "thu"), NEW_YORK, after), "2027-01-01T03:00")
    assert_utc(next_occurrence(rule("09:00", "fri"), NEW_YORK, after), "2027-01-01T14:00")


def test_next_occurrence_is_strictly_after() -> None:
    daily_0900 = rule("09:00")
    occurrence = utc("2026-06-10T07:00")  # 09:00 CEST
    just_before = occurrence - timedelta(microseconds=1)
    assert next_occurrence(daily_0900, BERLIN, just_before) == occurrence
    assert_utc(next_occurrence(daily_0900, BERLIN, occurrence), "2026-06-11T07:00")


def test_next_occurrence_respects_the_weekday_list() -> None:
    mon_wed_fri = rule("09:00", "fri", "mon", "wed")
    assert mon_wed_fri.weekdays == (0, 2, 4)
    assert date(2026, 6, 1).weekday() == 0
    found, after = [], utc("2026-06-01T00:00")
    for _ in range(6):
        after = next_occurrence(mon_wed_fri, BERLIN, after)
        found.append(after.astimezone(BERLIN).date())
    assert found == [date(2026, 6, d) for d in (1, 3, 5, 8, 10, 12)]


def test_weekdays_absent_means_every_day() -> None:
    daily = rule("09:00")
    assert daily.weekdays == (0, 1, 2, 3, 4, 5, 6)
    after, days = utc("2026-06-01T00:00"), []
    for _ in range(8):
        after = next_occurrence(daily, BERLIN, after)
        days.append(after.astimezone(BERLIN).date())
    assert days == [date(2026, 6, 1) + timedelta(days=n) for n in range(8)]


def test_next_occurrence_accepts_any_aware_after_and_refuses_naive() -> None:
    # The same instant with another offset gives the same answer.
    after = datetime.fromisoformat("2026-06-10T12:30:00+05:30")
    assert next_occurrence(rule("09:00"), BERLIN, after) == next_occurrence(
        rule("09:00"), BERLIN, after.astimezone(UTC)
    )
    with pytest.raises(ValueError, match="timezone-aware"):
        next_occurrence(rule("09:00"), BERLIN, wall("2026-06-10T12:00"))


# --- WeeklyRule -------------------------------------------------------------------------------


def test_rule_from_definition() -> None:
    parsed = WeeklyRule.from_definition({"weekdays": ["sun", "mon"], "time": "07:05"})
    assert parsed == WeeklyRule(weekdays=(0, 6), hour=7, minute=5)


@pytest.mark.parametrize(
    "definition",
    [
        {"time": "9:00"},
        {"time": "24:00"},
        {"time": "09:60"},
        {},
        {"time": 900},
        {"weekdays": [], "time": "09:00"},
        {"weekdays": ["monday"], "time": "09:00"},
        {"weekdays": ["mon", "mon"], "time": "09:00"},
        {"weekdays": "mon", "time": "09:00"},
    ],
)
def test_rule_from_definition_refuses_malformed(definition: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"rule\.(time|weekdays)"):
        WeeklyRule.from_definition(definition)


@pytest.mark.parametrize(
    ("weekdays", "hour", "minute"),
    [((), 9, 0), ((7,), 9, 0), ((0, 0), 9, 0), ((0,), 24, 0), ((0,), 9, 60), ((0,), -1, 0)],
)
def test_rule_constructor_validates(weekdays: tuple[int, ...], hour: int, minute: int) -> None:
    with pytest.raises(ValueError):
        WeeklyRule(weekdays=weekdays, hour=hour, minute=minute)


# --- instant_at -------------------------------------------------------------------------------


def test_instant_at_with_an_offset_ignores_the_zone() -> None:
    assert_utc(instant_at("2026-03-29T09:00:00+02:00", NEW_YORK), "2026-03-29T07:00")
    assert_utc(instant_at("2026-03-29T09:00:00+05:30", None), "2026-03-29T03:30")


def test_instant_at_with_z() -> None:
    assert_utc(instant_at("2026-03-29T07:00:00Z", BERLIN), "2026-03-29T07:00")


def test_instant_at_naive_is_wall_clock_in_the_zone_or_utc() -> None:
    assert_utc(instant_at("2026-03-29T09:00", BERLIN), "2026-03-29T07:00")
    assert_utc(instant_at("2026-03-29T09:00", None), "2026-03-29T09:00")
    assert_utc(instant_at(" 2026-03-29T09:00:00 ", KOLKATA), "2026-03-29T03:30")


def test_instant_at_naive_in_a_gap_moves_forward_and_in_a_fold_takes_the_first() -> None:
    assert_utc(instant_at("2026-03-29T02:30", BERLIN), "2026-03-29T01:30")
    assert_utc(instant_at("2026-10-25T02:30", BERLIN), "2026-10-25T00:30")
    assert_utc(instant_at("2026-03-08T02:30:00", NEW_YORK), "2026-03-08T07:30")


@pytest.mark.parametrize(
    "text",
    ["", "tomorrow", "2026-13-01T09:00", "2026-02-30T09:00", "{{ steps.a.at }}", "09:00"],
)
def test_instant_at_refuses_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="not an ISO 8601 datetime"):
        instant_at(text, BERLIN)


# --- zone_named -------------------------------------------------------------------------------


def test_zone_named_knows_iana_zones() -> None:
    assert zone_named("Europe/Berlin").key == "Europe/Berlin"
    assert zone_named("UTC").key == "UTC"


@pytest.mark.parametrize(
    "name", ["Mars/Olympus_Mons", "Europe", "../etc/passwd", "/etc/localtime", "", "A" * 100]
)
def test_zone_named_refuses_unknown_zones(name: str) -> None:
    with pytest.raises(ValueError, match="time zone"):
        zone_named(name)


# --- spread_offset ----------------------------------------------------------------------------


def test_spread_offset_is_deterministic_and_pinned() -> None:
    # Pinned values: a recomputation in another process (or release) must land on the same
    # offset; Python's hash() of a string is salted per process and would not. Changing the
    # hash moves every spread timer, so these change only deliberately.
    assert spread_offset(42, 600) == spread_offset(42, 600)
    assert spread_offset(1, 600) == 542.3138498836089
    assert spread_offset(42, 600) == 540.0700188149169
    assert spread_offset(42, 60) == 54.00700188149169


def test_spread_offsets_cover_the_range() -> None:
    offsets = [spread_offset(run_id, 600) for run_id in range(1, 2001)]
    assert all(0 <= offset < 600 for offset in offsets)
    assert len(set(offsets)) == len(offsets)
    buckets = [0] * 10
    for offset in offsets:
        buckets[int(offset // 60)] += 1
    assert min(buckets) > 120  # about 200 each
    assert min(offsets) < 5 and max(offsets) > 595


def test_spread_offset_zero_and_bad_spreads() -> None:
    assert spread_offset(42, 0) == 0.0
    assert all(0 <= spread_offset(run_id, 1e-9) < 1e-9 for run_id in range(200))
    with pytest.raises(ValueError):
        spread_offset(42, -1)
    with pytest.raises(ValueError):
        spread_offset(42, float("inf"))
