"""What the run page shows besides the run's fields: its picture (run_graph.py), its steps in
words (run_steps.py) and its timeline, the last two one window at a time.

A run can have thousands of steps and tens of thousands of events, so the page never loads
them all. Each list is read by keyset (``id`` before or after a cursor, on the run's index),
``PAGE_SIZE`` rows at a time, newest window first, shown oldest to newest within the window.
The steps can be narrowed to one status (``step_status``) or one step of the definition
(``step``: every entry of it; where a step of the picture links when its row is not in the
window shown).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.db.models import Count, QuerySet
from django.http import QueryDict

from ..models import Run, RunEvent, Step
from ..states import StepStatus
from .run_graph import picture
from .run_steps import in_words, steps_of

PAGE_SIZE = 200
STEP_STATUS_PARAM = "step_status"
STEP_ID_PARAM = "step"


@dataclass(frozen=True)
class Window:
    rows: list[Any]
    earlier: str | None  # query string of the window before this one, if there is one
    later: str | None  # ... and after it
    newest: str | None  # back to the newest window, when this is not it


def run_page_context(run: Run, params: QueryDict, *, size: int = PAGE_SIZE) -> dict[str, Any]:
    events = window(RunEvent.objects.filter(run_id=run.pk), params, "events", size)
    for event in events.rows:
        event.detail_json = json.dumps(event.detail, ensure_ascii=False) if event.detail else ""
    status = params.get(STEP_STATUS_PARAM, "")
    steps = steps_of(run)
    if status in StepStatus.values:
        steps = steps.filter(status=status)
    one_step = params.get(STEP_ID_PARAM, "")[:63]
    if one_step:
        steps = steps.filter(step_id=one_step)
    step_window = window(steps, params, "steps", size)
    definition = run.version.document()  # as written: a step's input keeps its key order
    in_words(run, step_window.rows, definition)
    on_page = {step.step_id for step in step_window.rows}
    return {
        "graph": picture(run, definition, on_page=on_page),
        "events": events,
        "steps": step_window,
        "one_step": one_step,
        "step_status": status if status in StepStatus.values else "",
        "step_counts": _step_counts(run, params),
        "all_steps_query": _status_query(params, ""),
        "page_size": size,
    }


def window(queryset: QuerySet, params: QueryDict, prefix: str, size: int) -> Window:
    """One window of ``queryset`` by id, from the cursors ``<prefix>_before``/``_after``."""
    before, after = _cursor(params, f"{prefix}_before"), _cursor(params, f"{prefix}_after")
    if after is not None:
        rows = list(queryset.filter(id__gt=after).order_by("id")[: size + 1])
        has_earlier, has_later = True, len(rows) > size
        rows = rows[:size]
    else:
        newest_first = queryset.order_by("-id")
        if before is not None:
            newest_first = newest_first.filter(id__lt=before)
        rows = list(newest_first[: size + 1])
        has_earlier, has_later = len(rows) > size, before is not None
        rows = rows[:size][::-1]
    moved = before is not None or after is not None
    return Window(
        rows=rows,
        earlier=_query(params, prefix, before=rows[0].id) if rows and has_earlier else None,
        later=_query(params, prefix, after=rows[-1].id) if rows and has_later else None,
        newest=_query(params, prefix) if moved else None,
    )


def _step_counts(run: Run, params: QueryDict) -> list[dict[str, Any]]:
    """Steps per status, each with the query string that lists only them."""
    counted = Step.objects.filter(run_id=run.pk).order_by().values_list("status")
    counts = dict(counted.annotate(n=Count("id")))
    return [
        {"status": status, "count": counts[status], "query": _status_query(params, status)}
        for status in StepStatus.values
        if counts.get(status)
    ]


def _status_query(params: QueryDict, status: str) -> str:
    kept = {k: v for k, v in params.items() if not k.startswith("steps_")}
    kept.pop(STEP_STATUS_PARAM, None)
    kept.pop(STEP_ID_PARAM, None)
    if status:
        kept[STEP_STATUS_PARAM] = status
    return "?" + urlencode(kept)


def _cursor(params: QueryDict, name: str) -> int | None:
    value = params.get(name, "")
    # A bad cursor is no cursor (an id is a bigint: at most 18 digits keeps it in range).
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 18 else None


def _query(params: QueryDict, prefix: str, **cursor: int) -> str:
    kept = {k: v for k, v in params.items() if not k.startswith(f"{prefix}_")}
    kept.update({f"{prefix}_{name}": str(value) for name, value in cursor.items()})
    return "?" + urlencode(kept)
