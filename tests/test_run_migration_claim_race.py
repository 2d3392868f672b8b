"""A worker's claim racing a run's move between versions, on real threads and the real claim.

Each round makes one run's first step (``a``, a worker's step, ready on version 1) due, then
a worker's claim loop and a move of the run to version 2, which calls the step ``b``, go at
once. Either may win: the claim (the move then finds the step running and puts the run
off), or the move (the claim then gets ``b``, on the new version). What the claim hands a
worker must be one of those two, never the step as renamed with the run's version as it
was: a move committing while a claim statement runs renames the step row the claim then
locks (read as it is now), while the claim read the run as its snapshot had it (the old
version, where ``b`` does not exist).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now

from workflows.engine.definition_cache import definition_for
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim
from workflows.models import Run, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.run_migration import migration_plan
from workflows.services.run_migration.move import move_run
from workflows.services.runs import run_start

pytestmark = pytest.mark.django_db(transaction=True)

# Rounds: without the claim's check of the run (sql._CLAIMED), 1 to 2 in 100 claims handed out
# the renamed step with the old version on a loaded 2-core machine.
ROUNDS = 500


def one_step(step_id: str) -> dict[str, Any]:
    return {"start": step_id, "steps": [
        {"id": step_id, "type": "probe", "next": "done"},
        {"id": "done", "type": "end"},
    ]}  # fmt: skip


def test_a_claim_never_hands_out_a_renamed_step_with_the_runs_old_version(org) -> None:
    automation_publish_definition(org=org, slug="race", definition=one_step("a"))
    runs = [run_start(org=org, automation_slug="race", run_input={}, start_key=f"r{n}").run_id
            for n in range(ROUNDS)]  # fmt: skip
    # Each run's step is ready but not yet due: a round makes its own run's due.
    Step.objects.filter(run_id__in=runs).update(lease_until=Now() + timedelta(days=1))
    automation_publish_definition(org=org, slug="race", definition=one_step("b"))
    plan = migration_plan(org=org, automation_slug="race", from_version=1, to_version=2,
                          mapping={"a": "b"})  # fmt: skip
    policy = lane_policy("io")
    claims: list[Any] = []
    errors: list[BaseException] = []
    go = threading.Barrier(3, timeout=60)  # a round begins: its run's step is ready
    done = threading.Barrier(3, timeout=60)  # a round ended: its step claimed, its move tried

    def claimer() -> None:
        try:
            for _ in range(ROUNDS):
                go.wait()
                got: list[Any] = []
                while not got:  # claims back to back until the round's step is claimed
                    got = claim(policy=policy, worker="race-worker", limit=1)
                claims.extend(got)
                done.wait()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            go.abort()
            done.abort()
        finally:
            connection.close()

    def mover() -> None:
        try:
            for n in range(ROUNDS):
                go.wait()
                # The move commits at a different point of the claims' loop each round.
                spin_until = time.perf_counter() + (n % 7) * 0.0003
                while time.perf_counter() < spin_until:
                    pass
                move_run(plan, runs[n], migration_id=None, actor="test:race")
                done.wait()
        except BaseException as exc:
            errors.append(exc)
            go.abort()
            done.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer), threading.Thread(target=mover)]
    for thread in threads:
        thread.start()
    try:
        for n in range(ROUNDS):
            Step.objects.filter(run_id=runs[n]).update(lease_until=Now())
            go.wait()
            done.wait()
    finally:
        for thread in threads:
            thread.join(timeout=60)
    assert not errors, errors

    assert [c.run_id for c in claims] == runs  # each round's step, claimed once
    versions = dict(Run.objects.filter(pk__in=runs).values_list("pk", "version_id"))
    mismatches = []
    for claimed in claims:
        steps = {step["id"] for step in definition_for(claimed.version_id)["steps"]}
        if claimed.step_id not in steps or claimed.version_id != versions[claimed.run_id]:
            mismatches.append((claimed.run_id, claimed.step_id, claimed.version_id))
    assert mismatches == [], f"{len(mismatches)} of {ROUNDS} claims: {mismatches[:5]}"
    # Both orders happened (else the rounds raced nothing): the claim first (the move then
    # found the step running and left the run), and the move first.
    firsts = Counter("move" if c.step_id == "b" else "claim" for c in claims)
    assert firsts["claim"] > 0 and firsts["move"] > 0, firsts
