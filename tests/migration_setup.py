"""What the migration tests share (no tests here): an automation whose version 3 parks runs on
four kinds of wait, and a version 4 that renames two of them and removes one.

Version 3 routes each run by ``input.kind`` to ``hold`` (a timer), ``cool`` (a timer),
``paid`` (a signal, correlated by ``input.order``) or ``review`` (an approval); each goes on to
``after`` (which sets ``on``: the version that walked it) and ``finish``. Version 4 has no
``hold``, calls ``cool`` ``cooldown`` and ``paid`` ``payment``, keeps ``review``, and its
``after`` sets ``on`` to "v4": a run that ends with ``vars.on == "v4"`` walked its last steps
on version 4.
"""

from __future__ import annotations

from typing import Any

from django.db.models.functions import Now

from timers.models import Timer
from workflows.models import AutomationVersion, Organisation, Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.run_migration import migration_plan

SLUG = "orders"
KINDS = ("hold", "cool", "paid", "review")
SIGNAL = "order.paid"
MAPPING = {"cool": "cooldown", "paid": "payment"}


def _route(kinds: dict[str, str]) -> dict[str, Any]:
    when = [{"outcome": kind, "if": f"input.kind == '{kind}'"} for kind in kinds]
    return {"id": "route", "type": "branch", "when": when, "next": {**kinds, "default": "finish"}}


def _waits(ids: dict[str, str]) -> list[dict[str, Any]]:
    """The waits of a version, by kind -> step id (a kind missing: the version has none)."""
    made: dict[str, dict[str, Any]] = {
        "hold": {"type": "wait", "duration": "1h", "next": "after"},
        "cool": {"type": "wait", "duration": "1h", "next": "after"},
        "paid": {"type": "wait_signal", "signal": SIGNAL, "correlation": "{{ input.order }}",
                 "timeout": "1d", "next": {"received": "after", "timed_out": "late"}},
        "review": {"type": "approval", "approvers": ["*"], "message": "Ship {{ input.order }}?",
                   "deadline": "1d",
                   "next": {"approved": "after", "rejected": "late", "timed_out": "late"}},
    }  # fmt: skip
    return [{"id": step_id, **made[kind]} for kind, step_id in ids.items()]


def definition(version: int) -> dict[str, Any]:
    if version == 3:
        ids = {kind: kind for kind in KINDS}
    else:
        ids = {"cool": "cooldown", "paid": "payment", "review": "review"}
    return {
        "start": "route",
        "steps": [
            _route(ids),
            *_waits(ids),
            {"id": "after", "type": "set", "values": {"on": f"v{version}"}, "next": "finish"},
            {"id": "late", "type": "end", "status": "failed"},
            {"id": "finish", "type": "end", "output": "{{ vars.on | default('none') }}"},
        ],
    }


def publish(org: Organisation, version: int) -> None:
    """Publish the versions after the automation's current one up to ``version`` (1 and 2 are
    version 3's steps as well, so the numbers read as in the issue)."""
    current = AutomationVersion.objects.filter(
        automation__org=org, automation__slug=SLUG, published_at__isnull=False
    ).count()
    for number in range(current + 1, version + 1):
        text = definition(3 if number <= 3 else number)
        if number <= 3:
            text = {**text, "steps": [*text["steps"]], "limits": {"max_steps": 90 + number}}
        automation_publish_definition(org=org, slug=SLUG, definition=text)


def run_input(kind: str, n: int) -> dict[str, Any]:
    return {"kind": kind, "order": f"o-{n}"}


def plan_3_to_4(org: Organisation, **changes: Any) -> Any:
    arguments: dict[str, Any] = {
        "org": org, "automation_slug": SLUG, "from_version": 3, "to_version": 4,
        "mapping": MAPPING, "removed": "stay", **changes,
    }  # fmt: skip
    return migration_plan(**arguments)


def make_timers_due(run_ids: list[int]) -> int:
    """The runs' pending timers due now (an UPDATE of the database's time, no mock)."""
    return Timer.objects.filter(
        run_id__in=run_ids, fired_at__isnull=True, cancelled_at__isnull=True
    ).update(due_at=Now())


def migrated_events(run_id: int) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id, kind="run.migrated").order_by("id"))


def live_steps(run_id: int) -> list[tuple[str, int, str]]:
    rows = Step.objects.filter(run_id=run_id, status__in=("ready", "running", "waiting"))
    return sorted((s.step_id, s.iteration, s.status) for s in rows)


def version_of(run_id: int) -> int:
    return int(Run.objects.select_related("version").get(pk=run_id).version.number)
