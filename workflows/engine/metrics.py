"""The engine's own instruments: counters and histograms recorded where things happen.

Each is a prometheus-client object, recorded in the process that does the work (a worker,
the relay, the sweeper). Recording is an increment in this process's memory, or, in
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, which ``runengine`` sets for its children),
in a memory-mapped file of this process that the web's ``/metrics`` reads with every other
process's (``scrape.py``). No recording touches the database or takes a lock another process
holds: the hot paths pay a few microseconds.

Labels are bounded on purpose: a lane (the configured lanes), a result from a fixed list, a
sweep task's registered name. Never an organisation, a run or anything a tenant chooses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import Counter, Histogram

# Seconds, from a few milliseconds to an outage: lateness and lag grow without bound when a
# process is down, and the buckets should still tell minutes from an hour.
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
WORK_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

STEPS_CLAIMED = Counter(
    "waymark_steps_claimed",
    "Step attempts claimed by workers: by the claim loop, as suspects, or by a settle for "
    "the same worker.",
    ["lane"],
)
STEPS_SETTLED = Counter(
    "waymark_steps_settled",
    "Step attempts whose settle committed without failing: succeeded (walked on), waiting "
    "(parked), deferred (runs again later, no attempt spent), continued (a continuation row).",
    ["lane", "result"],
)
STEPS_FAILED = Counter(
    "waymark_steps_failed",
    "Step attempts that failed: final=false when a retry was scheduled, final=true when the "
    "step failed for good (its run walks on from the failure).",
    ["lane", "final"],
)
STEPS_FENCED_OUT = Counter(
    "waymark_steps_fenced_out",
    "Step attempts whose result was dropped because a newer attempt owned the step (a lost "
    "lease, a cancelled run).",
    ["lane"],
)
RELAY_PUBLISHED = Counter("waymark_relay_published", "Outbox rows the relay published.")
RELAY_LAG = Histogram(
    "waymark_relay_lag_seconds",
    "Per published batch: the age of its oldest outbox row when it was published.",
    buckets=LAG_BUCKETS,
)
SWEEP_DURATION = Histogram(
    "waymark_sweep_duration_seconds",
    "How long each piece of the leading sweeper's housekeeping took (task: the engine's "
    "workflows.sweep, or a task an app registered).",
    ["task"],
    buckets=WORK_BUCKETS,
)


def steps_claimed(lane: str, count: int) -> None:
    if count:
        _child(STEPS_CLAIMED, lane).inc(count)


def step_settled(lane: str, result: str, count: int = 1) -> None:
    _child(STEPS_SETTLED, lane, result).inc(count)


# The labelled children of the counters counted once per step, by their label values:
# ``labels()`` checks and joins its values under the metric's lock each time, which was
# about as much of a worker's time as the increment itself (two or three per step).
_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Counter, *values: str) -> Any:
    key = (metric, *values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


def step_failed(lane: str, *, final: bool) -> None:
    STEPS_FAILED.labels(lane=lane, final="true" if final else "false").inc()


def step_fenced_out(lane: str) -> None:
    STEPS_FENCED_OUT.labels(lane=lane).inc()


def relay_published(count: int, oldest_age_seconds: float) -> None:
    RELAY_PUBLISHED.inc(count)
    RELAY_LAG.observe(max(0.0, oldest_age_seconds))


@contextmanager
def sweep_timed(task: str) -> Iterator[None]:
    """Time one piece of housekeeping, whether it returns or raises."""
    started = time.perf_counter()
    try:
        yield
    finally:
        SWEEP_DURATION.labels(task=task).observe(time.perf_counter() - started)
