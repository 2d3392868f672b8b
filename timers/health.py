"""The timers' absence monitors (``manage.py doctor``, ``/readyz``), registered from
``TimersConfig.ready()``:

- ``timers.overdue``: no pending timer is due more than the late threshold ago (the due sweep
  fires timers on time; overdue ones mean no sweeper leads, or its firing fails);
- ``timers.waits_without_timer``: every step parked on a timer has its timer pending (a row
  deleted by hand, or fired or cancelled without waking its step, leaves it waiting forever);

and the timers' answer for the waits they park (``register_wait_answer("timer", ...)``): a
step waiting on a timer has a way forward while its timer is pending.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import connection

from workflows.plugins.engine import fetch_dicts
from workflows.plugins.health import (
    Example,
    Finding,
    Limits,
    Severity,
    counted,
    register_health_check,
    register_wait_answer,
    seconds,
    step_label,
)

from . import sql

NOT_PENDING = "its timer is not pending (deleted, or fired or cancelled without waking it)"


def _rows(statement: str, limits: Limits) -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, limits.params())
        return fetch_dicts(cursor)


def overdue(limits: Limits) -> Iterator[Finding]:
    rows = _rows(sql.OVERDUE_TIMERS, limits)
    count, at_least = counted(rows, limits)
    if not count:
        summary = f"no timer is overdue by more than {limits.late_seconds:g} s"
        yield Finding(check="timers.overdue", severity=Severity.OK, summary=summary)
        return
    oldest = seconds(rows[0]["late_seconds"])
    yield Finding(
        check="timers.overdue", severity=Severity.BROKEN, count=count, at_least=at_least,
        value=oldest, unit="seconds",
        summary=f"{'at least ' if at_least else ''}{count} pending timer(s) overdue by more "
        f"than {limits.late_seconds:g} s, the oldest by {oldest} s: is a sweeper running "
        "(manage.py sweep, or runengine)? Its log says why firing fails",
        examples=tuple(
            Example(run_id=row["run_id"], org_id=row["org_id"], step=step_label(row),
                    why=f"timer {row['id']} ({row['kind']}) due {seconds(row['late_seconds'])}"
                    " s ago and not fired")
            for row in rows
        ),
    )  # fmt: skip


def waits_without_timer(limits: Limits) -> Iterator[Finding]:
    rows = _rows(sql.WAITS_WITHOUT_TIMER, limits)
    count, at_least = counted(rows, limits)
    if not count:
        yield Finding(check="timers.waits_without_timer", severity=Severity.OK,
                      summary="every step waiting on a timer has its timer pending")  # fmt: skip
        return
    yield Finding(
        check="timers.waits_without_timer", severity=Severity.BROKEN, count=count,
        at_least=at_least,
        summary=f"{'at least ' if at_least else ''}{count} step(s) wait on a timer that is not "
        "pending: nothing will wake them (cancel or retry their runs)",
        examples=tuple(
            Example(run_id=row["run_id"], org_id=row["org_id"], step=step_label(row),
                    why=_timer_fate(row))
            for row in rows
        ),
    )  # fmt: skip


def _timer_fate(row: dict[str, Any]) -> str:
    if row["timer_id"] is None:
        return "waits on a timer, and its timer row is gone"
    timer = f"waits on timer {row['timer_id']}, which was "
    if row["cancelled"]:
        return timer + "cancelled"
    error = f" with an error: {row['error']}" if row["error"] else ""
    return timer + f"fired{error}, and the step was not woken"


def register() -> None:
    register_wait_answer("timer", holds=sql.TIMER_HOLDS_WAIT, why_not=NOT_PENDING)
    register_health_check("timers.overdue", overdue, org_scoped=True)
    register_health_check("timers.waits_without_timer", waits_without_timer, org_scoped=True)
