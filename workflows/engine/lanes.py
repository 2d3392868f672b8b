"""Lane policies: capacity, lease length and retry policy per kind of work."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from ..definitions.registry import INLINE, WORKER_LANES, RetryPolicy

__all__ = ["INLINE", "WORKER_LANES", "LanePolicy", "engine_setting", "lane_policy"]


@dataclass(frozen=True)
class LanePolicy:
    name: str
    concurrency: int
    lease_seconds: float
    timeout_seconds: float
    max_attempts: int
    backoff_base_seconds: float
    backoff_cap_seconds: float
    processes: int = 1  # worker processes runengine starts for the lane

    def backoff(
        self,
        failed_attempts: int,
        rng: random.Random | None = None,
        retry: RetryPolicy | None = None,
    ) -> float:
        """Exponential backoff with full jitter: uniform(0, min(cap, base * 2**(n-1))), with
        the step type's base and cap (``retry``) where it sets them."""
        base = retry.base_seconds if retry and retry.base_seconds is not None else None
        cap = retry.cap_seconds if retry and retry.cap_seconds is not None else None
        ceiling = min(
            cap if cap is not None else self.backoff_cap_seconds,
            (base if base is not None else self.backoff_base_seconds) * 2 ** (failed_attempts - 1),
        )
        return (rng or random).uniform(0, ceiling)


def lane_policy(lane: str) -> LanePolicy:
    config = settings.WAYMARK["LANES"].get(lane)
    if config is None:
        raise ValueError(f"lane {lane!r} has no workers; configured lanes: {WORKER_LANES}")
    return LanePolicy(name=lane, **config)


def engine_setting(name: str) -> Any:
    return settings.WAYMARK[name]
