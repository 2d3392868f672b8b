"""Recompute every pending timer from its intent (run after a tz database update)."""

from __future__ import annotations

from typing import Any

from timers.recompute import recompute_pending
from workflows.plugins.runs import MigratedCommand


class Command(MigratedCommand):
    help = "Recompute pending timers from their intent and zone (after a tz database update)."

    def handle(self, *args: Any, **options: Any) -> None:
        tally = recompute_pending()
        self.stdout.write(f"{tally.checked} pending timer(s) checked, {tally.moved} moved")
