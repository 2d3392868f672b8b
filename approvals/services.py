"""Deciding approvals and answering tasks: one function, ``decide``, for Slack, the admin and
the API, under the same rules.

A decision is one transaction: lock the request, check it (still pending, before its
deadline, its run and step still live, the content the person saw is the content under
review, the person may decide it *now*), the guarded UPDATE ``WHERE status = 'pending'``,
the step's wake (``workflows.engine.waits.wake_step``), and the audit row. The first write
wins; a second decision finds the request decided and is told by whom. A refusal rolls all
of that back (a savepoint) and is recorded in the same transaction after the rollback
(``decide_within`` does the work inside a caller's transaction: a Slack click from the
inbox, approvals/inbox.py, is marked applied in the transaction that decides it).

The deadline and a decision race on the request's row: the step's deadline (``wake_at``,
never earlier than the request's ``expires_at``) wakes the step *ready*; its executor then
marks the request expired with the same guarded UPDATE. Whichever commits first wins.

A decision while the step is not parked on it (its executor is running, or the step waits
out a retry's backoff because the Slack post failed and will be tried again) commits all
the same and marks the request ``wake_owed``: the executor reads the decision when it runs
next, and the sweep wakes the step if it parks without having seen it.

Text PostgreSQL cannot store (NUL, unpaired surrogates) in a comment or an answer is refused
(``invalid_comment``, ``invalid_answer``) and recorded like any refusal; the audit itself
never stores such text (it is replaced by U+FFFD).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from workflows.models import Membership, Run, Step
from workflows.plugins.audit import Actor as AuditActor
from workflows.plugins.audit import record_audit
from workflows.plugins.definitions import UNSTORABLE_REASON, has_unstorable, unstorable_path
from workflows.plugins.engine import RunStatus, StepStatus, Wake, database_now, wake_step

from . import sql
from .models import ApprovalRequest, DecisionAttempt, RequestKind, RequestStatus

logger = logging.getLogger(__name__)

MAX_COMMENT_CHARS = 1000
MAX_DETAIL_CHARS = 2000  # of an audit entry's detail
DECIDE_PERMISSION = "approvals.decide_approvalrequest"
DECISIONS = {"approve": RequestStatus.APPROVED, "reject": RequestStatus.REJECTED}
SUBMIT = "submit"
LIVE_STEP = frozenset({StepStatus.READY, StepStatus.RUNNING, StepStatus.WAITING})
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_digest(content: Any) -> str:
    """sha256 (hex) of the canonical JSON of what is under review."""
    return hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()


# --- who is asking ------------------------------------------------------------------------------


def client_ip(request: Any) -> str | None:
    """The client's address for the audit, read as the API's rate limits read it
    (``workflows/api/throttles.py``: DRF's ``get_ident``): behind ``WAYMARK_NUM_PROXIES``
    trusted proxies, from ``X-Forwarded-For``; otherwise ``REMOTE_ADDR`` (with no trusted
    proxy, a client's own ``X-Forwarded-For`` is not believed). None when it is not an IP
    address. ``request``: a Django HttpRequest or a DRF Request."""
    if api_settings.NUM_PROXIES:
        value = BaseThrottle().get_ident(request)
    else:
        value = request.META.get("REMOTE_ADDR")
    try:
        return str(ipaddress.ip_address(str(value or "").strip()))
    except ValueError:
        return None


@dataclass(frozen=True)
class Actor:
    """Who attempts a decision, and from where. ``user`` for Slack and the admin; ``org_id``
    for an API key (the organisation itself decides, recorded as the key)."""

    via: str  # slack, admin, api
    name: str
    user: AbstractBaseUser | AnonymousUser | None = None
    org_id: int | None = None  # an API key's organisation
    ip: str | None = None
    slack_team_id: str = ""
    slack_user_id: str = ""

    def audited(self) -> AuditActor:
        """Who this is in the audit log and the run history (``.label``)."""
        if self.via == "api":
            return AuditActor.from_label(self.name)  # "api_key:<prefix>"
        if self.via == "slack":
            return AuditActor.slack(
                team_id=self.slack_team_id, user_id=self.slack_user_id, name=self.name
            )
        if self.user is not None and self.user.is_authenticated:
            return AuditActor.user(self.user)
        return AuditActor.system(f"{self.via}:{self.name}")


class Refused(Exception):
    """A decision that is not taken: ``code`` is stable (the API's and the audit's),
    ``message`` is what the person is shown."""

    def __init__(self, code: str, message: str, *, status: int = 409, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.extra = extra


@dataclass(frozen=True)
class Outcome:
    accepted: bool
    code: str  # "accepted" or the refusal's code
    message: str
    approval: ApprovalRequest | None = None
    status: int = 200
    extra: dict[str, Any] = field(default_factory=dict)


def approver_matches(user: AbstractBaseUser | AnonymousUser, approvers: list[str]) -> bool:
    """Is ``user`` named by one of ``approvers`` ("user:NAME", "group:NAME", or a bare
    username or e-mail address)?"""
    username = user.get_username()
    email = str(getattr(user, "email", "") or "").lower()
    groups: set[str] | None = None
    for entry in approvers:
        if entry == "*":
            return True  # anyone of the organisation with the permission
        kind, sep, name = str(entry).partition(":")
        if not sep:
            kind, name = "user", str(entry)
        if kind == "user" and (name == username or (email and name.lower() == email)):
            return True
        if kind == "group":
            if groups is None:
                groups = set(user.groups.values_list("name", flat=True))  # type: ignore[union-attr]
            if name in groups:
                return True
    return False


def may_decide(
    user: AbstractBaseUser | AnonymousUser | None, approval: ApprovalRequest
) -> str | None:
    """Why ``user`` may not decide ``approval`` now (a refusal code), or None. Read from the
    database at each call: a membership, a group or a permission removed a moment ago counts."""
    if user is None or not user.is_authenticated or not user.is_active:
        return "not_permitted"
    if (
        not _superuser(user)
        and not Membership.objects.filter(user_id=user.pk, org_id=approval.org_id).exists()
    ):
        return "other_organisation"
    if not _has_perm(user, DECIDE_PERMISSION):
        return "not_permitted"
    if not approver_matches(user, list(approval.approvers or [])):
        return "not_an_approver"
    return None


REFUSAL_TEXT = {
    "not_permitted": "You do not have permission to decide approvals.",
    "other_organisation": "This request belongs to an organisation you are not a member of.",
    "not_an_approver": "You are not among the approvers of this request.",
}


def _superuser(user: Any) -> bool:
    return bool(getattr(user, "is_superuser", False))


def _has_perm(user: Any, permission: str) -> bool:
    check = getattr(user, "has_perm", None)
    return bool(check(permission)) if check is not None else False


# --- deciding -----------------------------------------------------------------------------------


def decide(
    approval_id: int,
    *,
    decision: str,
    actor: Actor,
    comment: str = "",
    answer: Mapping[str, Any] | None = None,
    digest: str | None = None,
    level: int | None = None,
    kind: str = RequestKind.APPROVAL,
    after_commit: Callable[[ApprovalRequest], None] | None = None,
) -> Outcome:
    """Take ``decision`` ("approve", "reject", or "submit" with ``answer`` for a task) on
    the request, as ``actor``; every attempt is recorded. ``digest``/``level``: what the
    person was shown (a Slack button's token, the admin page): refused when it is no longer
    what is under review."""
    with transaction.atomic(durable=True):
        outcome = decide_within(
            approval_id,
            decision=decision,
            actor=actor,
            comment=comment,
            answer=answer,
            digest=digest,
            level=level,
            kind=kind,
        )
        if outcome.accepted and after_commit is not None:
            approval = outcome.approval
            assert approval is not None
            transaction.on_commit(lambda: after_commit(approval))
    return outcome


def decide_within(
    approval_id: int,
    *,
    decision: str,
    actor: Actor,
    comment: str = "",
    answer: Mapping[str, Any] | None = None,
    digest: str | None = None,
    level: int | None = None,
    kind: str = RequestKind.APPROVAL,
) -> Outcome:
    """``decide`` inside the caller's transaction, which must be open: the decision under a
    savepoint, rolled back on a refusal, and the attempt recorded either way. The caller's
    transaction commits it (a Slack click marks its inbox row applied in the same one)."""
    found: ApprovalRequest | None = None
    try:
        with transaction.atomic():
            found = _decide(
                approval_id,
                decision=decision,
                actor=actor,
                comment=comment,
                answer=answer,
                digest=digest,
                level=level,
                kind=kind,
            )
            record_attempt(
                actor,
                found,
                decision,
                accepted=True,
                reason="accepted",
                detail=comment[:MAX_COMMENT_CHARS],
            )
    except Refused as refusal:
        if found is None:
            found = ApprovalRequest.objects.filter(pk=approval_id).first()
        visible = found if found is not None and _in_reach(actor, found) else None
        record_attempt(
            actor,
            visible,
            decision,
            accepted=False,
            reason=refusal.code,
            detail=refusal.message,
            org_id=visible.org_id if visible else actor.org_id,
        )
        return Outcome(False, refusal.code, refusal.message, visible, refusal.status, refusal.extra)
    assert found is not None
    return Outcome(True, "accepted", accepted_text(found), found)


def accepted_text(approval: ApprovalRequest) -> str:
    what = {"approved": "Approved", "rejected": "Rejected", "submitted": "Submitted"}
    return f"{what.get(approval.status, approval.status)} by {approval.decided_by}."


def _in_reach(actor: Actor, approval: ApprovalRequest) -> bool:
    """May the actor learn anything about ``approval``? (An API key of another organisation,
    or a user who is a member of none of its organisation, is told it does not exist.)"""
    if actor.org_id is not None:
        return approval.org_id == actor.org_id
    if actor.via == "slack":
        return True  # a verified click on one of its own messages, carrying its token
    user = actor.user
    if user is None or not user.is_authenticated:
        return False
    if _superuser(user):
        return True
    return Membership.objects.filter(user_id=user.pk, org_id=approval.org_id).exists()


def _decide(
    approval_id: int,
    *,
    decision: str,
    actor: Actor,
    comment: str,
    answer: Mapping[str, Any] | None,
    digest: str | None,
    level: int | None,
    kind: str,
) -> ApprovalRequest:
    approval = ApprovalRequest.objects.select_for_update().filter(pk=approval_id).first()
    if approval is None or not _in_reach(actor, approval) or approval.kind != kind:
        raise Refused("not_found", f"No {kind} {approval_id}.", status=404)
    if kind == RequestKind.APPROVAL and decision not in DECISIONS:
        raise Refused("invalid_decision", 'The decision must be "approve" or "reject".', status=400)
    if kind == RequestKind.TASK and decision != SUBMIT:
        raise Refused("invalid_decision", 'A task is answered with "submit".', status=400)
    if len(comment) > MAX_COMMENT_CHARS:
        raise Refused(
            "comment_too_long",
            f"The comment is longer than {MAX_COMMENT_CHARS} characters.",
            status=400,
        )
    if has_unstorable(comment):
        raise Refused("invalid_comment", f"The comment {UNSTORABLE_REASON}.", status=400)
    if answer is not None:
        where = unstorable_path(answer)
        if where is not None:
            field = _storable(where)[:100]
            raise Refused(
                "invalid_answer",
                f"{field}: {UNSTORABLE_REASON}",
                status=400,
                errors={field: UNSTORABLE_REASON},
            )
    if approval.status != RequestStatus.PENDING:
        raise _already(approval)
    now = database_now()
    if approval.expires_at <= now:
        raise Refused(
            "expired",
            f"This request expired at {_when(approval.expires_at)}; "
            "decisions are no longer accepted.",
        )
    _check_still_open(approval)
    if digest is not None and digest != approval.digest:
        raise Refused(
            "content_changed",
            "The content under review changed since this was shown to you; review the new request.",
        )
    if level is not None and level != approval.level:
        raise Refused("superseded", "This request was escalated; the newer request decides.")
    if actor.org_id is None:  # a person: permission now, not when the message was sent
        why = may_decide(actor.user, approval)
        if why is None and actor.via == "slack" and not _member(actor.user, approval.org_id):
            # A Slack user acts as the Django user linked to it: that user must be a member
            # of the request's organisation, a superuser too (a link is made per
            # organisation; one to a non-member is never honoured).
            why = "other_organisation"
        if why is not None:
            raise Refused(why, REFUSAL_TEXT[why], status=403)
    if kind == RequestKind.TASK:
        from .forms import FormInvalid, clean_answer

        try:
            answer = clean_answer(approval.form or {}, answer)
        except FormInvalid as exc:
            raise Refused("invalid_answer", str(exc), status=400, errors=exc.errors) from None
    status = DECISIONS.get(decision, RequestStatus.SUBMITTED)
    with connection.cursor() as cursor:
        cursor.execute(
            sql.DECIDE,
            {
                "status": status,
                "decided_by": actor.name[:150],
                "decided_via": actor.via,
                "comment": comment,
                "answer": None if answer is None else canonical_json(answer),
                "approval_id": approval.pk,
            },
        )
        if cursor.rowcount != 1:  # cannot happen under the row lock; the guard stays anyway
            raise Refused("already_decided", "This request was decided a moment ago.")
    approval.refresh_from_db()
    who = actor.audited()
    record_audit(
        org=approval.org_id, actor=who, action=f"{approval.kind}.{decision}",
        target_type=approval.kind, target_id=approval.pk,
        detail={"run": approval.run_id, "step": approval.step_id, "iteration": approval.iteration,
                "decision": str(approval.status), "via": actor.via, "level": approval.level},
    )  # fmt: skip
    woke = wake_step(
        step_pk=approval.step_row_id,
        wake=Wake(
            outcome=outcome_of(approval),
            output=output_of(approval),
            reason="approval",
            by=f"{actor.via}:{actor.name}"[:100],
            actor=who.label,
        ),
    )
    if not woke:
        # Not parked on this request: its executor is on it (about to park, or escalating),
        # or the step waits out a retry's backoff (the Slack post is tried again) or its
        # paused run. The executor reads the decision when it runs next, and the sweep wakes
        # the step if it parks meanwhile without having seen it.
        # Or its run ended another way since the check above (a cancel that committed
        # first): wake_step holds the run's lock now, so this reads who won.
        _check_still_open(approval)
        ApprovalRequest.objects.filter(pk=approval.pk).update(wake_owed=True)
    return approval


def _check_still_open(approval: ApprovalRequest) -> None:
    """Refused when the request's run or step has ended another way, saying which: a
    cancel, the run's end, the step's."""
    run_status = Run.objects.filter(pk=approval.run_id).values_list("status", flat=True).first()
    if run_status == RunStatus.CANCELLED:
        raise Refused("run_cancelled", "The run was cancelled; this request is closed.")
    if run_status not in (RunStatus.RUNNING, RunStatus.PAUSED):
        raise Refused("run_finished", f"The run has ended ({run_status}); this request is closed.")
    step_status = (
        Step.objects.filter(pk=approval.step_row_id).values_list("status", flat=True).first()
    )
    if step_status not in LIVE_STEP:
        raise Refused("step_closed", "The step no longer waits for this request.")


def _already(approval: ApprovalRequest) -> Refused:
    if approval.status == RequestStatus.EXPIRED:
        return Refused(
            "expired",
            f"This request expired at {_when(approval.expires_at)}; "
            "decisions are no longer accepted.",
        )
    if approval.status == RequestStatus.CANCELLED:
        return Refused("run_cancelled", "This request was closed: its run ended another way.")
    return Refused(
        "already_decided",
        f"Already {approval.status} by {approval.decided_by} at {_when(approval.decided_at)}; "
        "your decision changed nothing.",
        status=409,
        decided=approval.status,
        decided_by=approval.decided_by,
    )


def outcome_of(approval: ApprovalRequest) -> str:
    return str(approval.status)


def output_of(approval: ApprovalRequest) -> dict[str, Any]:
    """The step's output once the request is settled."""
    out: dict[str, Any] = {
        approval.kind: approval.pk,
        "decision": str(approval.status),
        "by": approval.decided_by,
        "via": approval.decided_via,
        "comment": approval.comment,
        "digest": approval.digest,
        "decided_at": approval.decided_at.isoformat() if approval.decided_at else None,
        "level": approval.level,
    }
    if approval.kind == RequestKind.TASK:
        out["answer"] = approval.answer
    return out


def record_attempt(
    actor: Actor,
    approval: ApprovalRequest | None,
    decision: str,
    *,
    accepted: bool,
    reason: str,
    detail: str = "",
    org_id: int | None = None,
) -> DecisionAttempt:
    user = actor.user if actor.user is not None and actor.user.is_authenticated else None
    return DecisionAttempt.objects.create(
        org_id=approval.org_id if approval is not None else org_id,
        approval=approval,
        via=_storable(actor.via)[:10],
        actor=_storable(actor.name)[:150],
        user_id=user.pk if user is not None else None,
        ip=actor.ip,
        slack_team_id=_storable(actor.slack_team_id)[:32],
        slack_user_id=_storable(actor.slack_user_id)[:32],
        decision=_storable(decision)[:16],
        accepted=accepted,
        reason=_storable(reason)[:32],
        detail=_storable(detail)[:MAX_DETAIL_CHARS],
    )


def _storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: NUL and unpaired surrogates become U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", text)


def _member(user: Any, org_id: int) -> bool:
    return bool(
        user is not None and Membership.objects.filter(user_id=user.pk, org_id=org_id).exists()
    )


def _when(moment: Any) -> str:
    if moment is None:
        return "an unknown time"
    return str(timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z"))


def pending_for(user: AbstractBaseUser | AnonymousUser) -> list[ApprovalRequest]:
    """The pending requests ``user`` may decide now (the admin inbox's first list)."""
    if not user.is_authenticated or not user.is_active or not _has_perm(user, DECIDE_PERMISSION):
        return []
    rows = ApprovalRequest.objects.filter(status=RequestStatus.PENDING).order_by("expires_at")
    if not _superuser(user):
        orgs = Membership.objects.filter(user_id=user.pk).values_list("org_id", flat=True)
        rows = rows.filter(org_id__in=list(orgs))
    return [a for a in rows[:500] if approver_matches(user, list(a.approvers or []))]
