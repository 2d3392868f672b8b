"""A claimed step, as the claim returns it: what a worker runs and settles (steps.py), and
what a settle's hop walks from (hops.py). Its own module so that those two need not import
each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .places import TOP, Place
from .sql import ClaimedRow
from .walk import CONTINUATION_TYPE


@dataclass(frozen=True)
class ClaimedStep:
    """One claimed step, as the claim returns it (sql.ClaimedRow)."""

    id: int
    org_id: int
    run_id: int
    step_id: str
    iteration: int
    type: str
    lane: str
    attempt: int  # the fencing token
    attempts_used: int  # claims of this series that ran (or died running); hand-backs excluded
    max_attempts: int
    version_id: int
    # The run's template data as of the claim.
    run_input: Any = field(repr=False)
    run_vars: dict[str, Any] = field(repr=False)
    run_outputs: dict[str, Any] = field(repr=False)
    run_created_at: datetime = field(repr=False)
    run_expired: bool = False  # the run is past its max age (the database's clock)
    wait_detail: dict[str, Any] | None = field(default=None, repr=False)  # see sql.ClaimedRow
    fork_join_id: int | None = None  # the join its branch arrives at (see forks.py)
    branch: int | None = None
    # The rest of the run's row as of the claim, for a hop's walk (hops.py): which version
    # of the row it was (its xmin; None: no hop from this step).
    run_entered: dict[str, int] = field(default_factory=dict, repr=False)
    run_steps_executed: int = 0
    run_max_steps: int = 0
    run_seen: str | None = None
    # The span that started the run (W3C traceparent; None: untraced): this attempt's span
    # is its child (engine/tracing.py).
    trace_context: str | None = field(default=None, repr=False)
    # A step a settle's walk took for its worker after a code run's turn asked for it: what
    # that turn knew (StepResult.carried), for the next turn when this step's settle hops
    # (hops.py); never from a claim.
    carried: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_row(cls, row: ClaimedRow) -> ClaimedStep:
        return cls(
            id=row["id"], org_id=row["org_id"], run_id=row["run_id"], step_id=row["step_id"],
            iteration=row["iteration"], type=row["type"], lane=row["lane"],
            attempt=row["attempt"], attempts_used=row["attempts_used"],
            max_attempts=row["max_attempts"], version_id=row["version_id"],
            run_input=row["run_input"], run_vars=row["run_vars"],
            run_outputs=row["run_outputs"], run_created_at=row["run_created_at"],
            run_expired=row["run_expired"], wait_detail=row["wait_detail"],
            fork_join_id=row["fork_join_id"], branch=row["branch"],
            run_entered=row["run_entered"], run_steps_executed=row["run_steps_executed"],
            run_max_steps=row["run_max_steps"], run_seen=row["run_seen"],
            trace_context=row["trace_context"],
        )  # fmt: skip

    @property
    def poisoned(self) -> bool:
        return self.attempts_used > self.max_attempts

    @property
    def is_continuation(self) -> bool:
        return self.type == CONTINUATION_TYPE

    @property
    def place(self) -> Place:
        if self.fork_join_id is None and self.branch is None:
            return TOP  # (a frozen dataclass costs a few microseconds to make, on every settle)
        return Place(self.fork_join_id, self.branch)

    @property
    def woken_with(self) -> dict[str, Any] | None:
        return (self.wait_detail or {}).get("woken_with")
