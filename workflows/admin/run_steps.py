"""Each step of the run page in words: its input (the step as its version defines it), its
output and error, its history (claims and their workers, failures, retries, parks, wakes)
and, for a waiting step, what it waits on, said by whoever parked it
(engine/wait_words.py) with a link to it.

A window holds up to 200 steps: their outputs are read cut to ``values.MAX_CHARS`` in the
database, their history in one query (the newest ``EVENTS_READ`` events of those steps), and
what they wait on in one query per kind of wait.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC
from typing import Any

from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast, Left, Length

from ..engine.wait_words import describe_waits
from ..models import Run, RunEvent, Step
from .run_graph import definition_steps
from .values import MAX_CHARS, shown, shown_text

STEP_EVENTS = 12  # the newest events shown per step; the rest are in the timeline
EVENTS_READ = 1_000  # events read for one window of steps at most
OWN_FIELDS = ("id", "type")  # shown beside the step, not in its input


def steps_of(run: Run) -> QuerySet[Step]:
    """The run's steps, each output read as text cut to what the page shows, with its size."""
    as_text = Cast("output", output_field=TextField())
    return (
        Step.objects.filter(run_id=run.pk)
        .defer("output")
        .annotate(output_text=Left(as_text, MAX_CHARS + 1), output_size=Length(as_text))
    )


def in_words(run: Run, steps: list[Step], definition: Mapping[str, Any]) -> None:
    """Give each step of a window what its row shows (attributes read by steps.html)."""
    defined = definition_steps(definition)
    waits = describe_waits(steps)
    history = _history(run, steps)
    newest: dict[str, Step] = {}
    for step in steps:
        if step.step_id not in newest or step.iteration > newest[step.step_id].iteration:
            newest[step.step_id] = step
    for step in steps:
        row: Any = step  # the template reads these beside the model's fields
        row.anchor = newest[step.step_id] is step  # the graph links to #step-<id>
        row.key = f"{step.step_id}/{step.iteration}"  # what keeps its folds open when live
        row.input_shown = shown(_own_input(defined.get(step.step_id)), f"{row.key}/input")
        row.output_shown = shown_text(row.output_text, row.output_size, f"{row.key}/output")
        row.waiting_on = waits.get(step.pk)
        events = history.get((step.step_id, step.iteration), [])
        row.history = events[len(events) - STEP_EVENTS :] if len(events) > STEP_EVENTS else events
        row.history_more = len(events) - len(row.history)
        claims = [e for e in events if e["kind"] == "step.claimed" and e["worker"]]
        row.ran_by = step.owner or (claims[-1]["worker"] if claims else "")


def _own_input(step: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if step is None:
        return None  # an engine row (a continuation), or a step of no definition
    return {key: value for key, value in step.items() if key not in OWN_FIELDS}


def _history(run: Run, steps: Iterable[Step]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The events of ``steps``, by (step id, iteration), oldest first: the newest
    ``EVENTS_READ`` of them (index event_run_order, read backwards), as rows (a window's
    thousand events are little work as dicts; as model instances they were a good part of
    the page's time)."""
    keys = {(step.step_id, step.iteration) for step in steps}
    if not keys:
        return {}
    events = (
        RunEvent.objects.filter(run_id=run.pk, step_id__in={sid for sid, _ in keys})
        .order_by("-id")
        .values("kind", "step_id", "iteration", "attempt", "worker", "detail", "at")
    )
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for event in reversed(list(events[:EVENTS_READ])):
        key = (event["step_id"], event["iteration"] or 0)
        if key in keys:
            detail = event["detail"]
            found.setdefault(key, []).append({
                **event,
                "detail_json": json.dumps(detail, ensure_ascii=False) if detail else "",
                "at": event["at"].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
            })  # fmt: skip
    return found
