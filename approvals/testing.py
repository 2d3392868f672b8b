"""Decisions and deadlines for the workflow test helper (workflows.plugins.testing,
docs/reference/code-workflows.md, "Testing a code workflow"). FOR TESTS ONLY: registered from
ApprovalsConfig.ready(), called only by ``WorkflowTest.decide`` and ``skip_time``, which
refuse to run where WAYMARK_PRODUCTION is set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models.functions import Now

from workflows.plugins.testing import WorkflowTestError

from .models import ApprovalRequest, RequestKind, RequestStatus
from .services import Actor, decide


def decide_as(
    org_id: int,
    run_id: int,
    step_id: str,
    user: Any,
    decision: str,
    comment: str,
    answer: Mapping[str, Any] | None,
) -> None:
    """Decide the run's pending request at ``step_id`` as ``user``, as the admin's review
    page does (``decide`` checks the user may: membership, permission, approvers)."""
    pending = (
        ApprovalRequest.objects.filter(org_id=org_id, run_id=run_id, step_id=step_id,
                                       status=RequestStatus.PENDING)
        .order_by("-id")
        .first()
    )  # fmt: skip
    if pending is None:
        raise WorkflowTestError(f"run {run_id} has no pending request at step {step_id!r}")
    actor = Actor(via="admin", name=user.get_username(), user=user)
    if pending.kind == RequestKind.TASK:
        outcome = decide(pending.pk, decision="submit", kind=RequestKind.TASK, actor=actor,
                         answer=answer, comment=comment)  # fmt: skip
    else:
        outcome = decide(pending.pk, decision=decision, actor=actor, comment=comment)
    if not outcome.accepted:
        raise WorkflowTestError(
            f"{outcome.code}: {user.get_username()!r} may not decide ({decision!r}) the request at "
            f"step {step_id!r}: {outcome.message}"
        )


def expire_run_requests(org_id: int, run_id: int) -> int:
    """The run's pending requests expire now (by the database's clock): the engine's sweep,
    which passes their steps' deadlines (moved by the helper), then finds them expired, as
    it does in production. Fires nothing itself."""
    pending = ApprovalRequest.objects.filter(org_id=org_id, run_id=run_id,
                                             status=RequestStatus.PENDING)  # fmt: skip
    pending.update(expires_at=Now())
    return 0
