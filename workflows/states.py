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
    PAUSED = "paused"  # an operator paused it: nothing of it is claimed until resumed
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # final unless an operator retries it
    CANCELLED = "cancelled"
    # a step failed for good and the compensations of the completed steps all ran
    # (docs/reference/sagas.md, "Sagas and compensation")
    COMPENSATED = "compensated"


class StepStatus(models.TextChoices):
    READY = "ready"  # claimable by a worker of its lane now (lease_until has passed)
    RUNNING = "running"  # claimed; owner holds it until lease_until, fenced by attempt
    # Parked: not claimable, holds no slot and no lease. `wait_kind` says on what (a retry
    # backoff, a timer, a signal, an approval, a paused run), `wake_at` when time wakes it.
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class WaitKind(models.TextChoices):
    """What a waiting step waits for. Time-bound kinds have a `wake_at`."""

    RETRY = "retry"  # backoff before its next attempt: ready at wake_at
    PAUSED = "paused"  # its run is paused: ready again when the run resumes
    EXTERNAL = "external"  # a wake from outside (a signal, a decision, a timer, a test probe)


RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.RUNNING: frozenset(
        {
            RunStatus.PAUSED,
            RunStatus.SUCCEEDED,
            RunStatus.FAILED,
            RunStatus.CANCELLED,
            RunStatus.COMPENSATED,
        }
    ),
    # A step that was already running when the run was paused may still settle: it can fail
    # the run, or end its last path.
    RunStatus.PAUSED: frozenset(
        {
            RunStatus.RUNNING,
            RunStatus.SUCCEEDED,
            RunStatus.FAILED,
            RunStatus.CANCELLED,
            RunStatus.COMPENSATED,
        }
    ),
    # A finished run runs again only by an operator's hand: a retry (failed runs) or a
    # re-run from a chosen step (any finished run, services/rerun.py).
    RunStatus.SUCCEEDED: frozenset({RunStatus.RUNNING}),
    RunStatus.FAILED: frozenset({RunStatus.RUNNING}),
    RunStatus.CANCELLED: frozenset({RunStatus.RUNNING}),
    RunStatus.COMPENSATED: frozenset({RunStatus.RUNNING}),
}

STEP_TRANSITIONS: dict[StepStatus, frozenset[StepStatus]] = {
    # claim; cancel; park (its run is paused)
    StepStatus.READY: frozenset({StepStatus.RUNNING, StepStatus.CANCELLED, StepStatus.WAITING}),
    # settle; fail; park (a wait, or a retry's backoff); hand back (ready); re-claim after
    # the lease lapsed (running); cancel
    StepStatus.RUNNING: frozenset(
        {
            StepStatus.DONE,
            StepStatus.FAILED,
            StepStatus.WAITING,
            StepStatus.READY,
            StepStatus.RUNNING,
            StepStatus.CANCELLED,
        }
    ),
    # wake to run again (ready) or with an outcome (done); the deadline; cancel; a paused
    # run's ready-again step stays parked (waiting -> waiting, kind paused); its timer or
    # deadline could not wake it, for a reason that is not transient (failed)
    StepStatus.WAITING: frozenset(
        {
            StepStatus.READY,
            StepStatus.DONE,
            StepStatus.CANCELLED,
            StepStatus.WAITING,
            StepStatus.FAILED,
        }
    ),
    StepStatus.DONE: frozenset(),
    StepStatus.FAILED: frozenset({StepStatus.READY}),  # an operator's retry: a new series
    StepStatus.CANCELLED: frozenset(),
}

RUN_FINISHED = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.COMPENSATED}
)
RUN_LIVE = frozenset({RunStatus.RUNNING, RunStatus.PAUSED})
STEP_LIVE = frozenset({StepStatus.READY, StepStatus.RUNNING, StepStatus.WAITING})


def run_sources(target: RunStatus) -> list[str]:
    """Statuses a run may move to ``target`` from, for a ``status IN (...)`` guard."""
    return sorted(s.value for s, targets in RUN_TRANSITIONS.items() if target in targets)


def step_sources(target: StepStatus) -> list[str]:
    return sorted(s.value for s, targets in STEP_TRANSITIONS.items() if target in targets)
