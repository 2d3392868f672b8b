"""The walk, in process: quick steps inline at start, lane steps through claim and settle.

No worker processes: everything runs inside the test's transaction, so the database's now()
stands still. Time is moved by UPDATEs of lease_until / deadline_at, never by mocks.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from workflows.engine.executors import StepFailure, StepResult, executor_for
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import (
    ClaimedStep,
    claim,
    claim_suspect,
    promote_due_retries,
    release,
    run_context,
    settle_failure,
    settle_success,
    step_context,
)
from workflows.models import Organisation, Outbox, Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .walking import continue_walks

pytestmark = pytest.mark.django_db

# --- helpers --------------------------------------------------------------------------------


def start(
    org: Organisation,
    definition: dict[str, Any],
    run_input: dict[str, Any] | None = None,
    *,
    slug: str = "flow",
    start_key: str | None = None,
) -> Run:
    automation_publish_definition(org=org, slug=slug, definition=definition)
    started = run_start(
        org=org,
        automation_slug=slug,
        run_input=run_input if run_input is not None else {},
        start_key=start_key,
    )
    assert started.created is True
    return Run.objects.get(pk=started.run_id)


def events(run: Run) -> list[tuple[str, str]]:
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("kind", "step_id"))


def step_rows(run: Run) -> list[tuple[str, int, str, str]]:
    return list(
        Step.objects.filter(run=run)
        .order_by("id")
        .values_list("step_id", "iteration", "lane", "status")
    )


def expire_leases(run: Run) -> None:
    """Time control: every lease (or backoff) of the run's steps lapsed a second ago."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workflows_step SET lease_until = now() - interval '1 second'"
            " WHERE run_id = %s AND status IN ('ready', 'running')",
            [run.pk],
        )
        cursor.execute(
            "UPDATE workflows_step SET wake_at = now() - interval '1 second'"
            " WHERE run_id = %s AND status = 'waiting' AND wake_at IS NOT NULL",
            [run.pk],
        )


def claim_io(worker: str = "w1") -> list[ClaimedStep]:
    return claim(policy=lane_policy("io"), worker=worker, limit=10)


def claim_suspect_io(worker: str) -> ClaimedStep:
    """A step whose lease lapsed, claimed alone as a worker holding nothing does."""
    step = claim_suspect(policy=lane_policy("io"), worker=worker)
    assert step is not None
    return step


GREETING: dict[str, Any] = {
    "start": "greet",
    "steps": [
        {
            "id": "greet",
            "type": "set",
            "values": {"greeting": "Hello {{ input.name }}", "tags": ["new", "{{ input.tier }}"]},
            "next": "route",
        },
        {
            "id": "route",
            "type": "branch",
            "when": [{"outcome": "vip", "if": "input.tier == 'gold'"}],
            "next": {"vip": "thank", "default": "done"},
        },
        {"id": "thank", "type": "end", "output": {"text": "VIP: {{ vars.greeting }}"}},
        {
            "id": "done",
            "type": "end",
            "output": {"text": "{{ vars.greeting }}", "route": "{{ steps.route.output.outcome }}"},
        },
    ],
}


def io_definition(*, retry: int | None = None, on_failure: bool = False) -> dict[str, Any]:
    work: dict[str, Any] = {
        "id": "work",
        "type": "noop",
        "output": {"echo": "{{ input.name }}"},
        "next": "done",
    }
    if retry is not None:
        work["retry"] = {"max_attempts": retry}
    steps: list[dict[str, Any]] = [
        {"id": "prepare", "type": "set", "values": {"who": "{{ input.name }}"}, "next": "work"},
        work,
        {
            "id": "done",
            "type": "end",
            "output": {"who": "{{ vars.who }}", "echo": "{{ steps.work.output.echo }}"},
        },
    ]
    if on_failure:
        work["on_failure"] = "recover"
        steps.append(
            {"id": "recover", "type": "end", "output": {"recovered": "{{ vars.who }}"}},
        )
    return {"start": "prepare", "steps": steps}


# --- quick steps inline at start ------------------------------------------------------------


def test_quick_steps_finish_the_run_inside_run_start(org: Organisation) -> None:
    run = start(org, GREETING, {"name": "Ada", "tier": "gold"})

    assert run.status == "succeeded"
    assert run.finished_at is not None
    assert run.error == ""
    assert run.output == {"text": "VIP: Hello Ada"}
    assert run.vars == {"greeting": "Hello Ada", "tags": ["new", "gold"]}
    assert run.outputs == {
        "greet": {"greeting": "Hello Ada", "tags": ["new", "gold"]},
        "route": {"outcome": "vip"},
        "thank": {"text": "VIP: Hello Ada"},
    }
    assert run.steps_executed == 3
    assert run.entered == {"greet": 1, "route": 1, "thank": 1}
    assert events(run) == [
        ("run.started", ""),
        ("step.succeeded", "greet"),
        ("step.succeeded", "route"),
        ("step.succeeded", "thank"),
        ("run.succeeded", ""),
    ]
    assert step_rows(run) == [
        ("greet", 1, "inline", "done"),
        ("route", 1, "inline", "done"),
        ("thank", 1, "inline", "done"),
    ]
    # Quick steps never wait in a queue: no lease, no outbox row.
    assert not Step.objects.filter(run=run, lease_until__isnull=False).exists()
    assert not Outbox.objects.exists()
    started = RunEvent.objects.get(run=run, kind="run.started")
    assert started.detail == {"version_id": run.version_id}


def test_the_default_outcome_and_step_outputs_reach_templates(org: Organisation) -> None:
    run = start(org, GREETING, {"name": "Bo", "tier": "silver"})

    assert run.status == "succeeded"
    assert run.output == {"text": "Hello Bo", "route": "default"}
    assert [kind_step for kind_step in events(run) if kind_step[0] == "step.succeeded"] == [
        ("step.succeeded", "greet"),
        ("step.succeeded", "route"),
        ("step.succeeded", "done"),
    ]


BRANCH_ORDER: dict[str, Any] = {
    "start": "route",
    "steps": [
        {
            "id": "route",
            "type": "branch",
            # Both conditions hold for n > 10: the first in the list must win.
            "when": [
                {"outcome": "big", "if": "input.n > 10"},
                {"outcome": "positive", "if": "input.n > 0"},
            ],
            "next": {"big": "mark_big", "positive": "mark_positive", "default": "mark_other"},
        },
        {"id": "mark_big", "type": "set", "values": {"kind": "big"}},
        {"id": "mark_positive", "type": "set", "values": {"kind": "positive"}},
        {"id": "mark_other", "type": "set", "values": {"kind": "other"}},
    ],
}


@pytest.mark.parametrize(
    ("n", "outcome", "kind"),
    [(50, "big", "big"), (5, "positive", "positive"), (0, "default", "other")],
)
def test_branch_conditions_are_tried_in_list_order(
    org: Organisation, n: int, outcome: str, kind: str
) -> None:
    run = start(org, BRANCH_ORDER, {"n": n})

    assert run.status == "succeeded"
    assert run.outputs["route"] == {"outcome": outcome}
    assert run.vars == {"kind": kind}
    assert [s for s, *_ in step_rows(run)] == ["route", f"mark_{kind}"]


def test_a_path_that_ends_without_an_end_step_succeeds_the_run(org: Organisation) -> None:
    definition = {
        "start": "a",
        "steps": [
            {"id": "a", "type": "set", "values": {"x": "1"}, "next": "b"},
            {"id": "b", "type": "set", "values": {"y": "{{ vars.x }}2"}},
        ],
    }
    run = start(org, definition)

    assert run.status == "succeeded"
    assert run.output is None
    assert run.error == ""
    assert run.finished_at is not None
    assert run.vars == {"x": "1", "y": "12"}
    assert events(run) == [
        ("run.started", ""),
        ("step.succeeded", "a"),
        ("step.succeeded", "b"),
        ("run.succeeded", ""),
    ]


def test_end_with_status_failed_fails_the_run(org: Organisation) -> None:
    definition = {
        "start": "stop",
        "steps": [
            {"id": "stop", "type": "end", "status": "failed", "output": {"why": "{{ input.why }}"}}
        ],
    }
    run = start(org, definition, {"why": "rejected"})

    assert run.status == "failed"
    assert run.output == {"why": "rejected"}
    assert run.finished_at is not None
    assert events(run) == [("run.started", ""), ("step.succeeded", "stop"), ("run.failed", "")]
    assert step_rows(run) == [("stop", 1, "inline", "done")]


# --- failures of quick steps ----------------------------------------------------------------

UNDEFINED: dict[str, Any] = {
    "start": "greet",
    "steps": [
        {"id": "greet", "type": "set", "values": {"g": "Hi {{ input.missing }}"}, "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


def test_a_template_error_fails_the_step_and_the_run(org: Organisation) -> None:
    run = start(org, UNDEFINED, {"name": "Ada"})

    assert run.status == "failed"
    assert run.finished_at is not None
    assert run.error.startswith("step 'greet' failed: template error:")
    assert "missing" in run.error
    assert run.vars == {}
    step = Step.objects.get(run=run)
    assert (step.step_id, step.status, step.lane, step.attempt) == ("greet", "failed", "inline", 1)
    assert step.error.startswith("template error:")
    assert "missing" in step.error
    assert events(run) == [("run.started", ""), ("step.failed", "greet"), ("run.failed", "")]
    failed = RunEvent.objects.get(run=run, kind="step.failed")
    assert failed.detail == {"error": step.error}
    assert RunEvent.objects.get(run=run, kind="run.failed").detail == {"error": run.error}


def test_a_template_error_follows_on_failure(org: Organisation) -> None:
    definition = {
        "start": "greet",
        "steps": [
            {
                "id": "greet",
                "type": "set",
                "values": {"g": "Hi {{ input.missing }}"},
                "next": "done",
                "on_failure": "fallback",
            },
            {"id": "fallback", "type": "set", "values": {"g": "Hi stranger"}, "next": "done"},
            {"id": "done", "type": "end", "output": "{{ vars.g }}"},
        ],
    }
    run = start(org, definition, {})

    assert run.status == "succeeded"
    assert run.error == ""
    assert run.output == "Hi stranger"
    assert step_rows(run) == [
        ("greet", 1, "inline", "failed"),
        ("fallback", 1, "inline", "done"),
        ("done", 1, "inline", "done"),
    ]
    assert events(run) == [
        ("run.started", ""),
        ("step.failed", "greet"),
        ("step.succeeded", "fallback"),
        ("step.succeeded", "done"),
        ("run.succeeded", ""),
    ]


def test_a_failing_branch_condition_fails_the_run(org: Organisation) -> None:
    definition = {
        "start": "route",
        "steps": [
            {
                "id": "route",
                "type": "branch",
                "when": [{"outcome": "big", "if": "input.total > 100"}],
                "next": {"big": "done", "default": "done"},
            },
            {"id": "done", "type": "end"},
        ],
    }
    run = start(org, definition, {"name": "no total"})

    assert run.status == "failed"
    assert run.error.startswith("step 'route' failed: condition 'big':")
    assert events(run) == [("run.started", ""), ("step.failed", "route"), ("run.failed", "")]


# --- budgets --------------------------------------------------------------------------------

LOOP: dict[str, Any] = {
    "start": "a",
    "limits": {"max_steps": 7},
    "steps": [
        {"id": "a", "type": "set", "values": {"side": "a"}, "next": "b"},
        {"id": "b", "type": "set", "values": {"side": "b"}, "next": "a"},
    ],
}


def test_a_quick_loop_fails_on_its_step_budget(org: Organisation) -> None:
    run = start(org, LOOP)

    assert run.status == "failed"
    assert run.error.startswith("step_budget_exceeded")
    assert run.error == "step_budget_exceeded: the run entered 7 steps"
    assert run.max_steps == 7
    assert run.steps_executed == 7
    assert run.entered == {"a": 4, "b": 3}
    assert run.vars == {"side": "a"}  # the 7th step entered was `a`
    assert Step.objects.filter(run=run).count() == 7
    assert list(
        Step.objects.filter(run=run, step_id="a").order_by("id").values_list("iteration", flat=True)
    ) == [1, 2, 3, 4]
    kinds = [kind for kind, _ in events(run)]
    assert kinds == ["run.started", *["step.succeeded"] * 7, "run.failed"]


def test_a_long_quick_loop_still_ends_on_its_budget(org: Organisation) -> None:
    # max_steps = 1000 is the engine-wide default: an ordinary budget, not an extreme one.
    # The start walks 100 quick steps inline; continuations on the io lane walk the rest.
    run = start(org, {**LOOP, "limits": {"max_steps": 1000}})
    assert (run.status, run.steps_executed) == ("running", 100)

    run, continuations = continue_walks(run)

    assert continuations == 9
    assert run.status == "failed"
    assert run.error == "step_budget_exceeded: the run entered 1000 steps"
    assert Step.objects.filter(run=run).exclude(type="continue").count() == 1000
    assert Step.objects.filter(run=run, type="continue", status="done").count() == 9


def chain(length: int) -> dict[str, Any]:
    """A loop-free chain of `length` set steps and an end: valid up to 499 set steps."""
    ids = [f"s{i}" for i in range(length)]
    steps: list[dict[str, Any]] = [
        {"id": sid, "type": "set", "values": {"last": sid}, "next": nxt}
        for sid, nxt in zip(ids, [*ids[1:], "fin"], strict=True)
    ]
    return {"start": "s0", "steps": [*steps, {"id": "fin", "type": "end"}]}


def test_a_short_chain_runs_every_step(org: Organisation) -> None:
    run = start(org, chain(99))  # 100 quick steps: the inline budget of one walk

    assert run.status == "succeeded", run.error
    assert run.steps_executed == 100
    assert run.vars == {"last": "s98"}


def test_a_long_valid_chain_runs_every_step(org: Organisation) -> None:
    run = start(org, chain(490))
    assert run.status == "running"
    run, continuations = continue_walks(run)
    assert continuations == 4

    assert run.status == "succeeded", run.error
    assert run.steps_executed == 491
    assert run.vars == {"last": "s489"}


def test_limits_set_the_budget_and_deadline(org: Organisation) -> None:
    definition = {**GREETING, "limits": {"max_steps": 12, "max_age": "90s"}}
    run = start(org, definition, {"name": "Ada", "tier": "gold"})

    assert run.max_steps == 12
    # Both come from the same now() of the start transaction.
    assert run.deadline_at - run.created_at == timedelta(seconds=90)


def test_without_limits_the_engine_defaults_apply(org: Organisation) -> None:
    run = start(org, GREETING, {"name": "Ada", "tier": "gold"})

    assert run.max_steps == settings.WAYMARK["DEFAULT_MAX_STEPS"]
    assert run.deadline_at - run.created_at == timedelta(
        seconds=settings.WAYMARK["DEFAULT_MAX_AGE_SECONDS"]
    )


def test_a_run_past_its_max_age_fails_when_it_moves_on(org: Organisation) -> None:
    definition = {**io_definition(), "limits": {"max_age": "1s"}}
    run = start(org, definition, {"name": "Ada"})
    assert run.deadline_at - run.created_at == timedelta(seconds=1)
    (claimed,) = claim_io()
    with connection.cursor() as cursor:  # time control: the deadline has passed
        cursor.execute("UPDATE workflows_run SET deadline_at = now() WHERE id = %s", [run.pk])

    assert settle_success(claimed, StepResult(output={"echo": "Ada"}), worker="w1") is True

    run.refresh_from_db()
    assert run.status == "failed"
    assert run.error.startswith("max_age_exceeded")
    assert run.finished_at is not None
    # The step's own result is kept, but `done` was never entered.
    assert step_rows(run) == [("prepare", 1, "inline", "done"), ("work", 1, "io", "done")]
    assert [kind for kind, _ in events(run)][-2:] == ["step.succeeded", "run.failed"]


# --- a lane step: ready row, outbox, claim, settle ------------------------------------------


def test_a_lane_step_becomes_a_ready_row_with_one_wake_up(org: Organisation) -> None:
    run = start(org, io_definition(), {"name": "Ada"})

    assert run.status == "running"
    assert run.finished_at is None
    assert run.vars == {"who": "Ada"}
    assert run.steps_executed == 2
    assert step_rows(run) == [("prepare", 1, "inline", "done"), ("work", 1, "io", "ready")]
    work = Step.objects.get(run=run, step_id="work")
    assert work.type == "noop"
    assert work.attempt == 0
    assert work.owner is None
    assert work.lease_until is not None
    assert work.max_attempts == lane_policy("io").max_attempts
    assert events(run) == [
        ("run.started", ""),
        ("step.succeeded", "prepare"),
        ("step.ready", "work"),
    ]
    outbox = Outbox.objects.get()
    assert outbox.org_id == org.pk
    assert outbox.topic == "lane.wake"
    assert outbox.payload == {"lane": "io", "run": run.pk}
    assert outbox.sent_at is None


def test_retry_max_attempts_on_the_step_overrides_the_lane(org: Organisation) -> None:
    run = start(org, io_definition(retry=2), {"name": "Ada"})

    assert Step.objects.get(run=run, step_id="work").max_attempts == 2


def test_claim_then_settle_walks_on_and_finishes_the_run(org: Organisation) -> None:
    run = start(org, io_definition(), {"name": "Ada"})

    claimed = claim_io("w1")
    assert len(claimed) == 1
    step = claimed[0]
    assert (step.run_id, step.step_id, step.iteration, step.type) == (run.pk, "work", 1, "noop")
    assert step.attempt == 1
    assert step.version_id == run.version_id
    row = Step.objects.get(pk=step.id)
    assert (row.status, row.owner, row.attempt) == ("running", "w1", 1)
    claimed_event = RunEvent.objects.get(run=run, kind="step.claimed")
    assert (claimed_event.step_id, claimed_event.attempt, claimed_event.worker) == ("work", 1, "w1")
    # Nothing else is claimable while the lease holds.
    assert claim_io("w2") == []

    # Execute it the way a worker does: definition + context, then the executor.
    step_def, context = run_context(step)
    assert step_def["id"] == "work"
    assert context["input"] == {"name": "Ada"}
    assert context["vars"] == {"who": "Ada"}
    result = executor_for(step.type)(step_def, context, step_context(step))
    assert result.output == {"echo": "Ada"}

    assert settle_success(step, result, worker="w1") is True

    run.refresh_from_db()
    assert run.status == "succeeded"
    assert run.output == {"who": "Ada", "echo": "Ada"}
    assert run.finished_at is not None
    assert run.steps_executed == 3
    work = Step.objects.get(pk=step.id)
    assert (work.status, work.owner, work.lease_until) == ("done", None, None)
    assert work.output == {"echo": "Ada"}
    assert work.finished_at is not None
    assert events(run) == [
        ("run.started", ""),
        ("step.succeeded", "prepare"),
        ("step.ready", "work"),
        ("step.claimed", "work"),
        ("step.succeeded", "work"),
        ("step.succeeded", "done"),
        ("run.succeeded", ""),
    ]
    settled = RunEvent.objects.get(run=run, kind="step.succeeded", step_id="work")
    assert (settled.attempt, settled.worker) == (1, "w1")

    # The same token again: refused, nothing written.
    before = RunEvent.objects.count()
    assert settle_success(step, StepResult(output={"echo": "again"}), worker="w1") is False
    assert settle_failure(step, StepFailure("late"), worker="w1", policy=lane_policy("io")) is False
    assert RunEvent.objects.count() == before
    assert Step.objects.get(pk=step.id).output == {"echo": "Ada"}
    run.refresh_from_db()
    assert run.output == {"who": "Ada", "echo": "Ada"}


def test_a_retryable_failure_schedules_a_retry_then_fails_the_run(org: Organisation) -> None:
    run = start(org, io_definition(retry=2), {"name": "Ada"})
    io = lane_policy("io")

    (first,) = claim_io("w1")
    assert first.attempt == 1
    assert settle_failure(first, StepFailure("provider down"), worker="w1", policy=io) is True

    row = Step.objects.get(pk=first.id)
    # Not yet due: it waits out its backoff outside the claimable index.
    assert (row.status, row.wait_kind) == ("waiting", "retry")
    assert row.wake_at is not None and row.lease_until is None
    assert claim_io("w2") == []
    assert row.error == "provider down"
    assert row.owner is None
    assert row.attempt == 1
    assert row.finished_at is None
    run.refresh_from_db()
    assert run.status == "running"
    retry = RunEvent.objects.get(run=run, kind="step.retry_scheduled")
    assert (retry.step_id, retry.attempt, retry.worker) == ("work", 1, "w1")
    assert retry.detail is not None
    assert retry.detail["error"] == "provider down"
    assert 0 <= retry.detail["delay_seconds"] <= io.backoff_base_seconds

    expire_leases(run)  # time control: the backoff is over
    assert claim_io("w2") == []  # due, but not ready until promoted
    assert promote_due_retries(lane="io", worker="w2") == 1
    (second,) = claim_io("w2")
    assert second.id == first.id
    assert second.attempt == 2
    assert settle_failure(second, StepFailure("still down"), worker="w2", policy=io) is True

    row.refresh_from_db()
    assert row.status == "failed"
    assert row.error == "still down"
    assert row.finished_at is not None
    run.refresh_from_db()
    assert run.status == "failed"
    assert run.error == "step 'work' failed: still down"
    assert run.finished_at is not None
    assert events(run) == [
        ("run.started", ""),
        ("step.succeeded", "prepare"),
        ("step.ready", "work"),
        ("step.claimed", "work"),
        ("step.retry_scheduled", "work"),
        ("step.retry_due", "work"),
        ("step.claimed", "work"),
        ("step.failed", "work"),
        ("run.failed", ""),
    ]
    assert not Step.objects.filter(run=run, step_id="done").exists()


def test_a_non_retryable_failure_follows_on_failure_at_once(org: Organisation) -> None:
    run = start(org, io_definition(retry=5, on_failure=True), {"name": "Ada"})

    (step,) = claim_io()
    failure = StepFailure("bad request", retryable=False)
    assert settle_failure(step, failure, worker="w1", policy=lane_policy("io")) is True

    run.refresh_from_db()
    assert run.status == "succeeded"
    assert run.output == {"recovered": "Ada"}
    assert step_rows(run) == [
        ("prepare", 1, "inline", "done"),
        ("work", 1, "io", "failed"),
        ("recover", 1, "inline", "done"),
    ]
    assert not RunEvent.objects.filter(run=run, kind="step.retry_scheduled").exists()


def test_a_backoff_in_the_future_is_not_claimable(org: Organisation) -> None:
    start(org, io_definition(retry=3), {"name": "Ada"})
    (step,) = claim_io()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workflows_step SET status = 'ready', owner = NULL,"
            " lease_until = now() + interval '10 seconds' WHERE id = %s",
            [step.id],
        )
    assert claim_io("w2") == []


def test_a_lapsed_lease_is_reclaimed_and_the_old_attempt_is_fenced_out(
    org: Organisation,
) -> None:
    run = start(org, io_definition(), {"name": "Ada"})

    (first,) = claim_io("w1")
    assert first.attempt == 1
    expire_leases(run)  # time control: w1 stopped heartbeating
    assert claim_io("w2") == []  # a lapsed lease makes a suspect: claimed alone, below
    second = claim_suspect_io("w2")
    assert second.id == first.id
    assert second.attempt == 2
    assert Step.objects.get(pk=first.id).owner == "w2"

    # w1 wakes up and tries to settle: refused, whether it succeeded or failed.
    assert settle_success(first, StepResult(output={"echo": "stale"}), worker="w1") is False
    assert (
        settle_failure(first, StepFailure("stale"), worker="w1", policy=lane_policy("io")) is False
    )
    row = Step.objects.get(pk=first.id)
    assert (row.status, row.owner, row.attempt, row.output) == ("running", "w2", 2, None)
    run.refresh_from_db()
    assert run.status == "running"

    assert settle_success(second, StepResult(output={"echo": "fresh"}), worker="w2") is True
    run.refresh_from_db()
    assert run.status == "succeeded"
    assert run.output == {"who": "Ada", "echo": "fresh"}
    claims = RunEvent.objects.filter(run=run, kind="step.claimed").order_by("id")
    assert [(e.attempt, e.worker) for e in claims] == [(1, "w1"), (2, "w2")]
    settled = RunEvent.objects.filter(run=run, kind="step.succeeded", step_id="work")
    assert [(e.attempt, e.worker) for e in settled] == [(2, "w2")]


def test_claims_that_never_settle_use_up_the_attempts(org: Organisation) -> None:
    run = start(org, io_definition(retry=2), {"name": "Ada"})

    (first,) = claim_io("w1")
    expire_leases(run)  # w1 died holding it
    second = claim_suspect_io("w2")
    expire_leases(run)  # and so did w2
    third = claim_suspect_io("w3")

    assert [c.attempt for c in (first, second, third)] == [1, 2, 3]
    assert [c.poisoned for c in (first, second, third)] == [False, False, True]
    assert third.attempts_used == 3


def test_released_claims_do_not_count_as_attempts(org: Organisation) -> None:
    run = start(org, io_definition(retry=1), {"name": "Ada"})

    (first,) = claim_io("w1")
    assert release(held=[(first.id, first.attempt)], worker="w1") == 1
    row = Step.objects.get(pk=first.id)
    assert (row.status, row.owner, row.release_count) == ("ready", None, 1)
    assert RunEvent.objects.filter(run=run, kind="step.released", worker="w1").count() == 1
    # The release wakes the lane (one wake-up from the start, one from the release).
    assert Outbox.objects.filter(topic="lane.wake", payload__lane="io").count() == 2

    (second,) = claim_io("w2")  # at once: the release set lease_until = now()
    assert second.attempt == 2
    assert second.attempts_used == 1
    assert second.poisoned is False
    # The old token can neither settle nor release again.
    assert release(held=[(first.id, first.attempt)], worker="w1") == 0
    assert settle_success(first, StepResult(output={"echo": "old"}), worker="w1") is False
    assert settle_success(second, StepResult(output={"echo": "new"}), worker="w2") is True
    run.refresh_from_db()
    assert run.status == "succeeded"
    assert run.output == {"who": "Ada", "echo": "new"}


def test_a_settle_walks_the_version_the_run_has_when_locked_not_at_claim(org) -> None:
    def version(label: str) -> dict[str, Any]:
        return {
            "start": "work",
            "steps": [
                {"id": "work", "type": "noop", "next": "done"},
                {"id": "done", "type": "end", "output": label},
            ],
        }

    run = start(org, version("v1"))
    (step,) = claim_io()
    # A migration moves the run to the next version between the claim and the settle.
    newer = automation_publish_definition(org=org, slug="flow", definition=version("v2"))
    Run.objects.filter(pk=run.pk).update(version=newer)

    assert settle_success(step, StepResult(output=None), worker="w1")

    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "v2")
