"""The run page, live: what its script (change_form.html) polls every ``POLL_SECONDS``.

The page sends its own query string (the same windows and filters) and the version it
shows (``since``). Every change of a run writes a run event, so the run's newest event id
and its status are its version: when that is what the page shows, the answer is a few
bytes and one query on the run's event index; when it moved, the answer carries the run's
fields and the page's parts rendered again from the same templates (the picture, the steps,
the timeline; a list paged back to an older window is left as it is). The script stops
once the run is finished.

The view (runs.py ``live_view``) is an admin view like the page: the same login, the same
view permission, the same organisation scoping (another organisation's run is a 404).
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django.http import HttpRequest, QueryDict
from django.template.loader import render_to_string
from django.utils.html import escape

from ..models import Run, RunEvent
from ..states import RunStatus
from .display import pretty_json
from .run_page import run_page_context

POLL_SECONDS = 2
FINISHED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.COMPENSATED)


def version_of(run: Run) -> str:
    """What changes whenever the run moves: its newest event, and its status."""
    newest = RunEvent.objects.filter(run_id=run.pk).order_by("-id").values_list("id", flat=True)
    return f"{newest.first() or 0}:{run.status}"


def is_finished(run: Run) -> bool:
    return run.status in FINISHED


def live_answer(request: HttpRequest, run: Run, params: QueryDict) -> dict[str, Any]:
    """The JSON the page's script reads: ``changed`` false and nothing else to do, or the
    run's fields (HTML of each, by the admin's field name) and the page's parts (HTML)."""
    version = version_of(run)
    answer: dict[str, Any] = {"version": version, "finished": is_finished(run),
                              "status": run.status}  # fmt: skip
    if params.get("since") == version:
        return {**answer, "changed": False}
    context = {**run_page_context(run, params), "original": run, "request": request}
    paged = {name for name in params if name.endswith(("_before", "_after"))}
    return {
        **answer,
        "changed": True,
        "fields": fields_html(run),
        "parts": {
            "run-graph": render_to_string("admin/workflows/run/graph.html", context),
            # A list paged back to an older window stays as the person left it.
            "steps": None if paged & {"steps_before", "steps_after"}
            else render_to_string("admin/workflows/run/steps.html", context),
            "timeline": None if paged & {"events_before", "events_after"}
            else render_to_string("admin/workflows/run/timeline.html", context),
        },
    }  # fmt: skip


def fields_html(run: Run) -> dict[str, str]:
    """The run's fields that move, as the page shows them (by the admin's field name)."""
    return {
        "status": escape(run.get_status_display()),
        "steps_executed": escape(str(run.steps_executed)),
        "finished": escape(at_seconds(run.finished_at)),
        "error": escape(run.error) or "-",
        "pretty_output": str(pretty_json(run.output)),
        "pretty_vars": str(pretty_json(run.vars)),
    }


def at_seconds(instant: Any) -> str:
    """An instant as the admin's run pages show it: UTC, to the second ("-" for none)."""
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if instant is not None else "-"
