"""What run control asks of a run whose steps are decided as it goes (engine/decided.py): the
app of its deciding step type (workflows/code, for ``code``) says how the run replays, here,
so the services that change a run (a re-run from a step, a migration between versions) reach
it without importing that app (which imports them).

- ``history``: the steps the run's next replay reads, in order, as (step id, iteration), at
  the top level or at a place inside a branch.
- ``restart``: the run's outputs that make its next replay at a place keep only the first
  ``kept`` of them (a re-run from the step after them), as the walk records them.
- ``misfit``: why the code of another version does not fit the run's history (a replay that
  calls nothing and makes no effect), or None when it does.
- ``missing``: the (name, version) of a version's code when this process does not have it
  (nothing here can replay it), else None.
- ``next_call``: the call the run's code makes next (a re-run from a call that has no row:
  the run ended while it was being made, a ``ctx.run`` function between its attempts).
- ``joins_moved``: the run's outputs after a retry continued join rows in new ones (a
  branch's rows move to the row continuing its join), so what its replay reads of a branch
  follows them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..engine.decided import deciding_step
from ..engine.executors import StepResult
from ..engine.places import TOP, Place
from ..models import Organisation


class RunData(Protocol):
    """What a replay reads of a run: a locked RunState (engine/walk.py) or a Run row."""

    @property
    def id(self) -> int: ...
    @property
    def org_id(self) -> int: ...
    @property
    def input(self) -> Any: ...
    @property
    def outputs(self) -> Any: ...


class History(Protocol):
    def __call__(self, run: RunData, at: Place = ...) -> list[tuple[str, int]]: ...


class Restart(Protocol):
    def __call__(
        self, cursor: Any, run: RunData, kept: int, at: Place = ..., decider_id: str = ...
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Replays:
    history: History
    restart: Restart
    misfit: Callable[[RunData, Mapping[str, Any]], str | None]
    missing: Callable[[Mapping[str, Any]], tuple[str, int] | None]
    # Refuse (raise) runs of the organisation moving onto the version whose definition this
    # is (a code workflow's organisations list): a migration's check, once per plan. What
    # it returns is not read.
    refuse_moving_in: Callable[[Organisation, Mapping[str, Any]], object] = lambda org, d: None
    # A retry continued these join rows (the cancelled row's id -> the new row's): the run's
    # outputs that keep its replay reading its branches where their rows now are.
    joins_moved: Callable[[RunData, Mapping[int, int]], dict[str, Any]] = lambda run, m: {}
    # The id of the call the run's code makes next at the top level (a dry replay's first
    # new work), or None: a call the run was making when it ended has no row of its own.
    next_call: Callable[[RunData, Mapping[str, Any]], str | None] = lambda run, d: None


REPLAYS: dict[str, Replays] = {}


def register_replays(step_type: str, replays: Replays) -> None:
    """``step_type``: the deciding step type whose runs replay so (WorkflowsConfig.ready())."""
    REPLAYS[step_type] = replays


def replays_of(definition: Mapping[str, Any]) -> tuple[Mapping[str, Any], Replays] | None:
    """The definition's decider and how its runs replay; None for a definition's run."""
    decider = deciding_step(definition)
    if decider is None:
        return None
    replays = REPLAYS.get(str(decider["type"]))
    return None if replays is None else (decider, replays)


def replay_keeping(walk: Any, cursor: Any, run: RunData, decider_id: str, replays: Replays,
                   kept: int, at: Place = TOP) -> None:  # fmt: skip
    """Enter the decider of ``at`` anew in ``walk`` (the run's, or a branch's), its replay
    keeping only the first ``kept`` steps it reads there now (the cut,
    ``Replays.restart``): a re-run from a step, or a retry that calls a failed ``ctx.run``
    function again."""
    for key, value in replays.restart(cursor, run, kept, at, decider_id).items():
        walk.record_output(key, StepResult(output=value))
    walk.enter([decider_id], at)
