"""Reads, always scoped to one organisation."""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery

from .definitions.registry import registry
from .errors import UnknownAutomation, UnknownOrganisation, UnknownRun, UnknownVersion
from .models import Automation, AutomationVersion, Organisation, Run, RunEvent, Step
from .models.runs import Searched

# Fewer characters hold no trigram: pg_trgm's index would be read whole (a million runs).
SEARCH_MIN_CHARS = 3
SEARCH_MAX_CHARS = 200


def organisation_get(*, slug: str) -> Organisation:
    try:
        return Organisation.objects.get(slug=slug)
    except Organisation.DoesNotExist as exc:
        raise UnknownOrganisation(slug=slug) from exc


def automation_list(*, org: Organisation) -> QuerySet[Automation]:
    return Automation.objects.filter(org=org).select_related("current_version")


def automation_get(*, org: Organisation, slug: str) -> Automation:
    try:
        return automation_list(org=org).get(slug=slug)
    except Automation.DoesNotExist as exc:
        raise UnknownAutomation(slug=slug) from exc


def version_get(*, automation: Automation, number: int) -> AutomationVersion:
    try:
        return AutomationVersion.objects.get(
            org_id=automation.org_id, automation=automation, number=number
        )
    except AutomationVersion.DoesNotExist as exc:
        raise UnknownVersion(slug=automation.slug, number=number) from exc


def run_list(*, org: Organisation) -> QuerySet[Run]:
    """The organisation's runs, newest first; the API filters them (api/filters.py)."""
    return Run.objects.filter(org=org).select_related("automation", "version").order_by("-id")


def run_search(runs: QuerySet[Run], term: str) -> QuerySet[Run]:
    """``runs`` whose input or start key holds ``term`` (case-insensitive, anywhere in the
    input's JSON: a customer's name, an order id), read through the trigram index
    run_search; a term of digits also finds the run of that id. A term shorter than
    ``SEARCH_MIN_CHARS`` finds only the run of that id (every part of the condition is an
    index's, so the planner can read each index and merge them)."""
    term = term.strip()[:SEARCH_MAX_CHARS]
    if not term:
        return runs
    found = Q(pk__in=[])
    if term.isascii() and term.isdigit() and len(term) <= 18:
        found |= Q(pk=int(term))
    if len(term) >= SEARCH_MIN_CHARS:
        found |= Q(Searched(f"%{_like_escaped(term)}%"))
    return runs.filter(found)


def _like_escaped(term: str) -> str:
    """``term`` matched as written: LIKE's wildcards and its escape character escaped."""
    return term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def run_list_moves(runs: QuerySet[Run]) -> QuerySet[Run]:
    """``runs`` with when each last moved (``moved_at``: its newest event) and the step that
    moved last (``moved_step``). Each is one probe of the run's newest events (index
    event_run_order), made for the rows a page fetches, never for the whole list.

    A code run's decider (a step of a type that ``decides``) succeeds once per step its
    function asks for, and last of all when the function returns: the step that moved last
    is then the one the code called last, not the turn that read its result. A turn that is
    waiting for a worker, runs or fails is still named."""
    newest = RunEvent.objects.filter(run_id=OuterRef("pk")).order_by("-id")
    turn = Step.objects.filter(
        run_id=OuterRef("run_id"), step_id=OuterRef("step_id"), iteration=OuterRef("iteration"),
        type__in=[step_type.name for step_type in registry if step_type.decides],
    )  # fmt: skip
    a_turn_ended = Q(kind="step.succeeded") & Q(Exists(turn))
    return runs.annotate(
        moved_at=Subquery(newest.values("at")[:1]),
        moved_step=Subquery(newest.exclude(step_id="").exclude(a_turn_ended).values("step_id")[:1]),
    )


def run_get(*, org: Organisation, run_id: int) -> Run:
    try:
        return Run.objects.select_related("automation", "version").get(org=org, pk=run_id)
    except Run.DoesNotExist as exc:
        raise UnknownRun(run_id=run_id) from exc


def run_steps(*, org: Organisation, run_id: int) -> QuerySet[Step]:
    """Every step of one run of ``org``, oldest first (unique (run, step_id, iteration))."""
    run_get(org=org, run_id=run_id)
    return Step.objects.filter(org=org, run_id=run_id)


def run_history(*, org: Organisation, run_id: int) -> QuerySet[RunEvent]:
    """Every event of one run of ``org``, in order (index (run, id))."""
    run_get(org=org, run_id=run_id)
    return RunEvent.objects.filter(org=org, run_id=run_id)


def run_events_after(*, run: Run, after_id: int) -> QuerySet[RunEvent]:
    """The events of ``run`` (read through run_get, so of its organisation) after the event
    ``after_id``, in order: what a follower has not seen yet."""
    return RunEvent.objects.filter(org_id=run.org_id, run_id=run.pk, id__gt=after_id).order_by("id")
