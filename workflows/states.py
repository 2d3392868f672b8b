"""The declared state machines of runs and steps.

Every status change in the engine is a conditional UPDATE whose WHERE clause lists the
allowed sources from these tables (``sources(...)``), and whose row count is checked. Keep
the tables and the SQL in step: tests assert that each SQL transition uses only the sources
declared here.
"""

from __future__ import annotations

from django.db import models


class RunStatus(models.TextChoices):
    RUNNING = "running"  # has at least one live step (ready, running or waiting)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class StepStatus(models.TextChoices):
    READY = "ready"  # claimable by a worker of its lane once lease_until has passed
    RUNNING = "running"  # claimed; owner holds it until lease_until, fenced by attempt
    WAITING = "waiting"  # parked on time or the outside world (timers, signals, approvals)
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.RUNNING: frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}

STEP_TRANSITIONS: dict[StepStatus, frozenset[StepStatus]] = {
    # claim; cancel
    StepStatus.READY: frozenset({StepStatus.RUNNING, StepStatus.CANCELLED}),
    # settle; fail; retry later (ready); re-claim after the lease lapsed (running); cancel
    StepStatus.RUNNING: frozenset(
        {
            StepStatus.DONE,
            StepStatus.FAILED,
            StepStatus.READY,
            StepStatus.RUNNING,
            StepStatus.CANCELLED,
        }
    ),
    StepStatus.WAITING: frozenset({StepStatus.READY, StepStatus.DONE, StepStatus.CANCELLED}),
    StepStatus.DONE: frozenset(),
    StepStatus.FAILED: frozenset(),
    StepStatus.CANCELLED: frozenset(),
}

RUN_FINISHED = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})
STEP_LIVE = frozenset({StepStatus.READY, StepStatus.RUNNING, StepStatus.WAITING})


def run_sources(target: RunStatus) -> list[str]:
    """Statuses a run may move to ``target`` from, for a ``status IN (...)`` guard."""
    return sorted(s.value for s, targets in RUN_TRANSITIONS.items() if target in targets)


def step_sources(target: StepStatus) -> list[str]:
    return sorted(s.value for s, targets in STEP_TRANSITIONS.items() if target in targets)
