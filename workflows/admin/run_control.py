"""Run control in the admin: cancel, pause, resume and retry, always through a confirmation.

The admin only asks; ``workflows.services.control.run_act`` decides. Each run is acted on in
its own transaction under its lock, so a run whose status changed after the confirmation
page was shown is refused by the service (shown with its code) and left as it is.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from django.contrib import messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from ..errors import RunStateConflict, UnknownRun
from ..models import Run
from ..services.audit import Actor
from ..services.control import ACTIONS, BULK_LIMIT, run_act
from ..states import RunStatus, run_sources

CONFIRM_TEMPLATE = "admin/workflows/run/confirm_action.html"
SHOWN_RUNS = 50  # runs listed by id on a confirmation page
SHOWN_REFUSALS = 10  # refusals reported one by one; the rest are counted


@dataclass(frozen=True)
class Verb:
    label: str  # "Cancel"
    done: str  # "cancelled"


VERBS = {
    "cancel": Verb("Cancel", "cancelled"),
    "pause": Verb("Pause", "paused"),
    "resume": Verb("Resume", "resumed"),
    "retry": Verb("Retry", "retried"),
}

# The statuses each action applies to: the service's rule (control.py), from the declared
# transitions, narrowed where the action means less (resume a paused run, retry a failed one).
APPLIES_TO: dict[str, list[str]] = {
    "cancel": run_sources(RunStatus.CANCELLED),
    "pause": run_sources(RunStatus.PAUSED),
    "resume": [RunStatus.PAUSED.value],
    "retry": [RunStatus.FAILED.value],
}


def actor_for(request: HttpRequest) -> Actor:
    """The signed-in person, as the audit log and the run history (``admin:<user>``) name them."""
    return Actor.user(request.user)


def actions_allowed(status: str) -> list[str]:
    """The actions a run in ``status`` can take, in the service's order."""
    return [action for action in ACTIONS if status in APPLIES_TO[action]]


def confirmation(
    request: HttpRequest,
    *,
    admin_context: dict,
    action: str,
    runs: QuerySet[Run],
    hidden: list[tuple[str, str]],
    back_url: str,
) -> TemplateResponse:
    """The page that says what ``action`` would change among ``runs``, before anything does."""
    applicable = runs.filter(status__in=APPLIES_TO[action])
    count = applicable.count()
    others = runs.exclude(status__in=APPLIES_TO[action]).order_by().values("status")
    by_status = Counter({row["status"]: row["n"] for row in others.annotate(n=Count("id"))})
    context = {
        **admin_context,
        "title": f"{VERBS[action].label} runs?",
        "action": action,
        "verb": VERBS[action],
        "selected_count": runs.count(),
        "applicable_count": count,
        "acted_count": min(count, BULK_LIMIT),
        "limit": BULK_LIMIT,
        "applies_to": APPLIES_TO[action],
        "shown_runs": applicable.select_related("automation").order_by("-id")[:SHOWN_RUNS],
        "not_applicable": sorted(by_status.items()),
        "not_applicable_count": sum(by_status.values()),
        "hidden": hidden,
        "back_url": back_url,
    }
    return TemplateResponse(request, CONFIRM_TEMPLATE, context)


def act_on_one(request: HttpRequest, *, run: Run, action: str) -> bool:
    """Apply ``action`` to ``run``; report the outcome as a message. True when it changed."""
    try:
        outcome = run_act(org=run.org, run_id=run.pk, action=action, actor=actor_for(request))
    except (RunStateConflict, UnknownRun) as refused:
        messages.error(request, f"Run {run.pk}: {refused.code}: {refused.detail}")
        return False
    messages.success(request, f"Run {run.pk} {VERBS[action].done} (now {outcome.status}).")
    return True


def act_on_many(request: HttpRequest, *, runs: QuerySet[Run], action: str) -> None:
    """Apply ``action`` to the newest ``BULK_LIMIT`` of ``runs`` its status allows, each in
    its own transaction; runs in other statuses are skipped and counted."""
    applicable = runs.filter(status__in=APPLIES_TO[action]).select_related("org").order_by("-id")
    batch = list(applicable[: BULK_LIMIT + 1])
    more, batch = len(batch) > BULK_LIMIT, batch[:BULK_LIMIT]
    skipped = runs.exclude(status__in=APPLIES_TO[action]).count()
    changed, refusals = 0, []
    for run in batch:
        try:
            run_act(org=run.org, run_id=run.pk, action=action, actor=actor_for(request))
        except (RunStateConflict, UnknownRun) as refused:
            refusals.append((run.pk, refused))
        else:
            changed += 1
    _report(request, action, changed=changed, refusals=refusals, skipped=skipped, more=more)


def _report(
    request: HttpRequest,
    action: str,
    *,
    changed: int,
    refusals: list[tuple[int, RunStateConflict | UnknownRun]],
    skipped: int,
    more: bool,
) -> None:
    verb = VERBS[action]
    if changed:
        messages.success(request, f"{verb.label}: {changed} run(s) {verb.done}.")
    for run_id, refused in refusals[:SHOWN_REFUSALS]:
        messages.error(request, f"Run {run_id}: {refused.code}: {refused.detail}")
    if len(refusals) > SHOWN_REFUSALS:
        messages.error(request, f"{len(refusals) - SHOWN_REFUSALS} more run(s) were refused.")
    if skipped:
        allowed = " or ".join(APPLIES_TO[action])
        messages.warning(
            request, f"{skipped} selected run(s) skipped: only a {allowed} run can be {verb.done}."
        )
    if more:
        messages.warning(
            request, f"Only {BULK_LIMIT} runs are acted on at once; run the action again."
        )
