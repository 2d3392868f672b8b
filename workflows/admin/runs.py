"""Runs in the admin: a control room. Every field is read-only; the run's steps and timeline
come from templates a window at a time; cancel, pause, resume and retry go through a
confirmation page and the run-control service."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from .. import selectors
from ..models import Run
from ..services.control import ACTIONS
from .display import pretty_json
from .run_control import VERBS, act_on_many, act_on_one, actions_allowed, confirmation
from .run_list import CappedChangeList, CappedPaginator
from .run_live import POLL_SECONDS, at_seconds, is_finished, live_answer, version_of
from .run_page import run_page_context
from .run_rerun import may_rerun, rerun_page
from .scoping import OrgScopedMixin, OrgScopedRelatedFilter, may_change_here


def _control_action(action: str) -> Callable[..., TemplateResponse | None]:
    """The change-list action for ``action``: a confirmation page first, then the service."""

    def control_selected(
        model_admin: RunAdmin, request: HttpRequest, queryset: QuerySet[Run]
    ) -> TemplateResponse | None:
        return model_admin.control_selected(request, queryset, action)

    control_selected.__name__ = f"{action}_runs"
    return admin.action(
        description=f"{VERBS[action].label} selected runs", permissions=["control"]
    )(control_selected)


@admin.register(Run)
class RunAdmin(OrgScopedMixin, admin.ModelAdmin):
    list_display = ["id", "org", "automation", "version", "status", "steps_executed",
                    "created", "finished"]  # fmt: skip
    list_filter = [
        "status", ("org", OrgScopedRelatedFilter), ("automation", OrgScopedRelatedFilter),
    ]  # fmt: skip
    # The search (get_search_results): a run id, or 3 characters or more found in a start
    # key or anywhere in an input (a customer's name, an order id), by the trigram index.
    search_fields = ["start_key"]
    search_help_text = (
        "A run id, or at least 3 characters found in the start key or anywhere in the input "
        "(a name, an order id)."
    )
    # A million runs: the list counts what it shows up to 1,000 and never the whole table,
    # offers no per-filter counts, and sorts only by what an index orders (run_list.py).
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    sortable_by = ["id", "created"]
    list_select_related = ["org", "automation", "version__automation"]
    # The run's status first; instants to the second (created, finished, deadline).
    fields = readonly_fields = (
        "status", "org", "automation", "version", "start_key", "start_key_derived",
        "steps_executed", "max_steps", "created", "finished", "deadline", "error",
        "pretty_input", "pretty_output", "pretty_vars",
    )  # fmt: skip
    change_form_template = "admin/workflows/run/change_form.html"
    actions = [_control_action(action) for action in ACTIONS]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        # Each step's output by id and the loop counters can be large and are never shown.
        runs = (
            super().get_queryset(request).select_related("org", "automation", "version__automation")
        )
        return runs.defer("outputs", "entered")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[CappedChangeList]:
        return CappedChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Run], search_term: str
    ) -> tuple[QuerySet[Run], bool]:
        return selectors.run_search(queryset, search_term), False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # runs change only through the engine and run control

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_control_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Cancel, pause, resume, retry: the `change_run` permission, asked at every click."""
        return may_change_here(request, self.opts, obj)

    # Instants to the second, in UTC, on the list and the page alike (the admin's own format
    # drops the seconds, and a run's steps are seconds apart).
    @admin.display(description="created (UTC)", ordering="id")
    def created(self, obj: Run) -> str:
        return at_seconds(obj.created_at)

    @admin.display(description="finished (UTC)", ordering="finished_at")
    def finished(self, obj: Run) -> str:
        return at_seconds(obj.finished_at)

    @admin.display(description="deadline (UTC)")
    def deadline(self, obj: Run) -> str:
        return at_seconds(obj.deadline_at)

    @admin.display(description="input")
    def pretty_input(self, obj: Run) -> str:
        return pretty_json(obj.input)

    @admin.display(description="output")
    def pretty_output(self, obj: Run) -> str:
        return pretty_json(obj.output)

    @admin.display(description="vars")
    def pretty_vars(self, obj: Run) -> str:
        return pretty_json(obj.vars)

    # --- the run page ------------------------------------------------------------------------

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Run | None = None,
    ) -> HttpResponse:
        if obj is not None:
            context.update(run_page_context(obj, request.GET))
            context["live"] = {
                "url": reverse("admin:workflows_run_live", args=[obj.pk]),
                "version": version_of(obj),
                "finished": is_finished(obj),
                "poll_ms": POLL_SECONDS * 1000,
            }
            may_control = self.has_control_permission(request, obj)
            allowed = actions_allowed(obj.status) if may_control else []
            context["control_actions"] = [(action, VERBS[action]) for action in allowed]
            context["may_rerun"] = may_control and may_rerun(obj)
        return super().render_change_form(request, context, add, change, form_url, obj)

    # --- run control -------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        control = path(
            "<path:object_id>/control/<str:action>/",
            self.admin_site.admin_view(self.control_view),
            name="workflows_run_control",
        )
        live = path(
            "<path:object_id>/live/",
            self.admin_site.admin_view(self.live_view),
            name="workflows_run_live",
        )
        rerun = path(
            "<path:object_id>/rerun/",
            self.admin_site.admin_view(self.rerun_view),
            name="workflows_run_rerun",
        )
        return [control, rerun, live, *super().get_urls()]

    # --- the page, live (run_live.py) -------------------------------------------------------

    def live_view(self, request: HttpRequest, object_id: str) -> JsonResponse:
        """What the run page's script polls: scoped and permission-checked like the page."""
        try:
            run = self.get_object(request, object_id)
        except Http404:
            run = None
        if run is None:
            return JsonResponse({"code": "not_found", "detail": "No such run."}, status=404)
        if not self.has_view_permission(request, run):
            return JsonResponse(
                {"code": "permission_denied", "detail": "You may not view this run."}, status=403
            )
        return JsonResponse(live_answer(request, run, request.GET))

    def control_selected(
        self, request: HttpRequest, queryset: QuerySet[Run], action: str
    ) -> TemplateResponse | None:
        """A change-list action: the confirmation page, and once confirmed, the action."""
        if request.POST.get("confirmed") == "yes":
            act_on_many(request, runs=queryset, action=action)
            return None  # back to the change list, with the messages
        # The confirmation posts the same selection back to the same change-list URL (its
        # filters included), so the action runs on what was confirmed, scoped once more.
        selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
        hidden = [
            ("action", f"{action}_runs"),
            ("select_across", request.POST.get("select_across", "0")),
        ]
        hidden += [(ACTION_CHECKBOX_NAME, pk) for pk in selected]
        return confirmation(
            request,
            admin_context=self._admin_context(request),
            action=action,
            runs=queryset,
            hidden=hidden,
            back_url=request.get_full_path(),
        )

    def control_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """One run's action from its page: GET confirms, POST acts and goes back to the run."""
        if action not in ACTIONS:
            raise Http404("No such action.")
        run = self.get_object(request, object_id)
        if run is None:
            raise Http404("No such run.")
        if not self.has_control_permission(request, run):
            raise PermissionDenied
        run_url = reverse("admin:workflows_run_change", args=[run.pk])
        if request.method == "POST":
            act_on_one(request, run=run, action=action)
            return redirect(run_url)
        return confirmation(
            request,
            admin_context={**self._admin_context(request), "run": run},
            action=action,
            runs=Run.objects.filter(pk=run.pk),
            hidden=[],
            back_url=run_url,
        )

    def rerun_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Re-run from a step (run_rerun.py): the form, the preview, then the re-run."""
        run = self.get_object(request, object_id)
        if run is None:
            raise Http404("No such run.")
        if not self.has_control_permission(request, run):
            raise PermissionDenied
        return rerun_page(request, run, self._admin_context(request))

    def _admin_context(self, request: HttpRequest) -> dict[str, Any]:
        return {**self.admin_site.each_context(request), "opts": self.opts}
