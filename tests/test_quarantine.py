"""Poison steps and hung executors cost only themselves.

- A step whose last attempt never settled (a suspect) is claimed alone: when it kills its
  worker again, the healthy steps that were claimed beside it the first time are not charged
  again, and they keep flowing while the poison step uses up its attempts.
- Executors hung past their timeout make the worker hand its other steps back and exit to be
  replaced (runengine starts a fresh one, with every slot); the hung step's lease lapses, so
  it is retried as a suspect and its attempt counts.
"""

from __future__ import annotations

import signal
import time

import pytest

from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim
from workflows.engine.worker import EXIT_REPLACE_ME, Attempt, Worker
from workflows.models import Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .processes import spawn, spawn_worker, stop, wait_for
from .test_runengine import children

pytestmark = pytest.mark.django_db(transaction=True)

HEALTHY = 30


def flow(**probe: object) -> dict:
    return {
        "start": "work",
        "steps": [{"id": "work", "type": "probe", **probe, "next": "done"},
                  {"id": "done", "type": "end"}],
    }  # fmt: skip


def start(org, slug: str, key: str) -> int:
    return run_start(org=org, automation_slug=slug, run_input={}, start_key=key).run_id


def finished(run_ids: list[int]) -> bool:
    return not Run.objects.filter(pk__in=run_ids, status="running").exists()


def test_a_poison_step_is_retried_alone_and_healthy_steps_keep_flowing(org, procs) -> None:
    poison_flow = flow(crash_attempts=99, retry={"max_attempts": 3})
    automation_publish_definition(org=org, slug="poison", definition=poison_flow)
    automation_publish_definition(org=org, slug="healthy", definition=flow())
    # Everything is ready before the engine starts: the first claim takes the poison step
    # and healthy ones in one batch, and the poison kills that worker with all of them.
    poison = start(org, "poison", "poison")
    healthy = [start(org, "healthy", f"h{i}") for i in range(HEALTHY)]

    engine = spawn("runengine", "--no-web", "--grace", "1")
    procs.append(engine)
    wait_for(lambda: finished([poison, *healthy]), timeout=240, what="every run to end")
    assert stop(engine, signal.SIGTERM, timeout=60) == 0

    assert Run.objects.filter(pk__in=healthy, status="succeeded").count() == HEALTHY
    steps = Step.objects.filter(run_id__in=healthy, step_id="work")
    worst = max(s.attempt - s.release_count for s in steps)
    assert worst <= 2, f"a healthy step was charged {worst} attempts"  # the first crash at most
    dead = Run.objects.get(pk=poison)
    assert dead.status == "failed"
    assert "attempts exhausted" in dead.error
    retried = RunEvent.objects.filter(run_id=poison, kind="step.claimed", attempt__gt=1)
    assert retried.exists()


def test_a_stopping_worker_hands_back_its_steps_but_not_a_hung_one(org) -> None:
    automation_publish_definition(org=org, slug="two", definition=flow())
    run_ids = [start(org, "two", key) for key in ("hung", "healthy")]
    worker = Worker(lane_policy("io"), concurrency=2, grace_seconds=0, name="w")
    claimed = {s.run_id: s for s in claim(policy=worker.policy, worker="w", limit=2)}
    now = time.monotonic()
    hung = Attempt(claimed[run_ids[0]], deadline=now - 60, extended=now, timed_out=True)
    healthy = Attempt(claimed[run_ids[1]], deadline=now + 60, extended=now)
    worker.inflight = {hung.key: hung, healthy.key: healthy}

    worker._drain()

    statuses = dict(Step.objects.filter(step_id="work").values_list("run_id", "status"))
    assert statuses == {run_ids[0]: "running", run_ids[1]: "ready"}  # the hung one lapses
    assert RunEvent.objects.filter(kind="step.released").count() == 1


def test_a_worker_with_a_hung_executor_asks_to_be_replaced(org, procs) -> None:
    automation_publish_definition(org=org, slug="hang", definition=flow(
        hang_seconds=600, hang_attempts=1))  # fmt: skip
    hung = start(org, "hang", "hung")
    worker = spawn_worker(
        concurrency=2, grace=1, WAYMARK_IO_TIMEOUT_SECONDS="1", WAYMARK_IO_LEASE_SECONDS="1",
        WAYMARK_WORKER_MAX_HUNG="1",
    )  # fmt: skip
    procs.append(worker)
    assert worker.wait(timeout=120) == EXIT_REPLACE_ME
    step = Step.objects.get(run_id=hung, step_id="work")
    assert (step.status, step.attempt) == ("running", 1)  # not handed back: its lease lapses
    assert not RunEvent.objects.filter(run_id=hung, kind="step.released").exists()

    # A fresh worker (what a supervisor starts) holds nothing: it takes the suspect alone.
    procs.append(spawn_worker(concurrency=2, WAYMARK_IO_LEASE_SECONDS="1"))
    wait_for(lambda: Run.objects.get(pk=hung).status == "succeeded", timeout=120,
             what="the hung step to be retried as a suspect")  # fmt: skip
    assert Step.objects.get(run_id=hung, step_id="work").attempt == 2


def test_runengine_replaces_a_worker_whose_executor_hung(org, procs) -> None:
    automation_publish_definition(org=org, slug="hang", definition=flow(
        hang_seconds=600, hang_attempts=1))  # fmt: skip
    automation_publish_definition(org=org, slug="quick", definition=flow())
    hung = start(org, "hang", "hung")
    engine = spawn(
        "runengine", "--no-web", "--grace", "1", WAYMARK_IO_TIMEOUT_SECONDS="1",
        WAYMARK_IO_LEASE_SECONDS="1", WAYMARK_WORKER_MAX_HUNG="1",
    )  # fmt: skip
    procs.append(engine)
    first = wait_for(
        lambda: next((p for p, r in children(engine.pid).items() if r == "worker-io"), None),
        what="worker-io to start",
    )
    wait_for(
        lambda: next(
            (p for p, r in children(engine.pid).items() if r == "worker-io" and p != first), None
        ),
        timeout=120,
        what="worker-io to be replaced",
    )
    later = [start(org, "quick", f"q{i}") for i in range(10)]  # the fresh worker's slots
    wait_for(lambda: finished([hung, *later]), timeout=120, what="every run to end")
    assert stop(engine, signal.SIGTERM, timeout=60) == 0
    assert set(Run.objects.filter(pk__in=[hung, *later]).values_list("status", flat=True)) == {
        "succeeded"
    }
