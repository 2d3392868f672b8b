"""What a step parked on a timer waits on, in words (workflows.plugins.admin's
``register_wait_describer``): the intent as written (a duration, a moment, a weekly rule,
in its zone) and the instant it fires, read for a whole page at once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.urls import reverse

from workflows.plugins.admin import Wait, WaitDescription, register_wait_describer, when

from .models import Timer

_UNITS = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))


def duration_words(seconds: float) -> str:
    """``7200`` -> ``2h``, ``93784`` -> ``1d 2h 3m 4s``."""
    left, parts = round(seconds), []
    for unit, size in _UNITS:
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return " ".join(parts) or "0s"


def intent_words(intent: Mapping[str, Any], zone: str) -> str:
    """The timer's intent as its step asked for it."""
    in_zone = f" ({zone})" if zone else ""
    if "duration" in intent:
        return f"wait {duration_words(float(intent['duration']))}"
    if "rule" in intent and isinstance(intent["rule"], Mapping):
        rule = intent["rule"]
        days = ", ".join(str(d) for d in rule.get("weekdays") or []) or "day"
        return f"until the next {days} at {rule.get('time', '?')}{in_zone}"
    return f"until {intent.get('at', '?')}{in_zone}"


def instant_words(instant: datetime, zone: str) -> str:
    """When it fires: in UTC, and in its zone when it has one."""
    try:
        local = instant.astimezone(ZoneInfo(zone)) if zone and zone != "UTC" else None
    except (ZoneInfoNotFoundError, ValueError):
        local = None
    there = f" ({local:%Y-%m-%d %H:%M:%S} {zone})" if local is not None else ""
    return f"{when(instant)}{there}"


def timer_state(timer: Timer) -> str:
    if timer.cancelled_at is not None:
        return "cancelled"
    if timer.fired_at is not None:
        return "fired"
    return "failed to fire" if timer.error else "pending"


def _timer_id(wait: Wait) -> int | None:
    """The timer's id, from the park's ``parked_on`` ("timer:12")."""
    _, _, raw = str(wait.detail.get("parked_on", "")).partition(":")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else None


def describe_timers(waits: Sequence[Wait]) -> list[WaitDescription | None]:
    """A wait or wait_until step: its timer's intent and the instant it fires."""
    ids = {i for i in (_timer_id(w) for w in waits) if i is not None}
    found = {
        t.pk: t for t in Timer.objects.filter(pk__in=ids, org_id__in={w.org_id for w in waits})
    }
    answers: list[WaitDescription | None] = []
    for wait in waits:
        timer = found.get(_timer_id(wait) or 0)
        if timer is None or timer.org_id != wait.org_id:
            answers.append(None)
            continue
        spread = f", spread {duration_words(timer.offset_seconds)}" if timer.offset_seconds else ""
        state = timer_state(timer)
        unless = "" if state == "pending" else f" ({state})"
        answers.append(WaitDescription(
            f"timer {timer.pk}: {intent_words(timer.intent, timer.zone)}{spread}; fires at "
            f"{instant_words(timer.due_at, timer.zone)}{unless}",
            admin_url=reverse("admin:timers_timer_change", args=[timer.pk]),
        ))  # fmt: skip
    return answers


def register() -> None:
    register_wait_describer("timer", describe_timers)
