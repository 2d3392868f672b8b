"""A settle that claims the run's next step for the same worker, in the same transaction:
a hop between io steps costs one transaction, not a wake-up through the relay and a claim."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from django.db import connection

from workflows.engine.executors import StepResult
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim, settle_and_take_next
from workflows.engine.walk import TakeNext
from workflows.models import Outbox, Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.control import run_act
from workflows.services.runs import run_start

from .factories import OrganisationFactory
from .processes import spawn_relay, spawn_worker, wait_for

THREE: dict[str, Any] = {
    "start": "a",
    "steps": [
        {"id": "a", "type": "noop", "next": "b"},
        {"id": "b", "type": "noop", "next": "c"},
        {"id": "c", "type": "probe", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}
TAKE = TakeNext(worker="w", lane="io", lease_seconds=30)


def start(org, key: str = "k") -> Run:
    automation_publish_definition(org=org, slug="three", definition=THREE)
    return Run.objects.get(pk=run_start(org=org, automation_slug="three", run_input={},
                                        start_key=key).run_id)  # fmt: skip


def wakes(run: Run) -> int:
    return Outbox.objects.filter(topic="lane.wake", payload__run=run.pk).count()


@pytest.mark.django_db
def test_a_settle_takes_the_next_step_of_its_lane_already_claimed(org) -> None:
    run = start(org)
    (a,) = claim(policy=lane_policy("io"), worker="w", limit=1)

    settled = settle_and_take_next(a, StepResult(output=1), worker="w", take=TAKE)

    assert settled.ok
    b = settled.next_step
    assert b is not None and (b.step_id, b.attempt, b.type) == ("b", 1, "noop")
    row = Step.objects.get(pk=b.id)
    assert (row.status, row.owner, row.attempt) == ("running", "w", 1)
    assert row.lease_until is not None
    assert b.run_outputs["a"] == 1  # the run's data as this transaction left it
    assert wakes(run) == 1  # the start's only: nobody else needs waking for b
    kinds = list(RunEvent.objects.filter(run=run, step_id="b").values_list("kind", flat=True))
    assert kinds == ["step.ready", "step.claimed"]
    assert claim(policy=lane_policy("io"), worker="other", limit=5) == []

    # It is fenced like any claim: its attempt-1 settle goes through, and walks on.
    again = settle_and_take_next(b, StepResult(output=2), worker="w", take=TAKE)
    assert again.ok and again.next_step is not None and again.next_step.step_id == "c"


@pytest.mark.django_db
def test_nothing_is_taken_for_a_paused_run_or_without_an_offer(org) -> None:
    run = start(org)
    (a,) = claim(policy=lane_policy("io"), worker="w", limit=1)
    run_act(org=org, run_id=run.pk, action="pause", actor="t")

    settled = settle_and_take_next(a, StepResult(output=1), worker="w", take=TAKE)
    assert settled.ok and settled.next_step is None
    assert not Step.objects.filter(run=run, step_id="b").exists()  # parked in a continuation

    other = start(org, "k2")
    (a2,) = claim(policy=lane_policy("io"), worker="w", limit=1)
    assert a2.run_id == other.pk
    plain = settle_and_take_next(a2, StepResult(output=1), worker="w")
    assert plain.next_step is None
    assert Step.objects.get(run=other, step_id="b").status == "ready"


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_a_chain_of_io_steps_from_one_wake_up(org, procs) -> None:
    run = start(org)
    procs.extend([spawn_relay(), spawn_worker(concurrency=2)])
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "succeeded", what="the run")
    assert wakes(run) == 1  # b and c were taken by the settles before them
    pids = {(s.output or {})["pid"] for s in Step.objects.filter(run=run, step_id="c")}
    assert len(pids) == 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_dies_running_a_step_it_took_leaves_it_to_another(org, procs) -> None:
    # a settles and takes b in one transaction; b kills its worker. b's lease lapses and a
    # second worker claims it as a suspect (alone): the run finishes once, b on attempt 2.
    automation_publish_definition(org=org, slug="crash", definition={
        "start": "a",
        "steps": [
            {"id": "a", "type": "probe", "next": "b"},
            {"id": "b", "type": "probe", "crash_attempts": 1, "next": "done"},
            {"id": "done", "type": "end"},
        ],
    })  # fmt: skip
    run_id = run_start(org=org, automation_slug="crash", run_input={}, start_key="k").run_id
    first = spawn_worker(concurrency=1)
    procs.extend([spawn_relay(), first])
    assert first.wait(timeout=120) == 137  # died on b, which it had taken itself
    b = Step.objects.get(run_id=run_id, step_id="b")
    assert (b.status, b.attempt) == ("running", 1)
    assert f":{first.pid}:" in (b.owner or "")

    another_worker_finishes(procs, run_id, b)


def another_worker_finishes(procs: list, run_id: int, step: Step) -> None:
    """A second worker takes the dead worker's step as a suspect: the run succeeds once,
    the step on its second attempt."""
    procs.append(spawn_worker(concurrency=1))
    wait_for(lambda: Run.objects.get(pk=run_id).status == "succeeded", timeout=120,
             what="another worker to finish the run")  # fmt: skip
    step.refresh_from_db()
    assert (step.status, step.attempt) == ("done", 2)
    assert RunEvent.objects.filter(run_id=run_id, kind="run.succeeded").count() == 1


# --- a settle that claims for the lane (TakeNext.claim_lane) --------------------------------

ONE: dict[str, Any] = {
    "start": "only",
    "steps": [{"id": "only", "type": "noop", "next": "done"}, {"id": "done", "type": "end"}],
}
LANE = TakeNext(worker="w", lane="io", lease_seconds=30, claim_lane=True)


def start_one(org, key: str) -> Run:
    automation_publish_definition(org=org, slug="one", definition=ONE)
    return Run.objects.get(pk=run_start(org=org, automation_slug="one", run_input={},
                                        start_key=key).run_id)  # fmt: skip


def xmin(step_pk: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text::bigint FROM workflows_step WHERE id = %s", [step_pk])
        return int(cursor.fetchone()[0])


@pytest.mark.django_db
def test_a_settle_that_ends_its_run_claims_the_lanes_next_step_in_its_transaction(org) -> None:
    first, second = start_one(org, "k1"), start_one(org, "k2")
    (only,) = claim(policy=lane_policy("io"), worker="w", limit=1)
    assert only.run_id == first.pk  # the older ready step first

    settled = settle_and_take_next(only, StepResult(output=1), worker="w", take=LANE)

    assert settled.ok and settled.from_lane
    taken = settled.next_step
    assert taken is not None and (taken.run_id, taken.step_id, taken.attempt) == (
        second.pk, "only", 1,
    )  # fmt: skip
    assert Run.objects.get(pk=first.pk).status == "succeeded"
    row = Step.objects.get(pk=taken.id)
    assert (row.status, row.owner) == ("running", "w")
    # One transaction wrote both: the settle of the first run and the claim of the second.
    assert xmin(only.id) == xmin(taken.id)
    assert RunEvent.objects.filter(run=second, kind="step.claimed", worker="w").count() == 1
    assert claim(policy=lane_policy("io"), worker="other", limit=5) == []


@pytest.mark.django_db
def test_without_claim_lane_or_with_nothing_ready_a_settle_claims_nothing(org) -> None:
    start_one(org, "k1"), start_one(org, "k2")
    (only,) = claim(policy=lane_policy("io"), worker="w", limit=1)
    plain = settle_and_take_next(only, StepResult(output=1), worker="w", take=TAKE)
    assert plain.ok and plain.next_step is None and not plain.from_lane

    (last,) = claim(policy=lane_policy("io"), worker="w", limit=1)
    alone = settle_and_take_next(last, StepResult(output=1), worker="w", take=LANE)
    assert alone.ok and alone.next_step is None and not alone.from_lane


@pytest.mark.django_db
def test_the_settles_claim_is_the_fair_claim_going_on_after_the_last_organisation(org) -> None:
    low, middle, high = sorted([org, *OrganisationFactory.create_batch(2)], key=lambda o: o.pk)
    for each in (low, middle, high):
        start_one(each, "k")
    (only,) = claim(policy=lane_policy("io"), worker="w", limit=1, after_org=low.pk)
    assert only.org_id == middle.pk
    settled = settle_and_take_next(
        only, StepResult(output=1), worker="w", take=replace(LANE, after_org=middle.pk)
    )
    # The organisation after the one served last, not the first one again.
    assert settled.next_step is not None and settled.next_step.org_id == high.pk


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_dies_on_a_step_its_settle_claimed_leaves_it_to_another(org, procs):
    # The worker runs the first run's only step; its settle ends that run and claims the
    # second run's step in the same transaction; that step kills the worker. Its lease
    # lapses and another worker finishes it: the second run succeeds once, on attempt 2.
    automation_publish_definition(org=org, slug="calm", definition={
        "start": "a", "steps": [{"id": "a", "type": "probe", "next": "done"},
                                {"id": "done", "type": "end"}],
    })  # fmt: skip
    automation_publish_definition(org=org, slug="crash", definition={
        "start": "b", "steps": [{"id": "b", "type": "probe", "crash_attempts": 1,
                                 "next": "done"}, {"id": "done", "type": "end"}],
    })  # fmt: skip
    calm = run_start(org=org, automation_slug="calm", run_input={}, start_key="c").run_id
    doomed = run_start(org=org, automation_slug="crash", run_input={}, start_key="d").run_id
    first = spawn_worker(concurrency=1)
    procs.append(first)
    assert first.wait(timeout=120) == 137  # died on b
    a = Step.objects.get(run_id=calm, step_id="a")
    b = Step.objects.get(run_id=doomed, step_id="b")
    assert Run.objects.get(pk=calm).status == "succeeded"
    assert (b.status, b.attempt) == ("running", 1)
    assert f":{first.pid}:" in (b.owner or "")
    assert xmin(a.pk) == xmin(b.pk)  # b was claimed by the settle of a, not by a claim

    another_worker_finishes(procs, doomed, b)
