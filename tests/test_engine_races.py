"""Races on the hot SQL, with real threads on real connections."""

from __future__ import annotations

from collections import Counter

import pytest

from workflows.engine.lanes import lane_policy
from workflows.engine.steps import ClaimedStep, claim, next_after_org
from workflows.models import Run, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import StartResult, run_start

from .concurrency import race
from .factories import IO_DEFINITION, OrganisationFactory

pytestmark = pytest.mark.django_db(transaction=True)


def ready_steps(org, count: int) -> None:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    for index in range(count):
        run_start(org=org, automation_slug="io", run_input={"i": index}, start_key=f"k{index}")


def test_racing_workers_claim_one_step_exactly_once(org) -> None:
    ready_steps(org, 1)
    policy = lane_policy("io")
    results = race(8, lambda i: claim(policy=policy, worker=f"w{i}", limit=1))
    claimed = [r for r in results if r]
    assert not [r for r in results if isinstance(r, Exception)]
    assert len(claimed) == 1 and claimed[0][0].attempt == 1
    step = Step.objects.get(step_id="work")
    winner = next(i for i, r in enumerate(results) if r)
    assert (step.owner, step.attempt, step.status) == (f"w{winner}", 1, "running")


def test_racing_workers_share_a_backlog_without_duplicates(org) -> None:
    ready_steps(org, 300)
    policy = lane_policy("io")

    def drain(index: int) -> list[int]:
        taken: list[int] = []
        while batch := claim(policy=policy, worker=f"w{index}", limit=7):
            taken.extend(step.id for step in batch)
        return taken

    results = race(6, drain)
    assert not [r for r in results if isinstance(r, Exception)], results
    counts = Counter(step_id for taken in results for step_id in taken)
    assert len(counts) == 300
    assert set(counts.values()) == {1}
    assert Step.objects.filter(step_id="work", status="running", attempt=1).count() == 300


def test_claims_are_fair_across_organisations(org) -> None:
    busy, quiet = org, OrganisationFactory.create()
    ready_steps(busy, 400)
    ready_steps(quiet, 3)
    policy = lane_policy("io")
    batch: list[ClaimedStep] = claim(policy=policy, worker="w", limit=10)
    # The quiet organisation's 3 steps are not queued behind the busy one's 400: each of the
    # two organisations gets at most half of the batch.
    assert Counter(step.org_id for step in batch) == {quiet.pk: 3, busy.pk: 5}
    # The next claim (the worker claims again at once after a short batch) fills the slots
    # left over from the busy backlog.
    refill = claim(policy=policy, worker="w", limit=2)
    assert Counter(step.org_id for step in refill) == {busy.pk: 2}


def test_claim_rotates_which_organisation_leads(org) -> None:
    first, second = org, OrganisationFactory.create()
    ready_steps(first, 5)
    ready_steps(second, 5)
    policy = lane_policy("io")
    one = claim(policy=policy, worker="w", limit=1, after_org=0)
    two = claim(policy=policy, worker="w", limit=1, after_org=one[0].org_id)
    assert {one[0].org_id, two[0].org_id} == {first.pk, second.pk}


def test_two_hundred_concurrent_duplicate_starts_make_one_run(org) -> None:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    results = race(
        200,
        lambda i: run_start(
            org=org, automation_slug="io", run_input={"event": "evt_7Hq2"}, start_key="evt_7Hq2"
        ),
    )
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors[:3]
    assert isinstance(results[0], StartResult)
    assert Counter(r.created for r in results) == {True: 1, False: 199}
    assert len({r.run_id for r in results}) == 1
    assert Run.objects.count() == 1
    assert Step.objects.count() == 1


def test_successive_claims_rotate_through_many_organisations(org) -> None:
    orgs = [org, *(OrganisationFactory.create() for _ in range(4))]
    for each in orgs:
        ready_steps(each, 3)
    policy = lane_policy("io")
    after, seen_per_claim = 0, []
    for _ in range(3):
        batch = claim(policy=policy, worker="w", limit=2, after_org=after)
        seen_per_claim.append({step.org_id for step in batch})
        after = next_after_org(batch, after)
    # Each claim of 2 serves 2 organisations (one step each), and the next claim continues
    # after them, wrapping around: 3 claims reach all 5 organisations.
    assert [len(seen) for seen in seen_per_claim] == [2, 2, 2]
    assert set().union(*seen_per_claim) == {o.pk for o in orgs}
