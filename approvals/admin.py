"""The approvals inbox in the admin, scoped to the user's organisations like every page
(workflows/admin/scoping.py).

- "Approval requests" opens the inbox: the pending requests the user may decide now, then
  the organisation's other pending ones, then the recently settled ones.
- A request's page shows what is under review (its message and content, its digest), the
  run's context and timeline, and, only to someone who may decide it *now*, Approve and
  Reject with an optional comment (or a task's form). The POST decides through
  ``approvals.services.decide``: permission, deadline, run state and the digest shown on the
  page are checked again at that moment; a refusal is shown and recorded like any other.
- Decision attempts (the audit) are read-only.
- Slack users are linked to Django users here, and a link lets whoever clicks as that Slack
  user decide as the Django user: a staff user who is not a superuser may link only their
  own user, in organisations they are a member of (and change only their own links); a
  superuser may link any member of the chosen organisation. A click is honoured only while
  the linked user is a member of the request's organisation (``services.decide``).
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from workflows.models import Membership, Run, RunEvent
from workflows.plugins.admin import OrgScopedMixin, in_scope, scoped

from .models import ApprovalRequest, DecisionAttempt, RequestKind, RequestStatus, SlackUser
from .services import (
    DECIDE_PERMISSION,
    MAX_COMMENT_CHARS,
    REFUSAL_TEXT,
    Actor,
    client_ip,
    decide,
    may_decide,
    pending_for,
)
from .slack import update_after

TIMELINE_EVENTS = 50


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(OrgScopedMixin, admin.ModelAdmin):
    list_display = ["id", "kind", "status", "org", "run", "step_id", "expires_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user: Any = request.user
        allowed = (
            user.is_active
            and user.is_staff
            and (
                user.has_perm("approvals.view_approvalrequest") or user.has_perm(DECIDE_PERMISSION)
            )
        )
        return bool(allowed) and in_scope(request, obj)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def get_urls(self) -> list[URLPattern]:
        review = path(
            "<int:approval_id>/review/",
            self.admin_site.admin_view(self.review_view),
            name="approvals_approvalrequest_review",
        )
        return [review, *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise Http404
        rows: QuerySet[ApprovalRequest] = scoped(ApprovalRequest.objects.all(), request)
        mine = pending_for(request.user)
        mine_ids = {a.pk for a in mine}
        others = [a for a in rows.filter(status=RequestStatus.PENDING).order_by("expires_at")[:200]
                  if a.pk not in mine_ids]  # fmt: skip
        settled = rows.exclude(status=RequestStatus.PENDING).order_by("-updated_at")[:50]
        context = {
            **self.admin_site.each_context(request),
            "title": "Approvals inbox",
            "opts": self.model._meta,
            "mine": mine,
            "others": others,
            "settled": settled,
        }
        return TemplateResponse(request, "admin/approvals/inbox.html", context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        return redirect("admin:approvals_approvalrequest_review", approval_id=int(object_id))

    def review_view(self, request: HttpRequest, approval_id: int) -> HttpResponse:
        approval = scoped(ApprovalRequest.objects.all(), request).filter(pk=approval_id).first()
        if approval is None or not self.has_view_permission(request, approval):
            raise Http404("No such request in your organisations.")
        here = reverse("admin:approvals_approvalrequest_review", args=[approval.pk])
        if request.method == "POST":
            return self._decide(request, approval, here)
        why_not = may_decide(request.user, approval)
        open_now = approval.status == RequestStatus.PENDING
        run = Run.objects.filter(pk=approval.run_id).first()
        events = list(RunEvent.objects.filter(run_id=approval.run_id).order_by("-id")
                      [:TIMELINE_EVENTS])[::-1]  # fmt: skip
        content = approval.content if isinstance(approval.content, dict) else {}
        context = {
            **self.admin_site.each_context(request),
            "title": f"{approval.kind.capitalize()} {approval.pk}",
            "opts": self.model._meta,
            "approval": approval,
            "details": _pretty(content.get("content")) if "content" in content else "",
            "run": run,
            "run_input": _pretty(run.input) if run is not None else "",
            "run_url": reverse("admin:workflows_run_change", args=[approval.run_id]),
            "events": [
                (e, json.dumps(e.detail, ensure_ascii=False) if e.detail else "") for e in events
            ],
            "can_decide": open_now and why_not is None,
            "why_not": REFUSAL_TEXT.get(why_not or "", "") if open_now else "",
            "max_comment": MAX_COMMENT_CHARS,
            "fields": (approval.form or {}).get("fields", []),
            "attempts": approval.attempts.order_by("-id")[:20],
        }
        return TemplateResponse(request, "admin/approvals/review.html", context)

    def _decide(self, request: HttpRequest, approval: ApprovalRequest, here: str) -> HttpResponse:
        actor = Actor(via="admin", name=request.user.get_username(), user=request.user,
                      ip=client_ip(request))  # fmt: skip
        comment = request.POST.get("comment", "")
        digest = request.POST.get("digest") or None
        if approval.kind == RequestKind.TASK:
            fields = (approval.form or {}).get("fields", [])
            answer = {f["name"]: request.POST.get(f"field_{f['name']}") for f in fields}
            outcome = decide(approval.pk, decision="submit", kind=RequestKind.TASK, actor=actor,
                             answer=answer, comment=comment, digest=digest,
                             after_commit=update_after)  # fmt: skip
        else:
            outcome = decide(approval.pk, decision=request.POST.get("decision", ""), actor=actor,
                             comment=comment, digest=digest, after_commit=update_after)  # fmt: skip
        if outcome.accepted:
            messages.success(request, outcome.message)
        else:
            errors = outcome.extra.get("errors")
            detail = f" ({'; '.join(f'{k}: {v}' for k, v in errors.items())})" if errors else ""
            messages.error(request, f"Refused: {outcome.message}{detail}")
        return HttpResponseRedirect(here)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


@admin.register(DecisionAttempt)
class DecisionAttemptAdmin(OrgScopedMixin, admin.ModelAdmin):
    list_display = ["at", "approval", "via", "actor", "decision", "accepted", "reason"]
    list_filter = ["accepted", "via", "reason"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class SlackUserForm(forms.ModelForm):
    """A link's user must be a member of the link's organisation. ``own_user``: the user
    signed in, who is not a superuser: the link is theirs, whatever was posted, and only in
    an organisation they are a member of."""

    own_user: Any = None

    class Meta:
        model = SlackUser
        fields = ["org", "team_id", "slack_user_id", "user"]

    def clean(self) -> dict[str, Any]:
        if self.own_user is not None:
            self.instance.user = self.own_user
        cleaned = super().clean() or {}
        if self.own_user is not None:
            cleaned["user"] = self.own_user
        org, user = cleaned.get("org"), cleaned.get("user")
        if (
            org is not None
            and user is not None
            and not Membership.objects.filter(user_id=user.pk, org_id=org.pk).exists()
        ):
            if self.own_user is not None:
                self.add_error("org", "You are not a member of this organisation.")
            else:
                self.add_error("user", "This user is not a member of the chosen organisation.")
        return cleaned


@admin.register(SlackUser)
class SlackUserAdmin(OrgScopedMixin, admin.ModelAdmin):
    list_display = ["org", "team_id", "slack_user_id", "user"]
    form = SlackUserForm
    readonly_fields = ["created_at"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = ["org", "team_id", "slack_user_id"]
        if obj is not None:
            return [*fields, "user", "created_at"]
        return [*fields, "user"] if request.user.is_superuser else fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None and not request.user.is_superuser:
            return ["user", "created_at"]  # shown, never chosen
        return ["created_at"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False,
                 **kwargs: Any) -> Any:  # fmt: skip
        form = super().get_form(request, obj, change=change, **kwargs)
        if request.user.is_superuser:
            return form
        return type("OwnSlackUserForm", (form,), {"own_user": request.user})

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if not super().has_change_permission(request, obj):
            return False
        # Someone else's link is theirs: only a superuser changes it.
        return obj is None or request.user.is_superuser or obj.user_id == request.user.pk

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not request.user.is_superuser:
            obj.user = request.user
        super().save_model(request, obj, form, change)
