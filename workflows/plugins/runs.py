"""Starting runs, waiting for them to end, and reading organisations from an app (a
scheduled start, a management command): the same use cases the API calls, with their rules
(start keys, input limits, quotas)."""

from __future__ import annotations

from ..management.base import MigratedCommand
from ..selectors import organisation_get
from ..services import quotas
from ..services.run_waits import RunOutcome, WaitInTransaction, run_wait
from ..services.runs import check_input, check_startable, run_start

__all__ = [
    "MigratedCommand", "RunOutcome", "WaitInTransaction", "check_input", "check_startable",
    "organisation_get", "quotas", "run_start", "run_wait",
]  # fmt: skip
