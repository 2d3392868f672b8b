"""Scheduled (cron) starts: not built yet; the sweep calls this every tick."""

from __future__ import annotations


def fire_due_schedules(by: str) -> int:
    return 0
