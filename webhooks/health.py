"""The webhooks' absence monitor (``manage.py doctor``, ``/readyz``):

- ``webhooks.overdue``: no delivery waits more than the late threshold past its time. The
  leading sweeper sends a due delivery within a poll interval (an endpoint that fails only
  moves its next time on), so a delivery long overdue means no sweeper leads, or its sender
  is stuck: every organisation's webhooks have stopped.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db import connection

from workflows.plugins.engine import fetch_dicts
from workflows.plugins.health import Example, Finding, Limits, Severity, counted, seconds

from . import sql

CHECK = "webhooks.overdue"


def overdue(limits: Limits) -> Iterator[Finding]:
    with connection.cursor() as cursor:
        cursor.execute(sql.OVERDUE, limits.params())
        rows = fetch_dicts(cursor)
    count, at_least = counted(rows, limits)
    if not count:
        yield Finding(check=CHECK, severity=Severity.OK,
                      summary=f"no webhook delivery is more than {limits.late_seconds:g} s "
                      "overdue")  # fmt: skip
        return
    yield Finding(
        check=CHECK,
        severity=Severity.BROKEN,
        count=count,
        at_least=at_least,
        value=seconds(rows[0]["late_seconds"]),
        unit="seconds",
        summary=f"{'at least ' if at_least else ''}{count} webhook deliver(ies) more than "
        f"{limits.late_seconds:g} s overdue: no sweeper leads, or its sender is stuck",
        examples=tuple(
            Example(
                run_id=row["run_id"],
                org_id=row["org_id"],
                why=f"delivery {row['id']} ({row['event_type']}, {row['attempts']} "
                f"attempt(s)) due {seconds(row['late_seconds'])} s ago",
            )
            for row in rows
        ),
    )
