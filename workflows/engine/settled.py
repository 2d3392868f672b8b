"""The outside effects a run has made, as the apps that make them know them: what a re-run
from a step (services/rerun.py) shows before it is confirmed and reuses instead of calling
again.

The effect ledger is an app's (``effects``), and the engine names no app: an app that keeps
settled effects per ``(run, step id, iteration)`` registers a reader through the door
(``workflows.plugins.register_settled_effects``), and the re-run asks every reader, in its
transaction (the run locked). A reused effect is then taken by the app itself, when the
step's new effect key has no row of its own (the run's ``rerun_reuse`` names the old key).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SettledEffect:
    """One effect a step execution made and whose answer is stored: the step, its iteration,
    the effect's key (``run/step/iteration``) and what made it (a provider's name)."""

    step_id: str
    iteration: int
    key: str
    provider: str


# (the caller's cursor, the organisation's id, the run's id) -> the run's settled effects.
SettledEffectReader = Callable[[Any, int, int], list[SettledEffect]]
SETTLED_EFFECT_READERS: dict[str, SettledEffectReader] = {}


def settled_effects(cursor: Any, org_id: int, run_id: int) -> list[SettledEffect]:
    """Every registered app's settled effects of the run, by step and iteration."""
    found = [e for read in SETTLED_EFFECT_READERS.values() for e in read(cursor, org_id, run_id)]
    return sorted(found, key=lambda e: (e.step_id, e.iteration))
