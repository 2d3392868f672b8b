"""The approval step type: ask people to approve or reject, with a deadline.

Parks the run on the human lane (``waits=True``) until a decision or the deadline.
Registered from ``ApprovalsConfig.ready()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workflows.plugins import (
    StepReport,
    StepType,
    check_choice,
    check_duration,
    check_fields,
    check_template_field,
    register_step_type,
)

APPROVAL_OUTCOMES = frozenset({"approved", "rejected", "timed_out"})
ON_TIMEOUT = ("reject", "approve", "escalate")
MAX_APPROVERS = 100
MAX_APPROVER_LENGTH = 254


def approval_outcomes(step: Mapping[str, Any]) -> frozenset[str]:
    return APPROVAL_OUTCOMES


def validate_approval(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("approvers", "message", "deadline", "on_timeout"))
    if "approvers" not in step:
        report.issue("missing_field", "approvers", "is required")
    else:
        approvers = step["approvers"]
        if not isinstance(approvers, list) or not 1 <= len(approvers) <= MAX_APPROVERS:
            report.error("approvers", f"must be a list of 1 to {MAX_APPROVERS} approvers")
        else:
            for position, approver in enumerate(approvers):
                if (
                    not isinstance(approver, str)
                    or not approver.strip()
                    or len(approver) > MAX_APPROVER_LENGTH
                ):
                    report.error(
                        f"approvers.{position}",
                        f"must be a non-empty string of at most {MAX_APPROVER_LENGTH} characters",
                    )
    check_template_field(step, "message", report)
    check_duration(step, "deadline", report)
    check_choice(step, "on_timeout", report, ON_TIMEOUT)


APPROVAL = StepType(
    name="approval",
    lane="human",
    validate=validate_approval,
    outcomes=approval_outcomes,
    waits=True,
    app="approvals",
)

STEP_TYPES = (APPROVAL,)


def register_step_types() -> None:
    for step_type in STEP_TYPES:
        register_step_type(step_type)
