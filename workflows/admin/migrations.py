"""Migrating an automation's runs between versions in the admin: a page on the automation
that shows the dry run first (per current step: where its runs would go, which would not and
why) and moves the runs only once that is confirmed; the jobs, read-only.

The admin only asks; ``workflows.services.run_migration`` decides. The plan is checked again
when the confirmation arrives (a version published or runs moved meanwhile change only what
the job finds, never what it is allowed to do), and a job stopped at its limit is continued
from its page."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from ..errors import WaymarkError
from ..models import Automation, RunMigration
from ..services.audit import Actor
from ..services.run_migration import (
    REASONS,
    JobProgress,
    MigrationPlan,
    dry_run,
    migration_get,
    migration_plan,
    migration_resume,
    migration_start,
)
from ..states import RUN_LIVE
from .display import pretty_json
from .scoping import OrgScopedMixin, OrgScopedRelatedFilter, may_change_here

TEMPLATE = "admin/workflows/automation/migrate_runs.html"
LIMIT = 1_000  # runs tried per click; the page offers to continue


class MigrationForm(forms.Form):
    from_version = forms.TypedChoiceField(coerce=int, label="Runs on version")
    to_version = forms.TypedChoiceField(coerce=int, label="Move them to version")
    map = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 4}),
        help_text="One OLD=NEW step id per line. A step the new version has too, with the "
        "same type, maps to itself.",
    )  # fmt: skip
    removed = forms.CharField(
        initial="stay", label="Runs on a step with no new id",
        help_text='"stay" (they keep their version and are reported) or "move_to:STEP" '
        "(their wait is cancelled and STEP is entered).",
    )  # fmt: skip
    steps = forms.CharField(
        required=False, label="Only runs at steps", help_text="Step ids, comma-separated."
    )
    statuses = forms.MultipleChoiceField(
        choices=[(s.value, s.value) for s in sorted(RUN_LIVE)], initial=sorted(RUN_LIVE),
        widget=forms.CheckboxSelectMultiple,
    )  # fmt: skip

    def __init__(self, *args: Any, automation: Automation, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        numbers = automation.versions.filter(published_at__isnull=False).values_list(
            "number", flat=True
        )
        choices = [(n, f"v{n}") for n in sorted(numbers, reverse=True)]
        self.fields["from_version"].choices = choices  # type: ignore[attr-defined]
        self.fields["to_version"].choices = choices  # type: ignore[attr-defined]

    def clean_map(self) -> dict[str, str]:
        mapping = {}
        for line in str(self.cleaned_data["map"]).splitlines():
            if not line.strip():
                continue
            old, sep, new = line.partition("=")
            if not sep or not old.strip() or not new.strip():
                raise forms.ValidationError(f"{line.strip()!r} is not OLD=NEW")
            mapping[old.strip()] = new.strip()
        return mapping

    def clean_steps(self) -> list[str]:
        return [s.strip() for s in str(self.cleaned_data["steps"]).split(",") if s.strip()]


def migrate_runs_view(
    model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str
) -> HttpResponse:
    """GET: the form (or a job's status, ``?migration=ID``). POST: the dry run of the plan;
    with ``confirmed``, the job; with ``resume``, the job continued."""
    automation = model_admin.get_object(request, object_id)
    if automation is None:
        raise Http404("No such automation.")
    if not may_change_here(request, model_admin.opts, automation):
        raise PermissionDenied
    here = reverse("admin:workflows_automation_migrate_runs", args=[automation.pk])
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request), "opts": model_admin.opts,
        "automation": automation, "title": f"Migrate runs of {automation.slug}",
        "reasons": REASONS,
    }  # fmt: skip
    if request.method == "POST" and request.POST.get("resume"):
        return _continued(request, automation, request.POST["resume"], here)
    job_id = request.GET.get("migration")
    if request.method != "POST":
        context["form"] = MigrationForm(automation=automation)
        if job_id and job_id.isdigit():
            context["job"] = _job(automation, int(job_id))
        return TemplateResponse(request, TEMPLATE, context)
    form = MigrationForm(request.POST, automation=automation)
    context["form"] = form
    plan = _plan(form, automation) if form.is_valid() else None
    if plan is None:
        return TemplateResponse(request, TEMPLATE, context)
    if request.POST.get("confirmed") == "yes":
        progress = migration_start(plan=plan, actor=_actor(request), limit=LIMIT)
        _tell(request, progress)
        return redirect(f"{here}?migration={progress.job.pk}")
    context.update({"plan": plan.describe(), "report": dry_run(plan).as_json(),
                    "confirming": True})  # fmt: skip
    return TemplateResponse(request, TEMPLATE, context)


def _plan(form: MigrationForm, automation: Automation) -> MigrationPlan | None:
    data = form.cleaned_data
    try:
        return migration_plan(
            org=automation.org, automation_slug=automation.slug,
            from_version=data["from_version"], to_version=data["to_version"],
            mapping=data["map"], removed=data["removed"].strip(), steps=data["steps"],
            statuses=data["statuses"],
        )  # fmt: skip
    except WaymarkError as exc:
        form.add_error(None, f"{exc.code}: {exc.detail}")
        return None


def _continued(
    request: HttpRequest, automation: Automation, job_id: str, here: str
) -> HttpResponse:
    if not job_id.isdigit():
        raise Http404("No such migration.")
    try:
        progress = migration_resume(org=automation.org, automation_slug=automation.slug,
                                    migration_id=int(job_id), actor=_actor(request),
                                    limit=LIMIT)  # fmt: skip
    except WaymarkError as exc:
        raise Http404(exc.detail) from exc
    _tell(request, progress)
    return redirect(f"{here}?migration={progress.job.pk}")


def _job(automation: Automation, job_id: int) -> RunMigration:
    try:
        return migration_get(org=automation.org, automation_slug=automation.slug,
                             migration_id=job_id)  # fmt: skip
    except WaymarkError as exc:
        raise Http404(exc.detail) from exc


def _tell(request: HttpRequest, progress: JobProgress) -> None:
    job = progress.job
    more = " More runs are left to try: continue it." if progress.more else ""
    messages.success(
        request,
        f"Migration {job.pk} ({job.status}): {progress.moved_now} run(s) moved now, "
        f"{job.moved} in all.{more}",
    )


def _actor(request: HttpRequest) -> Actor:
    return Actor.user(request.user)


@admin.register(RunMigration)
class RunMigrationAdmin(OrgScopedMixin, admin.ModelAdmin):
    """The jobs, read-only: made and continued from their automation's page."""

    list_display = ["id", "automation", "from_version", "to_version", "status", "moved",
                    "created_by", "created_at", "finished_at"]  # fmt: skip
    list_filter = ["status", ("org", OrgScopedRelatedFilter)]
    list_select_related = ["automation", "from_version__automation", "to_version__automation"]
    readonly_fields = (
        "org", "automation", "from_version", "to_version", "status", "moved", "created_by",
        "created_at", "updated_at", "finished_at", "pretty_plan", "pretty_planned",
        "pretty_report",
    )  # fmt: skip
    fields = readonly_fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="plan")
    def pretty_plan(self, obj: RunMigration) -> str:
        return pretty_json(obj.plan)

    @admin.display(description="dry run when made")
    def pretty_planned(self, obj: RunMigration) -> str:
        return pretty_json(obj.planned)

    @admin.display(description="left on the old version, and why")
    def pretty_report(self, obj: RunMigration) -> str:
        return pretty_json(obj.report)
