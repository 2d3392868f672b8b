"""The sweep: moves waiting steps whose time has come, every few seconds.

- deadlines that passed fire (``waits.fire_due_deadlines``), each racing the awaited event
  under the run's lock, one winner;
- a pending signal that a waiting step now matches is delivered (signals.py);
- retries whose backoff passed become ready, for every lane (each worker also does this for
  its own lane; the sweep is the backstop for a lane whose workers are all busy or down);

A plain function that returns counts; each step fails alone. The loop that calls it once a
tick, in the elected sweeper, is ``sweeper.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .lanes import WORKER_LANES
from .signals import LateMatching, match_late
from .steps import promote_due_retries
from .waits import fire_due_deadlines

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepCounts:
    deadlines: int
    retries: int
    signals: int = 0


def sweep_once(
    *, name: str = "sweep", limit: int = 500, late: LateMatching | None = None
) -> SweepCounts:
    """One pass. ``late``: the sweeper's late matching, kept from tick to tick (without it,
    a full pass of the late matching)."""
    retries = sum(promote_due_retries(lane=lane, worker=name, limit=limit) for lane in WORKER_LANES)
    # A signal and a wait that missed each other.
    signals = late.run(limit=limit) if late is not None else match_late(limit=limit)
    return SweepCounts(
        deadlines=fire_due_deadlines(limit=limit, by=name), retries=retries, signals=signals
    )
