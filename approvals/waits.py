"""What a step parked by an approval or a task waits on, in words (workflows.plugins.admin's
``register_wait_describer``): who must decide, the request's state and its deadline; it links
to the request's review page. Read for a whole page at once, by organisation and id."""

from __future__ import annotations

from collections.abc import Sequence

from django.urls import reverse

from workflows.plugins.admin import (
    Describer,
    Wait,
    WaitDescription,
    register_wait_describer,
    when,
)

from .models import ApprovalRequest, RequestStatus


def _request_id(wait: Wait, kind: str) -> int | None:
    raw = wait.detail.get(kind)
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def _who(approvers: object) -> str:
    if not isinstance(approvers, list) or not approvers:
        return "anyone allowed to decide"
    names = [str(a) for a in approvers[:5]]
    more = f" and {len(approvers) - 5} more" if len(approvers) > 5 else ""
    return ", ".join(names) + more


def describer(kind: str) -> Describer:
    """The describer of ``kind`` (approval or task): parks carry ``{kind: <request id>}``."""

    def describe(waits: Sequence[Wait]) -> list[WaitDescription | None]:
        ids = {i for i in (_request_id(w, kind) for w in waits) if i is not None}
        orgs = {w.org_id for w in waits}
        found = {r.pk: r for r in ApprovalRequest.objects.filter(pk__in=ids, org_id__in=orgs)}
        answers: list[WaitDescription | None] = []
        for wait in waits:
            request = found.get(_request_id(wait, kind) or 0)
            if request is None or request.org_id != wait.org_id:
                answers.append(None)
                continue
            what = "a decision on" if kind == "approval" else "an answer to"
            escalated = ", escalated" if request.level else ""
            state = "" if request.status == RequestStatus.PENDING else f", {request.status}"
            answers.append(WaitDescription(
                f"{what} {kind} {request.pk} by {_who(request.approvers)}{escalated}{state}, "
                f"expires at {when(request.expires_at)}",
                admin_url=reverse("admin:approvals_approvalrequest_review", args=[request.pk]),
                api_path=f"/api/v1/approvals/{request.pk}",  # tasks too
            ))  # fmt: skip
        return answers

    return describe


def register() -> None:
    register_wait_describer("approval", describer("approval"))
    register_wait_describer("task", describer("task"))
