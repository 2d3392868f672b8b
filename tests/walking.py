"""Driving a run in process past its inline budget: continuations, as a worker would."""

from __future__ import annotations

from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim, release, settle_continuation
from workflows.models import Run


def continue_walks(run: Run, *, max_rounds: int = 100) -> tuple[Run, int]:
    """Claim and settle the run's continuation rows until none is left; return the run as it
    then is and how many continuations ran. Other io steps claimed meanwhile are handed back."""
    rounds = 0
    for _ in range(max_rounds):
        claimed = claim(policy=lane_policy("io"), worker="test-continuer", limit=10)
        continuations = [s for s in claimed if s.is_continuation and s.run_id == run.pk]
        others = [(s.id, s.attempt) for s in claimed if s not in continuations]
        release(held=others, worker="test-continuer")
        if not continuations:
            break
        for step in continuations:
            assert settle_continuation(step, worker="test-continuer")
            rounds += 1
    run.refresh_from_db()
    return run, rounds
