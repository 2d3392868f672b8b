"""A run's row as the walk holds it, locked (walk.py) or read at a claim (hops.py). Its own
module so that what the walk hands itself to (forks.py) can name it without importing the
walk."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass
class RunState:
    id: int
    org_id: int
    version_id: int
    status: str
    input: Any
    vars: dict[str, Any]
    outputs: dict[str, Any]
    entered: dict[str, int]
    steps_executed: int
    max_steps: int
    expired: bool
    created_at: datetime
