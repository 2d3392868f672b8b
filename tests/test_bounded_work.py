"""Bounded work per transaction: a start or a settle walks a fixed amount inline, then hands
the rest to a continuation row that a worker walks on from, fenced like any other step.

Counted in steps, not timed: the time budget is tested by setting it to zero.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim, settle_continuation
from workflows.models import Organisation, Run, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .walking import continue_walks

pytestmark = pytest.mark.django_db

# A quick loop with the largest budget a definition may ask for: 100,000 steps.
SPIN: dict[str, Any] = {
    "start": "a",
    "limits": {"max_steps": 100_000},
    "steps": [
        {"id": "a", "type": "set", "values": {"side": "a"}, "next": "b"},
        {"id": "b", "type": "set", "values": {"side": "b"}, "next": "a"},
    ],
}


def start(org: Organisation, definition: dict[str, Any], key: str = "k") -> Run:
    automation_publish_definition(org=org, slug="spin", definition=definition)
    return Run.objects.get(pk=run_start(org=org, automation_slug="spin", run_input={},
                                        start_key=key).run_id)  # fmt: skip


def test_a_start_walks_at_most_its_inline_budget_whatever_the_definition(org, settings) -> None:
    run = start(org, SPIN)

    limit = settings.WAYMARK["WALK_INLINE_STEPS"]
    assert (run.status, run.steps_executed) == ("running", limit)
    assert Step.objects.filter(run=run).exclude(type="continue").count() == limit
    continuation = Step.objects.get(run=run, type="continue")
    assert (continuation.status, continuation.lane) == ("ready", "io")
    assert continuation.wait_detail == {"enter": ["a"]}


def test_each_continuation_walks_one_budget_in_its_own_transaction(org, settings) -> None:
    run = start(org, SPIN)
    limit = settings.WAYMARK["WALK_INLINE_STEPS"]

    (step,) = claim(policy=lane_policy("io"), worker="w", limit=10)
    assert step.is_continuation
    assert settle_continuation(step, worker="w")
    run.refresh_from_db()
    assert run.steps_executed == 2 * limit
    assert Step.objects.filter(run=run, type="continue", status="ready").count() == 1


def test_a_continuation_settle_is_fenced_like_any_other(org) -> None:
    run = start(org, SPIN)
    (step,) = claim(policy=lane_policy("io"), worker="w", limit=10)
    with connection.cursor() as cursor:  # its lease lapsed and another worker took it
        cursor.execute("UPDATE workflows_step SET attempt = attempt + 1 WHERE id = %s", [step.id])
    assert settle_continuation(step, worker="w") is False
    run.refresh_from_db()
    assert run.steps_executed == 100


def test_the_time_budget_hands_the_rest_on_too(org, settings) -> None:
    settings.WAYMARK = {**settings.WAYMARK, "WALK_INLINE_MS": 0.0}
    run = start(org, {**SPIN, "limits": {"max_steps": 10}})

    # At least one quick step runs inline, then time is up.
    assert run.status == "running"
    assert 1 <= run.steps_executed < 10
    run, continuations = continue_walks(run)
    assert continuations >= 1
    assert (run.status, run.steps_executed) == ("failed", 10)
