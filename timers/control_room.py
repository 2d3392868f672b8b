"""The timers' panel on the control room (the admin's first screen): how late the most
overdue timer is. The due sweep fires timers on time; one growing late means no sweeper
leads, or its firing fails (``timers.overdue``, the doctor's check, says so past the late
threshold; this shows it from the first second)."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest
from django.urls import reverse

from workflows.plugins.admin import Line, Panel, register_control_panel
from workflows.plugins.engine import fetch_dict

from . import sql

LATE_SECONDS = 10.0  # a timer fires within a sweep tick or two; later than this is worth a look


def timer_lateness(request: HttpRequest, orgs: tuple[int, ...]) -> Panel | None:
    if not request.user.has_perm("workflows.view_run"):
        return None
    with connection.cursor() as cursor:
        cursor.execute(sql.EARLIEST_PENDING_TIMER, {"orgs": list(orgs)})
        row = fetch_dict(cursor)
    if row is None:
        lines: tuple[Line, ...] = ()
    else:
        late = float(row["late_seconds"])
        where = f"timer {row['id']} ({row['kind']}) of run {row['run_id']} {row['step_id']}"
        if late > LATE_SECONDS:
            line = Line(text=f"the most overdue: {where}", values=(f"{late:.1f} s late",),
                        tone="warning")  # fmt: skip
        else:
            due = f"{late:.1f} s late" if late > 0 else f"due in {-late:.1f} s"
            line = Line(text=f"the earliest: {where}", values=(due,))
        url = reverse("admin:workflows_run_change", args=[row["run_id"]])
        lines = (Line(text=line.text, url=url, values=line.values, tone=line.tone),)
    return Panel(
        title="Timers",
        columns=("lateness",),
        lines=lines,
        empty="No timer is pending.",
        order=35,
    )


def register() -> None:
    register_control_panel("timers.lateness", timer_lateness)
