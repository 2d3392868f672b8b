"""Lane policies: capacity, lease length and retry policy per kind of work."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from ..definitions.registry import INLINE, WORKER_LANES

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

    def backoff(self, failed_attempts: int, rng: random.Random | None = None) -> float:
        """Exponential backoff with full jitter: uniform(0, min(cap, base * 2**(n-1)))."""
        ceiling = min(
            self.backoff_cap_seconds, self.backoff_base_seconds * 2 ** (failed_attempts - 1)
        )
        return (rng or random).uniform(0, ceiling)


def lane_policy(lane: str) -> LanePolicy:
    config = settings.WAYMARK["LANES"].get(lane)
    if config is None:
        raise ValueError(f"lane {lane!r} has no workers; configured lanes: {WORKER_LANES}")
    return LanePolicy(name=lane, **config)


def engine_setting(name: str) -> Any:
    return settings.WAYMARK[name]
