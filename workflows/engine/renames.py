"""Renaming a step execution of a run: what a migration between versions does when the new
version calls the step by another id (or a loop's iteration number is taken there), to its
live steps and to the ones it completed alike (a fired timer, a decided request, settled
effects follow their step, so a later execution under the old id collides with nothing).

The step row is the engine's and the migration renames it; the rows other apps keep per
``(run, step id, iteration)`` (timers' pending timer, an approval's request, the effect
ledger's rows under the step's effect key ``run/step/iteration``) are renamed by each app's
renamer, registered through the door (``workflows.plugins.register_step_renamer``), so the
engine names no app. Each runs in the migration's transaction, under the run's lock, after
the step row is renamed: the step and what it waits on move together or not at all.

What refers to a step execution by (run, step id, iteration): the step row (renamed by the
migration), a signal wait (its name and key live on the step row itself), the run's outputs
and loop counts by step id (renamed by the migration), timers' timers, approvals' requests,
the effect ledger's rows and keys (renamed by their apps). Left as they were, on purpose:
the run's history (``workflows_runevent``: what happened, under the ids it happened under)
and a consumed signal's ``consumed_by`` (who took it, then).

A renamer that meets a row another transaction holds (a timer batch firing it, a decision
taking its request) must not wait for it: that transaction waits for the run's lock, which the
migration holds. The migration's transaction runs under a short ``lock_timeout`` (its own
waits are bounded), and a renamer may raise ``StepBusy`` itself; either way the run's move is
rolled back and tried again later in the same job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepRename:
    """One live step of a run taking a new id (and, when that id's iteration is taken in the
    run, a new iteration). ``step_pk``: the step row's id, which does not change."""

    org_id: int
    run_id: int
    step_pk: int
    step_id: str
    iteration: int
    new_step_id: str
    new_iteration: int

    @property
    def old_key(self) -> str:
        """The step execution's effect key before (``run/step/iteration``, as effects key it)."""
        return f"{self.run_id}/{self.step_id}/{self.iteration}"

    @property
    def new_key(self) -> str:
        return f"{self.run_id}/{self.new_step_id}/{self.new_iteration}"

    def params(self) -> dict[str, Any]:
        """The rename as SQL parameters (the names every renamer's statement uses)."""
        return {
            "org": self.org_id, "run": self.run_id, "step_pk": self.step_pk,
            "step_id": self.step_id, "iteration": self.iteration,
            "new_step_id": self.new_step_id, "new_iteration": self.new_iteration,
            "old_key": self.old_key, "new_key": self.new_key,
        }  # fmt: skip


class StepBusy(Exception):
    """Raised by a renamer: a row it must rename is held by another transaction now (a timer
    firing, a decision being taken). The run is not moved now; the job tries it again."""


# (the migration's cursor, the rename) -> None; raises StepBusy to put the run off.
StepRenamer = Callable[[Any, StepRename], None]
STEP_RENAMERS: dict[str, StepRenamer] = {}


def rename_everywhere(cursor: Any, rename: StepRename) -> None:
    """Every registered renamer, in the caller's transaction (the run locked)."""
    for renamer in STEP_RENAMERS.values():
        renamer(cursor, rename)
