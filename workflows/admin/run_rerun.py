"""Re-run from a step, from the run's page: a form (the step, the input and vars as JSON, and
whether to repeat settled effects), then the preview the service makes (what changes, which
effects are reused or made again), then the re-run once confirmed.

The admin only asks; ``workflows.services.rerun.rerun`` decides, both for the preview and for
the re-run, each in its own transaction under the run's lock: a run that changed meanwhile is
refused with its code, and nothing is half-applied.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from ..engine.definition_cache import definition_for
from ..errors import WaymarkError
from ..models import Run
from ..services.replays import replays_of
from ..services.rerun import RERUN_SOURCES, rerun
from .run_control import actor_for

TEMPLATE = "admin/workflows/run/rerun.html"


class BadJson(ValueError):
    pass


def may_rerun(run: Run) -> bool:
    return run.status in RERUN_SOURCES


def rerun_page(request: HttpRequest, run: Run, admin_context: dict[str, Any]) -> HttpResponse:
    """GET: the form. POST: the preview with a confirmation, or (confirmed) the re-run."""
    run_url = reverse("admin:workflows_run_change", args=[run.pk])
    given = _given(request, run)
    if request.method != "POST":
        return _page(request, run, admin_context, given, run_url)
    try:
        asked = {"org": run.org, "run_id": run.pk, "actor": actor_for(request),
                 "from_step": given["from_step"], "run_input": _json(given["input"], "Input"),
                 "variables": _json(given["vars"], "Vars"),
                 "repeat_effects": given["repeat_effects"],
                 "iteration": _iteration(given["iteration"])}  # fmt: skip
        confirmed = request.POST.get("confirmed") == "yes"
        outcome = rerun(**asked, dry_run=not confirmed)
    except BadJson as bad:
        return _page(request, run, admin_context, given, run_url, error=str(bad))
    except WaymarkError as refused:
        error = f"{refused.code}: {refused.detail}"
        return _page(request, run, admin_context, given, run_url, error=error)
    if confirmed:
        messages.success(request, f"Run {run.pk} re-run from step {outcome.from_step!r} "
                         f"(now {outcome.status}).")  # fmt: skip
        return redirect(run_url)
    return _page(request, run, admin_context, given, run_url, preview=outcome)


def _given(request: HttpRequest, run: Run) -> dict[str, Any]:
    """What the form holds: as posted, or (first shown) the run's input and vars."""
    posted = request.POST
    if request.method == "POST":
        # A code run's step choice is "step:iteration" (no step id has a colon); the
        # confirmation posts them apart.
        from_step, _, iteration = posted.get("from_step", "").partition(":")
        return {
            "from_step": from_step, "input": posted.get("input", ""),
            "vars": posted.get("vars", ""), "iteration": iteration or posted.get("iteration", ""),
            "repeat_effects": posted.get("repeat_effects") in ("on", "yes", "true"),
        }  # fmt: skip
    return {
        "from_step": "", "iteration": "",
        "input": json.dumps(run.input, indent=2, sort_keys=True),
        "vars": json.dumps(run.vars, indent=2, sort_keys=True), "repeat_effects": False,
    }  # fmt: skip


def _iteration(text: str) -> int | None:
    """A code run's step entry (its form's step choice carries it); blank: none."""
    if not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise BadJson(f"Iteration {text!r} is not a number") from None


def _json(text: str, what: str) -> Any:
    """The posted JSON; blank: unchanged (None)."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadJson(f"{what} is not valid JSON: {exc}") from None


def _page(
    request: HttpRequest,
    run: Run,
    admin_context: dict[str, Any],
    given: dict[str, Any],
    run_url: str,
    *,
    error: str = "",
    preview: Any = None,
) -> TemplateResponse:
    definition = definition_for(run.version_id)
    decided = replays_of(definition)
    if decided is None:
        steps = [(step["id"], step["id"]) for step in definition["steps"]]
    else:  # a code run: the steps its history has, each entry of each (services/rerun.py)
        steps = [(f"{step_id}:{iteration}", f"{step_id} (iteration {iteration})")
                 for step_id, iteration in decided[1].history(run)]  # fmt: skip
    chosen = given["from_step"] + (f":{given['iteration']}" if given["iteration"] else "")
    context = {
        **admin_context, "title": f"Re-run {run} from a step", "run": run, "steps": steps,
        "given": given, "error": error, "preview": preview, "back_url": run_url,
        "chosen": chosen,
        "finished": may_rerun(run), "sources": RERUN_SOURCES,
    }  # fmt: skip
    return TemplateResponse(request, TEMPLATE, context)
