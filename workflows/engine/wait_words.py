"""What a waiting step waits on, in words: for the run page and the API's run detail.

A step's ``wait_detail`` is what its executor parked it with (a signal's name and key, an
effect's id, a timer's id, an approval's id), written for the engine. People need a
sentence and a link: "signal order.paid with key o-7", "effect 15/apply/1:9cf… needs
review", "timer 12: wait 2h, due 2030-01-01 09:00:00 UTC". The engine describes what it owns
(a retry's backoff, a paused run, a join, a signal); each app describes the waits it parks
steps on (``workflows.plugins.admin.register_wait_describer``), since only it can read its
rows: the engine imports no app.

A describer is called once per page with every wait of its kind, so it reads its rows in one
query, however many steps wait.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..models import Step
from ..states import StepStatus, WaitKind
from .forks import JOIN_WAIT

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wait:
    """One waiting step, as a describer gets it."""

    org_id: int
    run_id: int
    step_id: str
    iteration: int
    detail: Mapping[str, Any]  # its wait_detail: what its executor parked it with
    wake_at: datetime | None


@dataclass(frozen=True)
class WaitDescription:
    """What a step waits on: ``text``, a phrase read after "waits on" ("signal order.paid
    with key o-7"); ``admin_url``: the admin page of the thing waited on, if it has one;
    ``api_path``: where the API shows it (``/api/v1/effects/12``), if it does."""

    text: str
    admin_url: str | None = None
    api_path: str | None = None


# Every wait of one kind -> its description each, in the same order (None: not known).
Describer = Callable[[Sequence[Wait]], Sequence[WaitDescription | None]]

# kind -> describer. A kind is the prefix of ``wait_detail["parked_on"]`` ("effect" of
# "effect:12"), or else a key of ``wait_detail`` ("signal", "approval").
WAIT_DESCRIBERS: dict[str, Describer] = {}


def kind_of(detail: Mapping[str, Any]) -> str | None:
    """Which describer answers for ``detail``: its parked_on's prefix, else the first kind
    registered that is one of its keys."""
    parked_on = detail.get("parked_on")
    if isinstance(parked_on, str) and parked_on.partition(":")[0] in WAIT_DESCRIBERS:
        return parked_on.partition(":")[0]
    return next((kind for kind in WAIT_DESCRIBERS if kind in detail), None)


def describe_waits(steps: Iterable[Step]) -> dict[int, WaitDescription]:
    """What each waiting step of ``steps`` waits on, by step row id; the others are left out."""
    described: dict[int, WaitDescription] = {}
    by_kind: dict[str, list[tuple[Step, Wait]]] = {}
    for step in steps:
        if step.status != StepStatus.WAITING:
            continue
        detail = step.wait_detail if isinstance(step.wait_detail, Mapping) else {}
        own = _engine_wait(step, detail)
        if own is not None:
            described[step.pk] = own
            continue
        kind = kind_of(detail)
        wait = Wait(org_id=step.org_id, run_id=step.run_id, step_id=step.step_id,
                    iteration=step.iteration, detail=detail, wake_at=step.wake_at)  # fmt: skip
        if kind is None:
            described[step.pk] = _with_deadline(step, WaitDescription(_in_words(detail)))
        else:
            by_kind.setdefault(kind, []).append((step, wait))
    for kind, waits in by_kind.items():
        for (step, wait), description in zip(waits, _ask(kind, [w for _, w in waits]), strict=True):
            described[step.pk] = _with_deadline(
                step, description or WaitDescription(_in_words(wait.detail))
            )
    return described


def _ask(kind: str, waits: list[Wait]) -> Sequence[WaitDescription | None]:
    """The describer's answers; one that fails or answers for too few leaves the words of
    the detail itself (a plugin's bug must not break the run page or the API)."""
    try:
        answers = list(WAIT_DESCRIBERS[kind](waits))
    except Exception:
        logger.exception("wait describer %r failed", kind)
        return [None] * len(waits)
    if len(answers) != len(waits):
        logger.error("wait describer %r answered %d of %d", kind, len(answers), len(waits))
        return [None] * len(waits)
    return answers


def _engine_wait(step: Step, detail: Mapping[str, Any]) -> WaitDescription | None:
    """The waits the engine itself parks steps on, but for signals (a describer, below)."""
    if step.wait_kind == WaitKind.RETRY:
        at = f" at {when(step.wake_at)}" if step.wake_at else ""
        # Claims handed back and those before an operator's retry do not count (steps.py).
        counted = step.attempt - step.release_count - step.series_offset
        return WaitDescription(
            f"its next attempt ({counted + 1} of {step.max_attempts}){at}, after a backoff"
        )
    if step.wait_kind == WaitKind.PAUSED:
        return WaitDescription("its run to be resumed (the run is paused)")
    if step.wait_kind == JOIN_WAIT:
        arrived = detail.get("arrived") or []
        branches = ", ".join(str(int(b) + 1) for b in arrived if isinstance(b, int)) or "none yet"
        return WaitDescription(
            f"{detail.get('need', '?')} of the {detail.get('branches', '?')} branches of "
            f"parallel {detail.get('fork', '?')} (arrived: {branches})"
        )
    return None


def _with_deadline(step: Step, description: WaitDescription) -> WaitDescription:
    """The description, with when time moves the step if nothing else does first."""
    if step.wake_at is None:
        return description
    on_deadline = (step.wait_detail or {}).get("on_deadline")
    then = f" and takes the outcome {on_deadline}" if on_deadline else ""
    return WaitDescription(
        text=f"{description.text}; at {when(step.wake_at)} it wakes{then}",
        admin_url=description.admin_url,
        api_path=description.api_path,
    )


def _in_words(detail: Mapping[str, Any]) -> str:
    """A detail no describer answers for: its fields as "name value" pairs, the reason
    last (an app's ``reason`` is already a sentence)."""
    fields = [f"{key.replace('_', ' ')} {_short(value)}" for key, value in detail.items()
              if key not in ("on_deadline", "reason")]  # fmt: skip
    text = ", ".join(fields) or "a wake from outside"
    reason = detail.get("reason")
    return f"{text} ({reason})" if isinstance(reason, str) and reason else text


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else repr(value) if value is not None else "none"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def when(instant: datetime) -> str:
    """An instant as the run page shows every instant: UTC, to the second."""
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# --- the engine's own wait_signal ----------------------------------------------------------------


def describe_signals(waits: Sequence[Wait]) -> list[WaitDescription]:
    """A wait_signal step: the signal's name and the key it must carry. It links to the
    organisation's signals of that name (one that arrives is listed there)."""
    from django.urls import NoReverseMatch, reverse
    from django.utils.http import urlencode

    try:
        signals = reverse("admin:workflows_signal_changelist")
    except NoReverseMatch:  # a host project without Waymark's admin
        signals = None
    answers = []
    for wait in waits:
        name, key = str(wait.detail.get("signal", "")), str(wait.detail.get("correlation", ""))
        keyed = f" with key {key}" if key else ""
        url = f"{signals}?{urlencode({'q': name})}" if signals else None
        api = f"/api/v1/signals?{urlencode({'name': name})}"
        answers.append(WaitDescription(f"signal {name}{keyed}", admin_url=url, api_path=api))
    return answers


WAIT_DESCRIBERS["signal"] = describe_signals
