"""Lane policies: capacity, lease length and retry policy per kind of work."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from ..definitions.registry import INLINE, WORKER_LANES, RetryPolicy

__all__ = [
    "INLINE", "WORKER_LANES", "FairShare", "LanePolicy", "engine_setting", "lane_policy",
    "waymark_settings",
]  # fmt: skip


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
    org_share: float = 0.25  # of a worker's slots, owed to each organisation (FairShare)
    reserve: float = 0.25  # of a worker's slots, kept free from borrowing (FairShare)

    def fair_share(self, slots: int, held: Iterable[int]) -> FairShare:
        """What a claim of a worker with ``slots`` slots may take per organisation, given the
        organisations of the attempts it holds (``held``, one entry per attempt)."""
        holding = Counter(held)
        share = max(1, min(slots, math.floor(slots * self.org_share)))
        reserve = min(math.ceil(slots * self.reserve), slots - share)
        return FairShare(
            share=share,
            free=slots - holding.total(),
            reserve=reserve,
            held_orgs=tuple(holding),
            held_counts=tuple(holding.values()),
        )

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


@dataclass(frozen=True)
class FairShare:
    """How one worker's slots of a lane are shared between organisations, as sql.CLAIM reads
    it: each organisation is owed ``share`` slots, less those it holds already; a claim takes
    what is owed first, then lets organisations borrow, round-robin, at most ``borrowable``
    slots in all (less what it took as owed), so that the reserve stays free for an
    organisation whose work arrives later. Without it, one organisation whose calls hang
    would hold every slot while another's one-step run waited for them.

    Kept per worker, from the attempts it holds: no query counts anything, and with several
    workers each shares its own slots the same way."""

    share: int
    free: int  # slots free now
    reserve: int = 0  # slots borrowing must leave free
    held_orgs: tuple[int, ...] = ()
    held_counts: tuple[int, ...] = ()

    @property
    def borrowable(self) -> int:
        return max(0, self.free - self.reserve)

    def freeing(self, slots: int) -> FairShare:
        """The same, with ``slots`` more slots given back (steps settled together)."""
        return replace(self, free=self.free + slots)

    def params(self, most: int) -> dict[str, Any]:
        """sql.CLAIM's parameters for a claim of at most ``most`` steps."""
        return {
            "share": self.share, "borrowable": self.borrowable,
            "held_orgs": list(self.held_orgs), "held_counts": list(self.held_counts),
            # How many organisations the claim looks at (sql.CLAIM).
            "orgs": most + 3 + len(self.held_orgs),
        }  # fmt: skip


# A claim by a caller that is not a worker (tests, tools): every organisation is owed it all.
UNSHARED = FairShare(share=1_000_000, free=0)


# Each lane's policy, with the settings it was made from: made again only when they are
# replaced (a test's override), not on every step that asks.
_policies: dict[str, tuple[Any, LanePolicy]] = {}


def lane_policy(lane: str) -> LanePolicy:
    config = waymark_settings()["LANES"].get(lane)
    if config is None:
        raise ValueError(f"lane {lane!r} has no workers; configured lanes: {WORKER_LANES}")
    made = _policies.get(lane)
    if made is not None and made[0] is config:
        return made[1]
    policy = LanePolicy(name=lane, **config)
    _policies[lane] = (config, policy)
    return policy


def engine_setting(name: str) -> Any:
    return waymark_settings()[name]


# settings.WAYMARK, read once: Django's settings object answers every attribute through
# Python code of its own (LazyObject), and a settle of a code run asks a setting about ten
# times. A test's override (override_settings, pytest-django's ``settings``) replaces the
# dict and says so (setting_changed); a change to the dict in place is read as it is.
_waymark: dict[str, Any] | None = None


def waymark_settings() -> dict[str, Any]:
    global _waymark
    if _waymark is None:
        _waymark = settings.WAYMARK
    return _waymark


@receiver(setting_changed)
def _forget_waymark_settings(*, setting: str, **kwargs: Any) -> None:
    global _waymark
    if setting == "WAYMARK":
        _waymark = None
