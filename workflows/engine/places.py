"""Where a step is entered: at the top level, or on a branch of a fork (see forks.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Place:
    """Where in the run a step is entered: inside which fork (the waiting join row its branch
    arrives at) and on which branch of it. The top level is Place()."""

    fork_join: int | None = None
    branch: int | None = None


TOP = Place()


@dataclass(frozen=True)
class Entry:
    step_id: str
    place: Place = TOP

    def to_json(self) -> Any:
        """How a continuation row keeps it: a bare step id at the top level."""
        if self.place == TOP:
            return self.step_id
        return [self.step_id, self.place.fork_join, self.place.branch]

    @classmethod
    def from_json(cls, value: Any) -> Entry:
        if isinstance(value, str):
            return cls(value)
        step_id, fork_join, branch = value
        return cls(step_id, Place(fork_join, branch))
