"""The admin's first screen: the control room. What an operator needs first, before the list
of apps: runs by status in the last hour and day, what failed or is stuck (the doctor's
findings: engine/health.py, run for the staff member's organisations), the oldest ready step
of each lane, then the apps' own panels (timer lateness, effects to review, circuit breakers,
approvals and tasks waiting for people), and links to what a person came to do.

- **Scoped.** Every panel reads only the organisations the staff member sees (``scoping``;
  a superuser sees them all): the runs' statements take their ids, and the doctor runs only
  the checks that keep to ``Limits.orgs`` (``register_health_check(..., org_scoped=True)``).
- **Bounded.** No count over a whole table: each is a range of an index, capped
  (``COUNT_CAP``: "10,000+"); the page runs the same statements whatever the history holds.
- **Apps plug in.** ``workflows`` imports none of the apps: each registers its panel
  through the door (``workflows.plugins.admin.register_control_panel``), and its panel
  reads its own rows (``Panel``, ``Line``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest
from django.urls import reverse

from ..engine.health import COUNT_CAP, Finding, Limits, Report, Severity, run_checks
from ..engine.lanes import engine_setting
from ..engine.sql import control_room as sql
from ..engine.sql.rows import fetch_dicts
from ..models import Organisation
from ..states import RunStatus
from .scoping import member_org_ids

FAILED_SHOWN = 5  # the newest failed runs listed
EXAMPLES_SHOWN = 5  # runs listed per finding
CHECK_TIMEOUT_SECONDS = 5.0  # each check's statements on this page (the doctor's own: 30)
LANE_CHECK = "workflows.oldest_ready"


@dataclass(frozen=True)
class Line:
    """One line of a panel: ``text``, a link (``url``), its figures (``values``, one per
    column of the panel) and its ``tone``: "mine" (for the person signed in), "warning",
    "broken", or "" for none."""

    text: str
    url: str = ""
    values: tuple[str, ...] = ()
    tone: str = ""


@dataclass(frozen=True)
class Panel:
    """One box of the control room: its lines (``empty`` when there are none), the names of
    its figures' columns, and links to where its work is done (also gathered at the top)."""

    title: str
    lines: tuple[Line, ...] = ()
    empty: str = ""
    columns: tuple[str, ...] = ()
    links: tuple[Line, ...] = ()
    order: int = 100  # lower first; the engine's panels are 10 to 30


# An app's panel: (request, the organisations' ids the staff member sees) -> its panel, or
# None when the person may not see what it shows.
PanelSource = Callable[[HttpRequest, tuple[int, ...]], Panel | None]
CONTROL_PANELS: dict[str, PanelSource] = {}


@dataclass
class ControlRoom:
    panels: list[Panel] = field(default_factory=list)
    links: list[Line] = field(default_factory=list)


def capped(count: int, cap: int | None = None) -> str:
    """A count read up to one past ``cap`` (``COUNT_CAP``): "10,000+" beyond it."""
    cap = COUNT_CAP if cap is None else cap
    return f"{cap:,}+" if count > cap else f"{count:,}"


def run_url(run_id: int) -> str:
    return reverse("admin:workflows_run_change", args=[run_id])


def control_room(request: HttpRequest) -> ControlRoom:
    """Every panel the person may see, in order, and the links of them all."""
    member = member_org_ids(request)
    orgs = _org_ids(member)
    room = ControlRoom()
    if request.user.has_perm("workflows.view_run"):
        limits = Limits.from_settings()
        scope = None if member is None else orgs
        report = run_checks(
            Limits(late_seconds=limits.late_seconds, examples=EXAMPLES_SHOWN, orgs=scope),
            timeout_seconds=min(
                CHECK_TIMEOUT_SECONDS, float(engine_setting("DOCTOR_TIMEOUT_SECONDS"))
            ),
        )
        room.panels += [
            runs_panel(orgs, request.user),
            stuck_panel(orgs, report),
            lanes_panel(orgs, report),
        ]
    for _name, source in sorted(CONTROL_PANELS.items()):
        panel = source(request, orgs)
        if panel is not None:
            room.panels.append(panel)
    room.panels.sort(key=lambda panel: panel.order)
    room.links = [link for panel in room.panels for link in panel.links]
    docs = settings.WAYMARK.get("DOCS_URL")
    if docs:  # a host's own WAYMARK settings may leave it out
        room.links.append(Line("Documentation", str(docs)))
    return room


def _org_ids(member: frozenset[int] | None) -> tuple[int, ...]:
    if member is None:  # a superuser: every organisation (a short table)
        return tuple(Organisation.objects.order_by("id").values_list("id", flat=True))
    return tuple(sorted(member))


# --- the engine's panels -----------------------------------------------------------------------


def runs_panel(orgs: tuple[int, ...], user: Any) -> Panel:
    statuses = list(RunStatus.values)
    with connection.cursor() as cursor:
        cursor.execute(
            sql.RUNS_BY_STATUS,
            {"orgs": list(orgs), "statuses": statuses, "cap": COUNT_CAP + 1},
        )
        rows = fetch_dicts(cursor)
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        counts[(row["window"], row["status"])] = int(row["runs"])
    runs = reverse("admin:workflows_run_changelist")
    lines = tuple(
        Line(
            text=status,
            url=f"{runs}?status__exact={status}",
            values=(
                capped(counts.get(("hour", status), 0)),
                capped(counts.get(("day", status), 0)),
            ),
            tone="broken" if status == RunStatus.FAILED and counts.get(("hour", status)) else "",
        )
        for status in statuses
    )
    return Panel(
        title="Runs by status",
        columns=("last hour", "last day"),
        lines=lines,
        order=10,
        links=(
            Line("Failed runs", f"{runs}?status__exact={RunStatus.FAILED}"),
            Line("All runs", runs),
            *_links_allowed(user),
        ),
    )


def _links_allowed(user: Any) -> list[Line]:
    """The engine's other pages a person comes to, those they may open."""
    pages = [
        ("Automations", "workflows.view_automation", "admin:workflows_automation_changelist"),
        ("Audit log", "workflows.view_auditentry", "admin:workflows_auditentry_changelist"),
    ]
    return [Line(label, reverse(name)) for label, perm, name in pages if user.has_perm(perm)]


def stuck_panel(orgs: tuple[int, ...], report: Report) -> Panel:
    """The newest failed runs, then what the doctor found broken (or could not check), each
    with the runs it names, linked to their pages."""
    lines: list[Line] = []
    with connection.cursor() as cursor:
        cursor.execute(sql.NEWEST_FAILED_RUNS, {"orgs": list(orgs), "limit": FAILED_SHOWN})
        failed = fetch_dicts(cursor)
    for row in failed:
        error = f": {row['error']}" if row["error"] else ""
        lines.append(Line(text=f"run {row['id']} ({row['automation']}) failed{error}",
                          url=run_url(row["id"]), tone="broken"))  # fmt: skip
    for finding in report.findings:
        if finding.check == LANE_CHECK or finding.severity in (Severity.OK, Severity.INFO):
            continue
        tone = "broken" if finding.severity == Severity.BROKEN else "warning"
        lines.append(Line(text=f"{finding.label}: {finding.summary}", tone=tone))
        lines.extend(_example_lines(finding, orgs))
    return Panel(
        title="Failed or stuck",
        lines=tuple(lines),
        empty="No run failed, and every invariant the doctor checks holds.",
        order=20,
    )


def _example_lines(finding: Finding, orgs: tuple[int, ...]) -> Iterable[Line]:
    for example in finding.examples:
        if example.org_id is not None and example.org_id not in orgs:
            continue  # a check's statement keeps to the organisations; this, once more
        where = f"run {example.run_id} {example.step}".strip() if example.run_id else example.step
        text = f"{where}: {example.why}" if where else example.why
        yield Line(text=text, url=run_url(example.run_id) if example.run_id else "")


def lanes_panel(orgs: tuple[int, ...], report: Report) -> Panel:
    lines = []
    for finding in report.findings:
        if finding.check != LANE_CHECK:
            continue
        example = finding.examples[0] if finding.examples else None
        url = run_url(example.run_id) if example and example.run_id else ""
        waited = f"{finding.value:g} s" if finding.count and finding.value is not None else "-"
        lines.append(Line(
            text=finding.subject, url=url, values=(capped(finding.count), waited),
            tone="warning" if finding.severity == Severity.WARNING else "",
        ))  # fmt: skip
    return Panel(
        title="Lanes: the oldest ready step",
        columns=("ready", "oldest waits"),
        lines=tuple(lines),
        empty="The lanes could not be checked.",
        order=30,
    )


def apps_workflows_first(app_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The admin's apps with Workflows first, the others in the admin's order."""
    return sorted(app_list, key=lambda app: app.get("app_label") != "workflows")
