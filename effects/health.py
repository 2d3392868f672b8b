"""The effects' absence monitor (``manage.py doctor``, ``/readyz``), registered from
``EffectsConfig.ready()``:

- ``effects.lapsed_in_flight``: no effect stays in flight more than the late threshold past
  its lease. An attempt that claims an effect holds its lease while the call is under way
  (renewed while it waits on a slow provider); one that stopped without recording an
  answer leaves the lease to lapse, and the step's next attempt finds it, marks it
  ``outcome_unknown`` and reconciles it with the provider. Long past its lease, no attempt
  came: its step is stuck elsewhere, or ended (then nobody ever will look, and whether the
  call was made is for a person to find out at the provider).
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
    seconds,
    step_label,
)

from . import sql

LIVE_STEP = ("ready", "running", "waiting")


def lapsed_in_flight(limits: Limits) -> Iterator[Finding]:
    with connection.cursor() as cursor:
        cursor.execute(sql.LAPSED_IN_FLIGHT, limits.params())
        rows = fetch_dicts(cursor)
    count, at_least = counted(rows, limits)
    if not count:
        yield Finding(check="effects.lapsed_in_flight", severity=Severity.OK,
                      summary=f"no effect is in flight more than {limits.late_seconds:g} s "
                      "past its lease")  # fmt: skip
        return
    yield Finding(
        check="effects.lapsed_in_flight", severity=Severity.BROKEN, count=count,
        at_least=at_least, value=seconds(rows[0]["lapsed_seconds"]), unit="seconds",
        summary=f"{'at least ' if at_least else ''}{count} effect(s) in flight more than "
        f"{limits.late_seconds:g} s past their lease: the call may or may not have been made, "
        "and no attempt of their step has come to find out",
        examples=tuple(_example(row) for row in rows),
    )  # fmt: skip


def _example(row: dict[str, Any]) -> Example:
    lapsed = seconds(row["lapsed_seconds"])
    held = f"lapsed {lapsed} s ago" if lapsed is not None else "none"
    step = row["step_status"] or "gone"
    if step in LIVE_STEP:
        then = f"its step is {step}, and its next attempt will reconcile it"
    else:
        then = (f"its step is {step}: no attempt will come; check at the provider whether the "
                "call was made")  # fmt: skip
    return Example(
        run_id=row["run_id"],
        org_id=row["org_id"],
        step=step_label(row),
        why=f"effect {row['id']} ({row['provider']}, claimed by {row['owner'] or '?'}) in "
        f"flight, its lease {held}; {then}",
    )


def register() -> None:
    register_health_check("effects.lapsed_in_flight", lapsed_in_flight, org_scoped=True)
