"""The ``approval`` and ``task`` step types: ask people, with a deadline.

Both run on the ``human`` lane. The executor (outside any transaction):

1. renders what is asked (``message``, ``content``; a task's ``form``) and who may answer
   (each rendered approver checked against the rules of a literal one; ``"*"`` only
   literally), and opens the ``ApprovalRequest`` of this step execution (unique on run,
   step, iteration and series: a retry or a crash finds the same request), bound to the
   content's digest;
2. posts the Slack message through the effect ledger when the step names a ``connection``
   and a ``channel`` (keyed by the step's effect key: posted once);
3. parks the step (``Park(deadline_seconds=<time left>, on_deadline=None)``): it waits with
   no slot and no lease until a decision wakes it with its outcome, or until the deadline
   wakes it *ready*: then this executor runs again and, under the request's guard, either
   escalates (new approvers, a new deadline, a new message; parks again) or settles the
   request as expired and ends with the ``on_timeout`` fallback (or fails the step, so the
   run stops where the admin shows it).

A decision taken while the step was not parked (between the request's creation and the
park) is read by the executor when it runs, and otherwise woken by the sweep
(``approvals.sweep.wake_decided``).

**An operator's retry** of a step that failed at its request (expired with ``on_timeout:
fail``, or the Slack post failed for good and the sweep closed the request) starts a new
series of attempts (``Step.series_offset``). When the step runs in a series other than its
request's and the request was not decided (expired, cancelled, or still pending: then it is
closed first), a new request is opened for the new series: asked again with the content
rendered now, a new deadline, a new Slack message (effect key suffix ``series-<n>``); the
old request keeps its final state and its audit, and its buttons are refused (they name the
old request). A decided request is kept: the step takes its decision. A crash or an
ordinary retry stays in the same series and finds the same request (an expired one with
``on_timeout: fail`` fails the step again).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

from django.db import connection, transaction

from effects.public import Call, load_connection, run_effect
from workflows.plugins import (
    Park,
    StepContext,
    StepFailure,
    StepReport,
    StepResult,
    StepType,
    check_choice,
    check_duration,
    check_fields,
    check_string,
    check_template_field,
    check_template_value,
    register_step_type,
    render,
)
from workflows.plugins.definitions import check_template, has_unstorable, parse_duration
from workflows.plugins.engine import crash_point, database_now

from . import sql

APPROVAL_OUTCOMES = frozenset({"approved", "rejected", "timed_out"})
TASK_OUTCOMES = frozenset({"submitted", "timed_out"})
ON_TIMEOUT = ("timed_out", "reject", "approve", "fail", "escalate")
TASK_ON_TIMEOUT = ("timed_out", "fail")
MAX_APPROVERS = 100
ANYONE = "*"  # every member of the organisation with the decide permission
MAX_APPROVER_LENGTH = 254
MAX_REMINDERS = 5
MAX_CONTENT_BYTES = 65_536
APPROVER = re.compile(r"\*|(?:(?:user|group):)?[^\s:{}*][^\s:]{0,253}")
CONNECTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def approval_outcomes(step: Mapping[str, Any]) -> frozenset[str]:
    return APPROVAL_OUTCOMES


def task_outcomes(step: Mapping[str, Any]) -> frozenset[str]:
    return TASK_OUTCOMES


# --- validation -----------------------------------------------------------------------------------


def _check_people(step: Mapping[str, Any], key: str, report: StepReport, *, required: bool) -> None:
    if key not in step:
        if required:
            report.issue("missing_field", key, "is required")
        return
    people = step[key]
    if not isinstance(people, list) or not 1 <= len(people) <= MAX_APPROVERS:
        report.error(key, f"must be a list of 1 to {MAX_APPROVERS} approvers")
        return
    for position, who in enumerate(people):
        where = f"{key}.{position}"
        if not isinstance(who, str) or not who.strip() or len(who) > MAX_APPROVER_LENGTH:
            report.error(
                where, f"must be a non-empty string of at most {MAX_APPROVER_LENGTH} characters"
            )
        elif "{{" in who:
            problem = check_template(who)
            if problem:
                report.issue("malformed_template", where, f"is not a valid template: {problem}")
        elif APPROVER.fullmatch(who) is None:
            report.error(
                where, 'must be "user:NAME", "group:NAME", a username or an e-mail address'
            )


def _check_common(
    step: Mapping[str, Any], report: StepReport, people: str, on_timeout: tuple[str, ...]
) -> None:
    _check_people(step, people, report, required=True)
    check_template_field(step, "message", report)
    deadline = check_duration(step, "deadline", report)
    check_choice(step, "on_timeout", report, on_timeout)
    if "reminders" in step:
        reminders = step["reminders"]
        if not isinstance(reminders, list) or not 1 <= len(reminders) <= MAX_REMINDERS:
            report.error(
                "reminders", f"must be a list of 1 to {MAX_REMINDERS} durations before the deadline"
            )
        else:
            for position, value in enumerate(reminders):
                before = parse_duration(value)
                if before is None or (deadline is not None and before >= deadline):
                    report.error(
                        f"reminders.{position}",
                        "must be a duration shorter than the deadline (how long before it)",
                    )
    if ("connection" in step) != ("channel" in step):
        report.error(
            "channel" if "connection" in step else "connection",
            "is required with " + ("connection" if "connection" in step else "channel"),
        )
    check_string(
        step,
        "connection",
        report,
        required=False,
        max_length=100,
        pattern=CONNECTION_NAME,
        hint=" (letters, digits, _ . -)",
    )
    check_template_field(step, "channel", report, required=False)


def validate_approval(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(
        step,
        report,
        (
            "approvers",
            "message",
            "content",
            "deadline",
            "on_timeout",
            "escalate_to",
            "escalate_deadline",
            "reminders",
            "connection",
            "channel",
        ),
    )
    _check_common(step, report, "approvers", ON_TIMEOUT)
    check_template_value(step, "content", report)
    escalates = step.get("on_timeout") == "escalate"
    _check_people(step, "escalate_to", report, required=False)
    check_duration(step, "escalate_deadline", report, required=False)
    if not escalates:
        for key in ("escalate_to", "escalate_deadline"):
            if key in step:
                report.error(key, 'only with "on_timeout": "escalate"')


def validate_task(step: Mapping[str, Any], report: StepReport) -> None:
    from .forms import schema_problems

    check_fields(
        step,
        report,
        (
            "assignees",
            "message",
            "form",
            "deadline",
            "on_timeout",
            "reminders",
            "connection",
            "channel",
        ),
    )
    _check_common(step, report, "assignees", TASK_ON_TIMEOUT)
    if "form" not in step:
        report.issue("missing_field", "form", "is required")
    else:
        for path, message in schema_problems(step["form"]):
            report.error(path, message)


# --- running ------------------------------------------------------------------------------------


@dataclass(slots=True)
class KeyedContext(StepContext):
    """A StepContext whose effect key names one of several effects of the step execution
    (``<run>/<step>/<iteration>/<suffix>``): an escalation's message is a second effect."""

    key_suffix: str = ""

    @property
    def effect_key(self) -> str:
        base = f"{self.run_id}/{self.step_id}/{self.iteration}"
        return f"{base}/{self.key_suffix}" if self.key_suffix else base


def keyed(ctx: StepContext, suffix: str) -> StepContext:
    if not suffix:
        return ctx
    values = {f.name: getattr(ctx, f.name) for f in fields(StepContext)}
    return KeyedContext(**values, key_suffix=suffix)


def execute_approval(
    step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext
) -> StepResult:
    return _execute(step, context, ctx, "approval")


def execute_task(
    step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext
) -> StepResult:
    return _execute(step, context, ctx, "task")


def _seconds(value: Any) -> float:
    duration = parse_duration(value)
    if duration is None:
        raise StepFailure(f"not a duration: {value!r}", retryable=False)
    return duration.total_seconds()


def _people(step: Mapping[str, Any], key: str, context: Mapping[str, Any]) -> list[str]:
    """The approvers of ``key``, rendered. A rendered value must be what a literal one may be
    ("user:NAME", "group:NAME", a username or an e-mail address), and may not be ``"*"``
    (anyone): run data must not widen who decides. An empty one is left out."""
    people: list[str] = []
    for position, entry in enumerate(step.get(key) or []):
        templated = "{" in str(entry)  # a literal approver never holds "{"
        who = str(render(entry, dict(context))).strip()
        if not who:
            continue
        where = f"{key}.{position}"
        if templated and who == ANYONE:
            raise StepFailure(
                f'{where} rendered "*" (anyone): "*" may only be written literally',
                retryable=False,
            )
        if len(who) > MAX_APPROVER_LENGTH or has_unstorable(who) or APPROVER.fullmatch(who) is None:
            shown = who[:60].encode("unicode_escape").decode()
            raise StepFailure(
                f"{where} rendered {shown!r}, which is not an approver "
                '("user:NAME", "group:NAME", a username or an e-mail address)',
                retryable=False,
            )
        people.append(who)
    return people[:MAX_APPROVERS]


def _execute(
    step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext, kind: str
) -> StepResult:
    from .models import ApprovalRequest, RequestStatus
    from .services import output_of

    step_pk, series = _step_row(ctx)
    approval = (
        ApprovalRequest.objects.filter(
            run_id=ctx.run_id, step_id=ctx.step_id, iteration=ctx.iteration
        )
        .order_by("-series")
        .first()
    )
    if approval is not None and approval.series != series:
        approval = _carry_over(approval)
    if approval is None:
        approval = _open(step, context, ctx, kind, step_pk, series)
    if approval.status in (RequestStatus.APPROVED, RequestStatus.REJECTED, RequestStatus.SUBMITTED):
        crash_point("approval.after_decision")  # decided and read, the step not settled
        return StepResult(output=output_of(approval), outcome=str(approval.status))
    if approval.status == RequestStatus.EXPIRED:
        crash_point("approval.after_decision")  # expired (committed), the step not settled
        return timeout_result(approval)
    if approval.status == RequestStatus.CANCELLED:
        raise StepFailure(f"{kind} {approval.pk} was closed", retryable=False)
    if _expired(approval):
        approval = _on_deadline(approval)
        if approval.status != RequestStatus.PENDING:
            return _execute(step, context, ctx, kind)
    parked = _post(step, context, ctx, approval)
    if parked is not None:
        return parked
    approval.refresh_from_db()
    if approval.status != RequestStatus.PENDING:  # decided meanwhile: no need to park
        return _execute(step, context, ctx, kind)
    return StepResult(
        park=Park(
            deadline_seconds=max(0.0, _seconds_left(approval)),
            on_deadline=None,
            detail={
                "approval" if kind == "approval" else "task": approval.pk,
                "level": approval.level,
                "expires_at": approval.expires_at.isoformat(),
            },
            refund_attempt=True,  # waiting for people is not a failed attempt
        )
    )


def _step_row(ctx: StepContext) -> tuple[int, int]:
    """The step row's id and its series of attempts (raised by an operator's retry)."""
    from workflows.models import Step

    row = (
        Step.objects.filter(run_id=ctx.run_id, step_id=ctx.step_id, iteration=ctx.iteration)
        .values("pk", "series_offset")
        .first()
    )
    if row is None:
        raise StepFailure("the step's row is gone", retryable=False)
    return int(row["pk"]), int(row["series_offset"])


def _carry_over(approval: Any) -> Any:
    """The request of an earlier series of attempts, now that an operator's retry started a
    new one: kept when it was decided (the step takes the decision); otherwise None, and
    the step asks again. One still pending (its step failed before the sweep closed it) is
    closed first, under the usual guard: a decision that commits first wins."""
    from .models import RequestStatus

    decided = (RequestStatus.APPROVED, RequestStatus.REJECTED, RequestStatus.SUBMITTED)
    if approval.status == RequestStatus.PENDING:
        with connection.cursor() as cursor:
            cursor.execute(sql.CANCEL_PENDING, {"approval_id": approval.pk})
        approval.refresh_from_db()
    return approval if approval.status in decided else None


def _open(
    step: Mapping[str, Any],
    context: Mapping[str, Any],
    ctx: StepContext,
    kind: str,
    step_pk: int,
    series: int,
) -> Any:
    from .models import ApprovalRequest
    from .services import canonical_json, content_digest

    content: dict[str, Any] = {"message": str(render(step["message"], dict(context)))}
    if "content" in step:
        content["content"] = render(step["content"], dict(context))
    if kind == "task":
        content["form"] = step["form"]
    if len(canonical_json(content).encode()) > MAX_CONTENT_BYTES:
        raise StepFailure(
            f"the content under review is larger than {MAX_CONTENT_BYTES} bytes", retryable=False
        )
    people_key = "approvers" if kind == "approval" else "assignees"
    approvers = _people(step, people_key, context)
    if not approvers:
        raise StepFailure(f"no {people_key} (they rendered empty)", retryable=False)
    deadline = _seconds(step["deadline"])
    now = database_now()
    expires = now + timedelta(seconds=deadline)
    reminders = sorted((_seconds(r) for r in step.get("reminders") or []), reverse=True)
    channel = ""
    if step.get("channel"):
        channel = str(render(step["channel"], dict(context))).strip()
    with transaction.atomic():
        approval, _ = ApprovalRequest.objects.get_or_create(
            run_id=ctx.run_id,
            step_id=ctx.step_id,
            iteration=ctx.iteration,
            series=series,
            defaults=dict(
                org_id=ctx.org_id,
                step_row_id=step_pk,
                kind=kind,
                content=content,
                digest=content_digest(content),
                approvers=approvers,
                expires_at=expires,
                on_timeout=step.get("on_timeout", "timed_out"),
                # Without escalate_to: anyone of the organisation who may decide approvals.
                escalate_to=_people(step, "escalate_to", context) or [ANYONE],
                escalate_seconds=_seconds(step["escalate_deadline"])
                if step.get("escalate_deadline")
                else None,
                reminders=reminders,
                next_reminder_at=next_reminder(now, expires, reminders),
                slack_connection=str(step.get("connection") or ""),
                slack_channel=channel[:200],
            ),
        )
    return approval


def next_reminder(now: Any, expires: Any, reminders: list[float]) -> Any:
    """The first reminder still to come (reminders: seconds before the deadline, longest
    first), or None."""
    for before in sorted(reminders, reverse=True):
        at = expires - timedelta(seconds=before)
        if at > now:
            return at
    return None


def _expired(approval: Any) -> bool:
    return bool(approval.expires_at <= database_now())


def _seconds_left(approval: Any) -> float:
    return float((approval.expires_at - database_now()).total_seconds())


def _on_deadline(approval: Any) -> Any:
    """The request's deadline passed with no decision: escalate once, or expire it. Both are
    guarded on ``status = 'pending'`` (a decision that committed first wins)."""
    escalate = approval.on_timeout == "escalate" and approval.level == 0
    with connection.cursor() as cursor:
        if escalate:
            seconds = approval.escalate_seconds or max(
                60.0, (approval.expires_at - approval.created_at).total_seconds()
            )
            cursor.execute(sql.ESCALATE, {"seconds": seconds, "approval_id": approval.pk})
            approval.refresh_from_db()
            if approval.level == 1 and approval.status == "pending" and approval.reminders:
                at = next_reminder(database_now(), approval.expires_at, list(approval.reminders))
                type(approval).objects.filter(pk=approval.pk).update(next_reminder_at=at)
            return approval
        cursor.execute(sql.EXPIRE, {"approval_id": approval.pk})
    approval.refresh_from_db()
    return approval


def timeout_result(approval: Any) -> StepResult:
    from .services import output_of

    output = {**output_of(approval), "timed_out": True, "decision": None}
    on_timeout = approval.on_timeout
    if on_timeout == "fail":
        raise StepFailure(
            f"{approval.kind} {approval.pk} got no decision before its deadline "
            f"({approval.expires_at:%Y-%m-%d %H:%M} UTC): the run stops here",
            retryable=False,
            error_class="approval_timed_out",
        )
    if on_timeout in ("approve", "reject"):
        decision = "approved" if on_timeout == "approve" else "rejected"
        return StepResult(output={**output, "decision": decision}, outcome=decision)
    return StepResult(output=output, outcome="timed_out")


def effect_suffix(approval: Any) -> str:
    """What tells this request's message (at its level) from the step execution's other
    messages in the effect key: ``series-<n>`` once asked again after an operator's retry,
    ``escalation-1`` once escalated."""
    parts = [f"series-{approval.series}"] if approval.series else []
    if approval.level:
        parts.append(f"escalation-{approval.level}")
    return "/".join(parts)


def _post(
    step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext, approval: Any
) -> StepResult | None:
    """Post the request's message for its current level, once (the effect ledger's key);
    a park when the ledger parks (a broken connection, an effect in review)."""
    from .models import ApprovalRequest
    from .slack import PROVIDER, request_for

    if not approval.slack_connection or not approval.slack_channel:
        return None
    if any(int(m.get("level", 0)) == approval.level for m in approval.slack_messages or []):
        return None
    conn = load_connection(ctx.org_id, approval.slack_connection, PROVIDER)
    assert conn is not None
    team_id = str((conn.options or {}).get("team_id") or "")[:32]
    suffix = effect_suffix(approval)
    result = run_effect(
        Call(keyed(ctx, suffix), PROVIDER, conn, request_for(approval, approval.slack_channel))
    )
    if result.park is not None:
        return result
    posted = result.output if isinstance(result.output, dict) else {}
    message = {"channel": posted.get("channel"), "ts": posted.get("ts"), "level": approval.level}
    with transaction.atomic():
        locked = ApprovalRequest.objects.select_for_update().get(pk=approval.pk)
        messages = list(locked.slack_messages or [])
        if not any(m.get("ts") == message["ts"] for m in messages):
            messages.append(message)
        # Decided while it was being posted: the message shows buttons; the sweep fixes it.
        stale = locked.status != "pending" or locked.slack_stale
        ApprovalRequest.objects.filter(pk=approval.pk).update(
            slack_messages=messages, slack_team_id=team_id, slack_stale=stale
        )
    return None


APPROVAL = StepType(
    name="approval",
    lane="human",
    validate=validate_approval,
    execute=execute_approval,
    outcomes=approval_outcomes,
    success_outcomes=frozenset({"approved"}),
    waits=True,
    built=True,
    app="approvals",
    context_on_read=True,  # it renders dict(context)
)

TASK = StepType(
    name="task",
    lane="human",
    validate=validate_task,
    execute=execute_task,
    outcomes=task_outcomes,
    success_outcomes=frozenset({"submitted"}),
    waits=True,
    built=True,
    app="approvals",
    context_on_read=True,  # it renders dict(context)
)

STEP_TYPES = (APPROVAL, TASK)


def register_step_types() -> None:
    for step_type in STEP_TYPES:
        register_step_type(step_type)
