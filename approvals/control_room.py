"""The approvals' panel on the control room (the admin's first screen): approvals and tasks
waiting for people, the signed-in person's own first (those they may decide now, as the
inbox lists them), then the others of their organisations, soonest deadline first."""

from __future__ import annotations

from django.http import HttpRequest
from django.urls import reverse

from workflows.plugins.admin import Line, Panel, capped, register_control_panel
from workflows.plugins.health import COUNT_CAP

from .models import ApprovalRequest, RequestStatus
from .services import DECIDE_PERMISSION, pending_for

SHOWN = 8  # requests listed (the inbox lists them all)


def waiting_for_people(request: HttpRequest, orgs: tuple[int, ...]) -> Panel | None:
    user = request.user
    if not (user.has_perm("approvals.view_approvalrequest") or user.has_perm(DECIDE_PERMISSION)):
        return None
    pending = ApprovalRequest.objects.filter(org_id__in=orgs, status=RequestStatus.PENDING)
    mine = [approval for approval in pending_for(user) if approval.org_id in orgs][:SHOWN]
    mine_ids = {approval.pk for approval in mine}
    others = [
        approval
        for approval in pending.order_by("expires_at")[: SHOWN + len(mine_ids)]
        if approval.pk not in mine_ids
    ][: max(0, SHOWN - len(mine))]
    # Pending requests, by approval_org_status, counted up to the cap.
    waiting = len(pending.values_list("pk", flat=True)[: COUNT_CAP + 1])
    lines = [_line(approval, mine=True) for approval in mine]
    lines += [_line(approval, mine=False) for approval in others]
    inbox = reverse("admin:approvals_approvalrequest_changelist")
    return Panel(
        title=f"Waiting for people ({capped(waiting)})",
        lines=tuple(lines),
        empty="No approval or task waits for a person.",
        links=(Line("Approvals inbox", inbox),),
        order=40,
    )


def _line(approval: ApprovalRequest, *, mine: bool) -> Line:
    message = str((approval.content or {}).get("message", ""))[:120]
    who = "yours to decide" if mine else "for " + (", ".join(approval.approvers or []) or "anyone")
    return Line(
        text=f"{approval.kind} {approval.pk} (run {approval.run_id}, {approval.step_id}): "
        f"{message} ({who}; due {approval.expires_at:%Y-%m-%d %H:%M} UTC)",
        url=reverse("admin:approvals_approvalrequest_review", args=[approval.pk]),
        tone="mine" if mine else "",
    )


def register() -> None:
    register_control_panel("approvals.waiting_for_people", waiting_for_people)
