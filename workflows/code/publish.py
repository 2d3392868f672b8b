"""Publishing a code workflow for an organisation: an ordinary automation (slug = the
workflow's name) whose version holds one ``code`` step naming the workflow and version, so
its runs start, count against quotas and take start keys as every run does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..models import AutomationVersion, Organisation
from ..services.audit import Actor
from ..services.automations import automation_publish_definition
from .context import DECIDER_ID
from .registry import CodeWorkflowError, host_publishing, registered


def code_definition(
    name: str, version: int, personal_data: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None, timer_spread: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The definition a code workflow's versions hold: its decider, and what the workflow
    declares of its runs' personal data (erasure reads it there, as a definition's), their
    budget (``limits``) and their timers' spread, read there as a definition's are."""
    decider = {"id": DECIDER_ID, "type": "code", "workflow": name, "version": version}
    definition: dict[str, Any] = {"start": DECIDER_ID, "steps": [decider]}
    if personal_data is not None:
        definition["personal_data"] = dict(personal_data)
    if limits is not None:
        definition["limits"] = dict(limits)
    if timer_spread is not None:
        definition["timer_spread"] = timer_spread
    return definition


def publish_code_workflow(
    *, org: Organisation, name: str, version: int, actor: Actor | None = None
) -> AutomationVersion:
    """Make ``name`` at ``version`` the current version of ``org``'s automation ``name``
    (created if needed; the same version published again is returned as it is)."""
    found = registered(name, version)
    if found is None:
        raise CodeWorkflowError(
            "workflow_version_missing", f"{name!r} version {version} is not registered"
        )
    if not found.allows(org.slug):
        raise CodeWorkflowError(
            "workflow_not_allowed",
            f"{name!r} version {version} is not registered for organisation {org.slug!r}",
        )
    definition = code_definition(
        name, version, found.personal_data, found.limits, found.timer_spread
    )
    with host_publishing():
        return automation_publish_definition(org=org, slug=name, actor=actor, definition=definition)
