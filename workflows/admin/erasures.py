"""Erasing a person in the admin: a form (organisation, what names the person, the value),
then the dry run (which runs would be cancelled, finish or be scrubbed, how many rows per
table and column), then, once confirmed, the erasure. Its tombstones are read-only.

"Add erasure" is this form; it needs the permission ``workflows.erase_person`` ("Can erase a
person"), its own (not ``add_erasure``), checked on every request, the confirmation's too. The
admin only asks; ``workflows.services.erasure`` decides (and checks everything again when the
confirmation arrives). The value travels in the form only, never in the session or a message.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from ..errors import WaymarkError
from ..models import Erasure, Organisation
from ..services.audit import Actor
from ..services.erasure import KINDS, erase_person, subject_of
from ..services.erasure.subject import MAX_VALUE_CHARS
from .display import pretty_json
from .scoping import OrgScopedMixin, OrgScopedRelatedFilter, in_scope, scoped

TEMPLATE = "admin/workflows/erasure/erase.html"
ERASE_PERMISSION = "workflows.erase_person"
FIELDS = ("at", "org", "actor_kind", "actor_id", "actor_display", "subject_kind", "repeat_of",
          "runs_cancelled", "runs_finishing", "runs_scrubbed", "values_removed",
          "pretty_counts")  # fmt: skip


class ErasureForm(forms.Form):
    org = forms.ModelChoiceField(queryset=Organisation.objects.none(), label="Organisation")
    kind = forms.ChoiceField(choices=[(k, k) for k in KINDS], label="The person's")
    value = forms.CharField(max_length=MAX_VALUE_CHARS, strip=False)

    def __init__(self, *args: Any, request: HttpRequest, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["org"].queryset = scoped(Organisation.objects.all(), request)  # type: ignore[attr-defined]


def erase_view(model_admin: admin.ModelAdmin, request: HttpRequest) -> HttpResponse:
    """GET: the form. POST: the dry run; with ``confirmed``, the erasure."""
    if not model_admin.has_add_permission(request):
        raise PermissionDenied
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request), "opts": model_admin.opts,
        "title": "Erase a person",
    }  # fmt: skip
    form = ErasureForm(request.POST if request.method == "POST" else None, request=request)
    context["form"] = form
    if request.method != "POST" or not form.is_valid():
        return TemplateResponse(request, TEMPLATE, context)
    org: Organisation = form.cleaned_data["org"]
    if not in_scope(request, org):
        raise PermissionDenied
    confirmed = request.POST.get("confirmed") == "yes"
    try:
        subject = subject_of(**{form.cleaned_data["kind"]: form.cleaned_data["value"]})
        outcome = erase_person(org=org, subject=subject, actor=Actor.user(request.user),
                               dry_run=not confirmed)  # fmt: skip
    except WaymarkError as exc:
        form.add_error(None, f"{exc.code}: {exc.detail}")
        return TemplateResponse(request, TEMPLATE, context)
    if confirmed and outcome.erasure is not None:
        messages.success(request, f"Erasure {outcome.erasure.pk}: "
                         f"{len(outcome.runs_cancelled)} run(s) cancelled, "
                         f"{sum(outcome.counts.values())} row(s) changed.")  # fmt: skip
        return redirect(reverse("admin:workflows_erasure_change", args=[outcome.erasure.pk]))
    context.update({"preview": outcome.as_json(), "org": org, "confirming": True})
    return TemplateResponse(request, TEMPLATE, context)


@admin.register(Erasure)
class ErasureAdmin(OrgScopedMixin, admin.ModelAdmin):
    """Tombstones, read-only; "Add erasure" erases a person (``erase_view``)."""

    list_display = ["id", "at", "org", "subject_kind", "actor_display", "values_removed"]
    list_filter = ["subject_kind", ("org", OrgScopedRelatedFilter)]
    list_select_related = ["org"]
    fields = FIELDS
    readonly_fields = FIELDS

    @admin.display(description="rows changed per table.column")
    def pretty_counts(self, erasure: Erasure) -> str:
        return pretty_json(erasure.counts)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(ERASE_PERMISSION)

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        return erase_view(self, request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
