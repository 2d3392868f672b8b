"""Calendar arithmetic for timers: wall-clock times in IANA zones -> UTC instants.

Pure functions, no database. A ``wait_until`` step states an intent (an ISO 8601 moment, or
a weekly rule such as "mon-fri at 09:00", in an IANA time zone); these functions turn the
intent into the UTC instant the due sweep compares with now(). Keep the intent next to the
instant: when the rule, the zone or the tz database changes, recompute from the intent.

Daylight-saving policy (the documented behaviour, also :data:`GAP_POLICY` and
:data:`FOLD_POLICY`):

* **A local time that does not exist moves forward by the length of the gap.** On the day
  clocks spring forward (Berlin, last Sunday of March: 02:00 jumps to 03:00), "02:30" does
  not happen; the timer fires at 03:30 local time, which is the same instant "02:30" would
  have been on the old offset. A time after the gap ("09:00") is not affected.
* **A local time that happens twice takes the first occurrence.** On the day clocks fall
  back (Berlin, last Sunday of October: 03:00 goes back to 02:00), "02:30" happens once in
  summer time and again an hour later in winter time; the timer fires at the first, the
  earlier instant, and does not fire again at the second.

A weekly rule's weekdays are days of the local calendar in the rule's zone, not of UTC: a
"fri 09:00" rule in Pacific/Auckland fires on Friday morning in Auckland, which is still
Thursday in UTC.

The spread (:func:`spread_offset`) is a deterministic offset derived from the run id with
SHA-256, so recomputing a run's timer, in any process, lands on the same offset.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = [
    "FOLD_POLICY",
    "GAP_POLICY",
    "WEEKDAY_NAMES",
    "WeeklyRule",
    "instant_at",
    "next_occurrence",
    "resolve_local",
    "spread_offset",
    "zone_named",
]

#: A wall-clock time inside a spring-forward gap moves forward by the length of the gap.
GAP_POLICY: Final = "forward"
#: A wall-clock time inside an autumn fold takes its first (earlier) occurrence.
FOLD_POLICY: Final = "first"

#: Day names of a rule's ``weekdays``, in ``date.weekday()`` order (0 = Monday).
WEEKDAY_NAMES: Final = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_TIME_OF_DAY_RE = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")
_MAX_ZONE_NAME = 64
#: How far around ``after`` next_occurrence looks: a week, plus a day either side for the
#: difference between the local and the UTC date, plus room for a skipped calendar day.
_SEARCH_DAYS_BEFORE = 1
_SEARCH_DAYS_AFTER = 9
#: Prefix of the spread hash's input. Changing it (or the hash) moves every spread timer.
_SPREAD_HASH_PREFIX = "waymark-timer-spread:"


def zone_named(name: str) -> ZoneInfo:
    """The IANA time zone ``name`` ("Europe/Berlin"); ValueError when it is not one."""
    if not isinstance(name, str) or not name or len(name) > _MAX_ZONE_NAME:
        raise ValueError(
            f"not an IANA time zone name: {name!r:.80} (expected a name such as 'Europe/Berlin')"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # ZoneInfoNotFoundError: no such zone; ValueError: an absolute or "../" path, a NUL;
        # OSError: a directory of the tz database such as "Europe".
        raise ValueError(
            f"unknown time zone {name!r}: expected an IANA time zone name such as "
            "'Europe/Berlin' or 'America/New_York'"
        ) from None


@dataclass(frozen=True)
class WeeklyRule:
    """A local time of day on some days of the week: "at 09:00 on mon-fri"."""

    weekdays: tuple[int, ...]  # 0 = Monday .. 6 = Sunday, ascending, distinct
    hour: int
    minute: int

    def __post_init__(self) -> None:
        days = self.weekdays
        if (
            not isinstance(days, tuple)
            or not days
            or any(not _is_int(day) or not 0 <= day <= 6 for day in days)
            or len(set(days)) != len(days)
        ):
            raise ValueError(
                f"weekdays must be a non-empty tuple of distinct days 0 (Monday) .. 6 (Sunday), "
                f"not {days!r}"
            )
        if not _is_int(self.hour) or not 0 <= self.hour <= 23:
            raise ValueError(f"hour must be 0..23, not {self.hour!r}")
        if not _is_int(self.minute) or not 0 <= self.minute <= 59:
            raise ValueError(f"minute must be 0..59, not {self.minute!r}")
        object.__setattr__(self, "weekdays", tuple(sorted(days)))

    @classmethod
    def from_definition(cls, rule: Mapping[str, Any]) -> WeeklyRule:
        """A step's ``rule``: ``{"weekdays": ["mon", ...], "time": "09:00"}``.

        ``weekdays`` absent means every day. ValueError when the rule is malformed (the
        definition validator reports the same problems when a version is published).
        """
        if not isinstance(rule, Mapping):
            raise ValueError(f"rule must be an object, not {type(rule).__name__}")
        if "weekdays" in rule:
            names = rule["weekdays"]
            if (
                not isinstance(names, list | tuple)
                or not names
                or any(not isinstance(day, str) or day not in WEEKDAY_NAMES for day in names)
                or len(set(names)) != len(names)
            ):
                raise ValueError(
                    "rule.weekdays must be a non-empty list of distinct days from "
                    f"{', '.join(WEEKDAY_NAMES)}, not {names!r:.80}"
                )
            weekdays = tuple(sorted(WEEKDAY_NAMES.index(day) for day in names))
        else:
            weekdays = tuple(range(7))
        text = rule.get("time")
        match = _TIME_OF_DAY_RE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(
                f'rule.time must be a time of day "HH:MM" (24-hour), such as "09:30", '
                f"not {text!r:.40}"
            )
        return cls(weekdays=weekdays, hour=int(match.group(1)), minute=int(match.group(2)))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_aware(value: datetime, what: str) -> None:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, not {value!r}")


def resolve_local(naive: datetime, zone: ZoneInfo) -> datetime:
    """The wall-clock time ``naive`` in ``zone`` as an aware UTC datetime.

    A time in a spring-forward gap moves forward by the length of the gap (02:30 on
    Berlin's spring day -> 03:30 local, 01:30 UTC); a time in an autumn fold takes its
    first occurrence (``fold=0``, the earlier instant). ``naive.fold`` is ignored.
    """
    if not isinstance(naive, datetime) or naive.tzinfo is not None:
        raise ValueError(f"resolve_local needs a naive (wall-clock) datetime, not {naive!r}")
    first = naive.replace(tzinfo=zone, fold=0)
    instant = first.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None, fold=0) == naive.replace(fold=0):
        return instant  # exists (once, or twice and this is the first)
    # In a gap: the time does not exist. Move it forward by the gap's length, which is the
    # offset after the transition (fold=1 in a gap) minus the offset before it (fold=0).
    before, after = first.utcoffset(), naive.replace(tzinfo=zone, fold=1).utcoffset()
    assert before is not None and after is not None  # ZoneInfo always gives an offset
    moved = naive.replace(fold=0) + (after - before)
    return moved.replace(tzinfo=zone).astimezone(UTC)


def next_occurrence(rule: WeeklyRule, zone: ZoneInfo, after: datetime) -> datetime:
    """The first instant strictly after ``after`` at which ``rule`` happens in ``zone``, in UTC.

    The rule's weekdays and time are read on the local calendar of ``zone``; each day's local
    time is resolved with :func:`resolve_local` (a time in the day's gap moves forward, a
    time in its fold takes the first occurrence, so it fires once that day).
    """
    _require_aware(after, "after")
    local_today = after.astimezone(zone).date()
    candidates = [
        resolve_local(datetime.combine(day, time(rule.hour, rule.minute)), zone)
        for day in _days_around(local_today)
        if day.weekday() in rule.weekdays
    ]
    later = [instant for instant in candidates if instant > after]
    if not later:  # unreachable for a valid rule: the window spans more than a week
        raise ValueError(f"no occurrence of {rule!r} in {zone.key} after {after.isoformat()}")
    return min(later)


def _days_around(local_today: date) -> list[date]:
    first = local_today - timedelta(days=_SEARCH_DAYS_BEFORE)
    return [first + timedelta(days=n) for n in range(_SEARCH_DAYS_BEFORE + _SEARCH_DAYS_AFTER)]


def instant_at(text: str, zone: ZoneInfo | None) -> datetime:
    """An ISO 8601 datetime -> an aware UTC datetime.

    With an offset or "Z" the text names an instant and ``zone`` is not used. Without one
    it is a wall-clock time in ``zone`` (resolved with :func:`resolve_local`), or UTC when
    ``zone`` is None. A bare date means midnight. ValueError when the text is not a datetime.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected an ISO 8601 datetime string, not {type(text).__name__}")
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"not an ISO 8601 datetime: {text!r:.80} "
            "(expected e.g. '2026-03-30T09:00:00+02:00', '2026-03-30T07:00:00Z' "
            "or '2026-03-30T09:00')"
        ) from None
    if parsed.tzinfo is not None:
        return parsed.astimezone(UTC)
    if zone is None:
        return parsed.replace(tzinfo=UTC)
    return resolve_local(parsed, zone)


def spread_offset(run_id: int, spread_seconds: float) -> float:
    """A deterministic offset in ``[0, spread_seconds)`` seconds for the run ``run_id``.

    Derived from SHA-256 of the run id (not ``hash()``, which is salted per process), so
    every process, and every recomputation after a zone or rule change, gets the same
    offset. 0 when the spread is 0; ValueError when it is negative or not finite.
    """
    if not _is_int(run_id):
        raise ValueError(f"run_id must be an integer, not {run_id!r}")
    if isinstance(spread_seconds, bool) or not isinstance(spread_seconds, int | float):
        raise ValueError(f"spread_seconds must be a number, not {spread_seconds!r}")
    if not math.isfinite(spread_seconds) or spread_seconds < 0:
        raise ValueError(f"spread_seconds must be finite and >= 0, not {spread_seconds!r}")
    if spread_seconds == 0:
        return 0.0
    digest = hashlib.sha256(f"{_SPREAD_HASH_PREFIX}{run_id}".encode()).digest()
    # The top 53 bits: a float fraction in [0, 1) with no rounding up to 1.0.
    fraction = (int.from_bytes(digest[:8], "big") >> 11) / float(1 << 53)
    offset = fraction * float(spread_seconds)
    return min(offset, math.nextafter(float(spread_seconds), 0.0))
