"""One organisation cannot hold a lane (issue 27, item 1): each is owed a share of a worker's
slots, and past it only borrows, keeping a reserve free for another organisation's work.

The claims are the real statement on the real database (sql.CLAIM, through steps.claim, with a
worker's holdings as lanes.FairShare); the last test is the attack as it was reproduced: a
tenant's calls hang at a host that never answers, and another organisation's run still
finishes, on the real engine (`runengine` processes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pytest
from django.db import connection

from workflows.engine import sql
from workflows.engine.lanes import lane_policy
from workflows.engine.sql.rows import query_prepared
from workflows.engine.steps import ClaimedStep, claim
from workflows.engine.walk import TakeNext
from workflows.models import Organisation
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .engine_harness import Engine, make_harness, stub_servers
from .factories import (
    IO_DEFINITION,
    QUICK_CALL_DEFINITION,
    SLOW_CALL_DEFINITION,
    OrganisationFactory,
)
from .stubs import Tarpit

IO = lane_policy("io")


def _ready(org: Organisation, count: int) -> None:
    """``count`` runs of ``org``, each with one ready io step."""
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    for n in range(count):
        run_start(org=org, automation_slug="io", run_input={}, start_key=f"k{n}")


class Slots:
    """A worker's slots of the io lane, as its claim loop fills them."""

    def __init__(self, slots: int = 32) -> None:
        self.slots = slots
        self.held: list[ClaimedStep] = []

    def claim(self) -> Counter[int]:
        """One claim for every free slot: how many steps it took per organisation."""
        share = IO.fair_share(self.slots, (step.org_id for step in self.held))
        taken = claim(policy=IO, worker="w", limit=self.slots - len(self.held), share=share)
        self.held.extend(taken)
        return Counter(step.org_id for step in taken)

    def by_org(self) -> Counter[int]:
        return Counter(step.org_id for step in self.held)


def test_the_shares_of_a_lane_leave_room_for_four_organisations() -> None:
    share = IO.fair_share(32, [])
    assert (share.share, share.borrowable) == (8, 24)
    assert IO.fair_share(32, [1] * 24).borrowable == 0  # the reserve: 8 slots
    assert IO.fair_share(4, []).share == 1  # a lane of four slots: one each, 3 for one alone
    assert IO.fair_share(4, []).borrowable == 3
    whole = replace(IO, org_share=1.0)  # an operator who wants no sharing
    assert (whole.fair_share(32, []).share, whole.fair_share(32, []).borrowable) == (32, 32)


@pytest.mark.django_db
def test_one_organisation_alone_keeps_a_reserve_free_and_a_newcomer_gets_it_at_once(org) -> None:
    _ready(org, 40)
    slots = Slots()
    assert slots.claim() == {org.pk: 24}  # its share, 8, and 16 borrowed: 8 stay free
    assert slots.claim() == {}  # it borrows no further, though 16 of its steps are ready

    other = OrganisationFactory.create()
    _ready(other, 3)
    assert slots.claim() == {other.pk: 3}  # owed 8: its three steps at once


@pytest.mark.django_db
def test_organisations_that_flood_together_share_the_slots_evenly(org) -> None:
    second = OrganisationFactory.create()
    _ready(org, 40)
    _ready(second, 40)
    slots = Slots()
    first = slots.claim()
    assert first == {org.pk: 12, second.pk: 12}  # 8 owed each, then the borrowing alternates

    late = OrganisationFactory.create()
    _ready(late, 5)
    assert slots.claim() == {late.pk: 5}  # the reserve was kept for it

    # A slot that frees goes to what is owed, never to an organisation past its share.
    slots.held = [step for step in slots.held if step.org_id != org.pk][:12] + slots.held[-5:]
    freed = slots.claim()
    assert freed[org.pk] >= 8, freed  # owed 8 again: it holds none now
    assert freed[second.pk] == 0, freed  # holds 12: past its share, and the reserve is due


@pytest.mark.django_db
def test_a_settles_claim_of_the_lane_keeps_to_the_share_too(org) -> None:
    """The settle's own claim (TakeNext.claim_lane) reads the same shares: the settling
    step's slot may go to its organisation's next step only within what it may hold."""
    _ready(org, 30)
    slots = Slots()
    slots.claim()  # 24 held: the most it may hold alone

    def settle_claims(held: list[ClaimedStep]) -> list[dict[str, object]]:
        share = IO.fair_share(32, (step.org_id for step in held))
        take = TakeNext("w", "io", 30.0, claim_lane=True, share=share)
        with connection.cursor() as cursor:
            return query_prepared(cursor, sql.CLAIM, take.claim_params())

    assert len(settle_claims(slots.held[1:])) == 1  # one settling: its slot back, 24 again
    assert settle_claims(slots.held) == []  # none given back: it may hold no more
    other = OrganisationFactory.create()
    _ready(other, 1)
    (row,) = settle_claims(slots.held)
    assert row["org_id"] == other.pk  # another organisation is owed its share


# --- the attack, on the real engine -----------------------------------------------------------


@pytest.fixture
def tarpit() -> Iterator[Tarpit]:
    with Tarpit() as pit:
        yield pit


@pytest.mark.django_db(transaction=True)
def test_a_tenant_whose_calls_hang_holds_no_more_than_its_share_and_another_runs_meanwhile(
    tmp_path, tarpit: Tarpit
) -> None:
    flood_org, quiet_org = OrganisationFactory.create(), OrganisationFactory.create()
    with stub_servers() as stubs:
        engine = Engine(tmp_path / "engine.log").start()
        try:
            flood = make_harness(flood_org, stubs, engine)
            quiet = make_harness(quiet_org, stubs, engine)
            # As many calls in flight and as long a wait as a tenant may set (effects.limits).
            flood.call("POST", "/api/v1/connections", {
                "name": "slow", "provider": "http", "base_url": tarpit.url,
                "max_concurrency": 64, "timeout_seconds": 120,
            }, expect=201)  # fmt: skip
            slug = flood.publish(SLOW_CALL_DEFINITION)
            for n in range(40):
                flood.start(slug, {"url": tarpit.url, "n": n})
            # Every call the flood may make is hanging at the tarpit: 24 of the 32 io slots.
            assert tarpit.wait_held(24, timeout=120) == 24, engine.log()[-3000:]

            run_id = quiet.start(quiet.publish(QUICK_CALL_DEFINITION), {"api": stubs.provider.url})
            (run,) = quiet.wait_finished([run_id], timeout=60).values()
            assert run.status == "succeeded", run.error
            # It ran while the flood's calls still hung: it took a reserved slot.
            assert tarpit.held() == 24
            assert tarpit.most_held == 24
        finally:
            engine.stop()
