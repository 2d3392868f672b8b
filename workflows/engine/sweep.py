"""The sweep: moves waiting steps whose time has come, every few seconds.

- deadlines that passed fire (``waits.fire_due_deadlines``), each racing the awaited event
  under the run's lock, one winner;
- retries whose backoff passed become ready, for every lane (each worker also does this for
  its own lane; the sweep is the backstop for a lane whose workers are all busy or down);
- about once a minute, finished runs past retention are deleted (retention.py).

A plain function that returns counts; each step fails alone. The timers issue turns this
into the fair, elected due sweep of timers; this is its first shape.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from django.db import connection

from .lanes import WORKER_LANES, engine_setting
from .retention import purge_finished_runs
from .steps import promote_due_retries
from .waits import fire_due_deadlines

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepCounts:
    deadlines: int
    retries: int


def sweep_once(*, name: str = "sweep", limit: int = 500) -> SweepCounts:
    retries = sum(promote_due_retries(lane=lane, worker=name, limit=limit) for lane in WORKER_LANES)
    return SweepCounts(deadlines=fire_due_deadlines(limit=limit, by=name), retries=retries)


RETENTION_EVERY_SECONDS = 60.0


def run_sweep(stop: threading.Event) -> None:
    interval = engine_setting("SWEEP_SECONDS")
    next_purge = 0.0
    while not stop.is_set():
        try:
            counts = sweep_once()
            if counts.deadlines or counts.retries:
                logger.info("sweep: %s deadline(s) fired, %s retr(ies) due", *vars(counts).values())
            if time.monotonic() >= next_purge:
                next_purge = time.monotonic() + RETENTION_EVERY_SECONDS
                purged = purge_finished_runs()
                if purged:
                    logger.info("sweep: %s finished run(s) past retention deleted", purged)
        except Exception:
            logger.exception("sweep failed; retrying")
            connection.close()
        stop.wait(interval)
    connection.close()
