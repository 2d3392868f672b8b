"""The calls of a code workflow that ask people and wait on the clock: ``ctx.approval``,
``ctx.task``, ``ctx.sleep`` (optionally in a zone) and ``ctx.wait_until``.

Each builds the step a definition would hold, with the definition's own field names
(docs/reference/effect-people-code-steps.md, "approval", "task", "wait", "wait_until"), and enters
it through ``Context.step_result``: the same validator, rows, waits and wake-ups. Only the return
value is shaped for code: what a person decided, as a small object, instead of the step's output.
``Context`` takes these methods from ``PeopleAndTime`` (context.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol


class Ended(Protocol):
    """A step's output and outcome, as ``Context.step_result`` gives them back."""

    @property
    def output(self) -> Any: ...

    @property
    def outcome(self) -> str | None: ...


@dataclass(frozen=True)
class ApprovalResult:
    """What ``ctx.approval`` gives back once the request is settled. ``outcome``: the step's
    outcome (``approved``, ``rejected`` or ``timed_out``); ``approved`` is true for
    ``approved`` only (a deadline's ``on_timeout: "approve"`` included, then ``by`` is
    ``"deadline"`` and ``timed_out`` true). ``decision``: the output's, what the request
    ended as (``approved``, ``rejected``; None when a deadline ended it undecided).
    ``by``: who decided (a username, an API key, ``"deadline"``); ``via``: ``slack``,
    ``admin``, ``api`` or ``deadline``. ``output``: the step's whole output, as a
    definition's next step reads it."""

    outcome: str
    approved: bool
    decision: str | None
    comment: str
    by: str | None
    via: str | None
    decided_at: str | None
    timed_out: bool
    output: Mapping[str, Any]

    def __bool__(self) -> bool:
        # Always true as a dataclass: `if result:` read a rejection as a yes.
        raise TypeError("ApprovalResult is neither true nor false: test result.approved")


@dataclass(frozen=True)
class TaskResult:
    """What ``ctx.task`` gives back: ``answer``, the form's values checked against the form
    (None when the task timed out), who answered, and the step's whole output."""

    outcome: str
    answer: Mapping[str, Any] | None
    comment: str
    by: str | None
    via: str | None
    decided_at: str | None
    timed_out: bool
    output: Mapping[str, Any]

    def __bool__(self) -> bool:
        # Always true as a dataclass: `if result:` read a timeout as an answer.
        raise TypeError("TaskResult is neither true nor false: test result.answer")


class PeopleAndTime:
    """Methods of ``Context``: approvals, tasks and the waits on the clock."""

    def step_result(self, step_id: str, step_type: str, **fields: Any) -> Ended:
        raise NotImplementedError  # Context's (this class is a part of it)

    def approval(
        self,
        step_id: str,
        *,
        approvers: str | Sequence[str],
        message: str,
        deadline: str,
        content: Any = None,
        on_timeout: str | None = None,
        escalate_to: str | Sequence[str] | None = None,
        escalate_deadline: str | None = None,
        reminders: Sequence[str] | None = None,
        connection: str | None = None,
        channel: str | None = None,
    ) -> ApprovalResult:
        """Ask ``approvers`` to approve or reject ``message`` and ``content`` (an
        ``approval`` step, its fields as in a definition; one approver may be a string),
        without holding a worker; what they decided once they did (or the deadline did)."""
        fields = _given(
            approvers=_listed(approvers), message=message, deadline=deadline, content=content,
            on_timeout=on_timeout, escalate_to=_listed(escalate_to),
            escalate_deadline=escalate_deadline, reminders=_listed(reminders),
            connection=connection, channel=channel,
        )  # fmt: skip
        ended = self.step_result(step_id, "approval", **fields)
        output = ended.output if isinstance(ended.output, Mapping) else {}
        outcome = ended.outcome or str(output.get("decision") or "timed_out")
        return ApprovalResult(
            outcome=outcome, approved=outcome == "approved", decision=output.get("decision"),
            comment=str(output.get("comment") or ""),
            by=output.get("by"), via=output.get("via"), decided_at=output.get("decided_at"),
            timed_out=bool(output.get("timed_out")) or outcome == "timed_out", output=output,
        )  # fmt: skip

    def task(
        self,
        step_id: str,
        *,
        assignees: str | Sequence[str],
        message: str,
        form: Mapping[str, Any],
        deadline: str,
        on_timeout: str | None = None,
        reminders: Sequence[str] | None = None,
        connection: str | None = None,
        channel: str | None = None,
    ) -> TaskResult:
        """Ask ``assignees`` to fill in ``form`` (a ``task`` step, its fields as in a
        definition), without holding a worker; their answer once they gave it."""
        fields = _given(
            assignees=_listed(assignees), message=message, form=dict(form), deadline=deadline,
            on_timeout=on_timeout, reminders=_listed(reminders), connection=connection,
            channel=channel,
        )  # fmt: skip
        ended = self.step_result(step_id, "task", **fields)
        output = ended.output if isinstance(ended.output, Mapping) else {}
        outcome = ended.outcome or (
            "submitted" if output.get("answer") is not None else "timed_out"
        )
        answer = output.get("answer") if outcome == "submitted" else None
        return TaskResult(
            outcome=outcome, answer=answer, comment=str(output.get("comment") or ""),
            by=output.get("by"), via=output.get("via"), decided_at=output.get("decided_at"),
            timed_out=outcome == "timed_out", output=output,
        )  # fmt: skip

    def sleep(self, step_id: str, duration: str | timedelta, *, zone: str | None = None) -> None:
        """Wait ``duration`` ("90s", "15m", "2d", ..., or a ``timedelta`` of whole seconds)
        without holding a worker: the ``wait`` step of definitions, woken by the timer sweep.
        With ``zone`` (an IANA name, the step's ``timezone``), a duration in days ends at the
        same wall-clock time that many calendar days later in that zone, across a
        daylight-saving change too: a ``timedelta`` of whole days is such a duration (it is
        written ``"<n>d"``), any other is elapsed time."""
        if isinstance(duration, timedelta):
            duration = duration_text(duration)
        fields: dict[str, Any] = {"duration": duration}
        if zone is not None:
            fields["timezone"] = zone
        self.step_result(step_id, "wait", **fields)

    def wait_until(
        self,
        step_id: str,
        *,
        at: str | datetime | None = None,
        rule: Mapping[str, Any] | None = None,
        zone: str | None = None,
        spread: str | None = None,
    ) -> None:
        """Wait until ``at`` (an ISO 8601 datetime, or a ``datetime`` such as ``ctx.now() +
        timedelta(days=1)``, written so; without an offset, a wall-clock time in ``zone``)
        or the next time ``rule`` (``{"time": "09:00", "weekdays": [...]}``) matches in
        ``zone``: the ``wait_until`` step of definitions, ``zone`` its ``timezone``."""
        if isinstance(at, datetime):
            at = at.isoformat()
        fields = _given(at=at, rule=None if rule is None else dict(rule), timezone=zone,
                        spread=spread)  # fmt: skip
        self.step_result(step_id, "wait_until", **fields)


def duration_text(duration: timedelta) -> str:
    """A ``timedelta`` as a definition's duration, in its largest whole unit (``2d``, ``36h``,
    ``90s``): whole days stay days, which a zone counts on its calendar. Not whole seconds,
    it is said as a text, for the validator to refuse."""
    seconds = duration.total_seconds()
    if seconds != int(seconds):
        return str(duration)
    whole = int(seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if whole and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def _listed(value: str | Sequence[str] | None) -> list[str] | None:
    """A definition's list of people: one given as a string is a list of one."""
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _given(**fields: Any) -> dict[str, Any]:
    """The fields the call was given: one left out is left out of the step, so the step
    type's own default applies, as in a definition."""
    return {name: value for name, value in fields.items() if value is not None}
