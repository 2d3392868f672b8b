"""What ``manage.py runs`` prints: runs, steps and events as text for people on a terminal,
or as JSON whose field names are the API's (api/serializers.py) where the two overlap.

The text says what a waiting step waits for in words, read from what the engine and the apps
store (``wait_kind``, ``wake_at``, ``wait_detail``; an event's ``detail``); a shape it does not
know is shown as JSON rather than guessed at. Times are UTC.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from rest_framework.fields import DateTimeField

from ..api.serializers import RunEventOut, RunOut, StepOut
from ..models import Run, RunEvent, Step
from ..states import StepStatus, WaitKind

DETAIL_CHARS = 300  # an event's detail or a step's error on one line, at most
EVENT_COLUMNS = (23, 22, 20, 3)  # at, event, step, attempt: aligned while tail streams
WHO_CHARS = 40  # a signal's worker is its identity's whole digest; --json keeps it whole


def when(value: datetime | None, *, ms: bool = False) -> str:
    if value is None:
        return "-"
    text = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f" if ms else "%Y-%m-%d %H:%M:%S")
    return text[:-3] if ms else text


def one_line(value: Any, limit: int = DETAIL_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def table(headers: list[str], rows: Iterable[list[str]]) -> list[str]:
    """Columns as wide as their widest cell; the last one left ragged."""
    rows = list(rows)
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers) - 1)]
    return [
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)),
                   row[-1]]).rstrip()
        for row in [headers, *rows]
    ]  # fmt: skip


# --- waits, in words --------------------------------------------------------------------------


def _span(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _waited_on(detail: Mapping[str, Any]) -> str:
    """What a parked step waits for, from what its step type stored (``Park.detail``)."""
    if "signal" in detail:
        correlation = detail.get("correlation")
        keyed = f' with correlation "{correlation}"' if correlation else ""
        return f'signal "{detail["signal"]}"{keyed}'
    if "timer" in detail:
        zone = f" ({detail['zone']})" if detail.get("zone") else ""
        return f"timer {detail['timer']}, due {detail.get('due_at', '?')}{zone}"
    for kind in ("approval", "task"):
        if kind in detail:
            level = f" at level {detail['level']}" if detail.get("level") else ""
            expires = f", expires {detail['expires_at']}" if detail.get("expires_at") else ""
            return f"a person to decide {kind} {detail[kind]}{level}{expires}"
    if "need" in detail and "arrived" in detail:
        return f"its branches: {len(detail['arrived'])} of {detail['need']} arrived"
    if detail.get("reason"):
        return str(detail["reason"])
    return "a wake " + one_line({k: v for k, v in detail.items() if k != "on_deadline"})


def waiting_for(step: Step) -> str:
    """A waiting step's wait, said in words: on what, until when, and what then."""
    if step.wait_kind == WaitKind.RETRY:
        return f"its next attempt, at {when(step.wake_at)}"
    if step.wait_kind == WaitKind.PAUSED:
        return "its run to be resumed"
    detail = step.wait_detail if isinstance(step.wait_detail, dict) else {}
    words = _waited_on(detail)
    if step.wake_at is not None:
        then = detail.get("on_deadline")
        words += f", until {when(step.wake_at)}" + (f" (then {then})" if then else "")
    return words


def event_words(event: RunEvent) -> str:
    """An event's detail: a wait in words, the rest as ``key: value`` on one line."""
    detail = event.detail
    if not isinstance(detail, dict):
        return "" if detail is None else one_line(detail)
    if event.kind == "step.waiting" and detail:
        seconds = detail.get("deadline_seconds")
        limit = f", at most {_span(float(seconds))}" if seconds else ""
        return "waits for " + _waited_on(detail) + limit
    if event.kind == "run.migrated":
        return _migrated(detail)
    # "by" is said apart; the version a run started with (its row id) is the header's.
    shown = {k: v for k, v in detail.items() if k not in ("by", "version_id")}
    return one_line(", ".join(f"{k}: {one_line(v, 120)}" for k, v in shown.items()))


def _migrated(detail: Mapping[str, Any]) -> str:
    """A migration's move in words: the versions, the job, where each live step went."""
    moves = []
    for move in detail.get("steps") or []:
        was = step_label(str(move.get("step_id")), move.get("iteration"))
        if move.get("how") == "move_to":
            moves.append(f"{was} ended, enters {move.get('to')}")
        else:
            iteration = move.get("to_iteration", move.get("iteration"))
            moves.append(f"{was} -> {step_label(str(move.get('to')), iteration)}")
    job = f" (migration {detail['migration']})" if detail.get("migration") else ""
    head = f"moved from v{detail.get('from_version')} to v{detail.get('to_version')}{job}"
    renamed = detail.get("finished_renamed")
    tail = f"; {renamed} completed step(s) renamed" if renamed else ""
    return one_line(head + (": " + ", ".join(moves) if moves else "") + tail)


def who(event: RunEvent) -> str:
    """Who did it: the actor an action names (``detail.by``: an API key, a person, a
    command), else the event's worker column (the waker, or the engine's host:pid:lane)."""
    detail = event.detail if isinstance(event.detail, dict) else {}
    return str(detail.get("by") or event.worker or "")


def step_label(step_id: str, iteration: int | None) -> str:
    if not step_id:
        return ""
    return f"{step_id}#{iteration}" if iteration is not None else step_id


def event_header() -> str:
    at, kind, step, attempt = EVENT_COLUMNS
    return (f"{'AT (UTC)':<{at}}  {'EVENT':<{kind}} {'STEP':<{step}} {'TRY':>{attempt}}  "
            "WHAT (BY)")  # fmt: skip


def event_line(event: RunEvent) -> str:
    at, kind, step, attempt = EVENT_COLUMNS
    by = one_line(who(event), WHO_CHARS)
    words = event_words(event)
    tail = " ".join(part for part in (words, f"(by {by})" if by else "") if part)
    tries = "" if event.attempt is None else str(event.attempt)
    return (
        f"{when(event.at, ms=True):<{at}}  {event.kind:<{kind}} "
        f"{step_label(event.step_id, event.iteration):<{step}} {tries:>{attempt}}  {tail}"
    ).rstrip()


# --- runs -------------------------------------------------------------------------------------


def run_list_lines(runs: list[Run]) -> list[str]:
    rows = [
        [
            str(run.pk), f"{run.automation.slug}@{run.version.number}", run.status,
            when(run.created_at), when(getattr(run, "moved_at", None)),
            getattr(run, "moved_step", None) or "-",
        ]
        for run in runs
    ]  # fmt: skip
    headers = ["ID", "AUTOMATION", "STATUS", "STARTED (UTC)", "UPDATED (UTC)", "STEP"]
    return table(headers, rows)


def run_header_lines(run: Run) -> list[str]:
    fields = [
        ("start key", run.start_key + (" (derived from the input)" if run.start_key_derived
                                       else "")),
        ("started", when(run.created_at)),
        ("updated", when(getattr(run, "moved_at", None))),
        ("finished", when(run.finished_at)),
        ("deadline", when(run.deadline_at)),
        ("steps", f"{run.steps_executed} executed, at most {run.max_steps}"),
        ("input", one_line(run.input)),
    ]  # fmt: skip
    if run.output is not None:
        fields.append(("output", one_line(run.output)))
    if run.error:
        fields.append(("error", one_line(run.error)))
    title = f"run {run.pk}  {run.automation.slug}@{run.version.number}  {run.status}"
    return [title, *(f"  {name:<10} {value}" for name, value in fields)]


def step_lines(steps: list[Step]) -> list[str]:
    rows = []
    for step in steps:
        if step.status == StepStatus.WAITING:
            note = "waits for " + waiting_for(step)
        elif step.status == StepStatus.RUNNING:
            note = f"lease until {when(step.lease_until)}"
        elif step.status == StepStatus.READY:
            note = f"ready for a worker of lane {step.lane}"
        else:
            note = one_line(step.error) if step.error else ""
        rows.append([
            step.step_id, str(step.iteration), step.type, step.status,
            step.tries, step.lane, step.owner or "-",
            when(step.created_at), when(step.finished_at), note,
        ])  # fmt: skip
    headers = ["STEP", "ITER", "TYPE", "STATUS", "TRIES", "LANE", "WORKER", "CREATED (UTC)",
               "FINISHED (UTC)", "ERROR / WAITING"]  # fmt: skip
    return table(headers, rows)


# --- JSON: the API's fields, and what only an operator sees -----------------------------------


def run_json(run: Run) -> dict[str, Any]:
    """RunOut's fields, with when the run last moved and the step that moved last."""
    moved_at = getattr(run, "moved_at", None)
    return {
        **RunOut(run).data,
        "updated_at": None if moved_at is None else DateTimeField().to_representation(moved_at),
        "current_step": getattr(run, "moved_step", None) or None,
    }


def step_json(step: Step) -> dict[str, Any]:
    """StepOut's fields, with the worker holding it (``owner``, which the API keeps from
    tenants) and its wait in words."""
    waiting = waiting_for(step) if step.status == StepStatus.WAITING else None
    return {**StepOut(step).data, "owner": step.owner, "waiting_for": waiting}


def event_json(event: RunEvent) -> dict[str, Any]:
    """RunEventOut's fields, with its ``worker`` (the API keeps it from tenants)."""
    return {**RunEventOut(event).data, "worker": event.worker}


def to_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def rerun_lines(outcome: Any) -> list[str]:
    """A re-run (services/rerun.RerunOutcome) in words: what changes, what each settled
    effect after the step becomes, and (a preview) how to confirm."""
    step = repr(outcome.from_step)
    if outcome.iteration is not None:  # a code run's step: which entry of it
        step += f" (iteration {outcome.iteration})"
    if outcome.dry_run:
        lines = [f"Run {outcome.run_id} ({outcome.was}) would be re-run from step {step}"
                 f"{', repeating settled effects' if outcome.repeat_effects else ''}."]  # fmt: skip
    else:
        lines = [f"Run {outcome.run_id} re-run from step {step} "
                 f"(was {outcome.was}, now {outcome.status})."]  # fmt: skip
    for part, changes in (("input", outcome.input_changes), ("vars", outcome.vars_changes)):
        for change in changes:
            before = one_line(change["before"]) if "before" in change else "(absent)"
            after = one_line(change["after"]) if "after" in change else "(removed)"
            lines.append(f"  {part}.{change['key']}: {before} -> {after}")
    if not (outcome.input_changes or outcome.vars_changes):
        lines.append("  input and vars unchanged")
    for effect in outcome.effects:
        verb = "reused, not sent again" if effect.action == "reuse" else "made again"
        lines.append(f"  effect {effect.key} ({effect.provider}): {verb} as {effect.new_entry}")
    if not outcome.effects:
        lines.append("  no settled effect after this step")
    if outcome.dry_run:
        lines.append("Nothing changed: add --yes to re-run.")
    return lines
