"""The control room, the admin's first screen: runs by status in the last hour and day, what
failed or is stuck (the doctor's findings), the lanes, the apps' panels (approvals waiting,
the signed-in person's first), each organisation's staff seeing only their own; and the page
bounded: capped counts, time windows, the same queries whatever the history holds."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.db.models import DateTimeField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext

from approvals.models import ApprovalRequest
from effects.models import Connection, Effect
from timers.models import Timer
from workflows.admin import control_room as room_module
from workflows.admin.control_room import COUNT_CAP, ControlRoom, Panel, control_room
from workflows.engine.sql import control_room as room_sql
from workflows.models import Organisation, Run, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start
from workflows.states import RunStatus

from .effect_setup import drive, start
from .factories import IO_DEFINITION, SIGNAL_WAIT_DEFINITION, OrganisationFactory
from .test_admin_scoping import staff_user
from .test_approvals_setup import approval_definition, person
from .test_doctor import TIMER_DEFINITION, read

TRANSACTION_NOW = RawSQL("now()", [], output_field=DateTimeField())

pytestmark = pytest.mark.django_db


def runs(org: Organisation, n: int, *, prefix: str = "k") -> list[Run]:
    """``n`` runs of ``org``, each parked on a signal (running, with a way forward)."""
    automation_publish_definition(org=org, slug="orders", definition=SIGNAL_WAIT_DEFINITION)
    ids = [
        run_start(org=org, automation_slug="orders", start_key=f"{prefix}{i}",
                  run_input={"order": f"{prefix}{i}"}).run_id
        for i in range(n)
    ]  # fmt: skip
    return list(Run.objects.filter(pk__in=ids).order_by("id"))


def fail(run: Run, error: str = "boom") -> None:
    Run.objects.filter(pk=run.pk).update(status="failed", error=error, finished_at=Now())
    Step.objects.filter(run_id=run.pk).update(status="cancelled")


def strand(run: Run) -> None:
    """A running run with no live step: nothing will ever move it (the doctor's finding)."""
    Step.objects.filter(run_id=run.pk).update(status="cancelled")


def age(run: Run, hours: float) -> None:
    Run.objects.filter(pk=run.pk).update(created_at=Now() - timedelta(hours=hours))


def room_for(user: User) -> ControlRoom:
    request = RequestFactory().get("/admin/")
    request.user = user
    return control_room(request)


def panel(room: ControlRoom, title: str) -> Panel:
    (found,) = [p for p in room.panels if p.title.startswith(title)]
    return found


def figures(room: ControlRoom) -> dict[str, tuple[str, ...]]:
    return {line.text: line.values for line in panel(room, "Runs by status").lines}


def texts(found: Panel) -> list[str]:
    return [line.text for line in found.lines]


def test_runs_are_counted_by_status_in_the_last_hour_and_the_last_day() -> None:
    org = OrganisationFactory.create()
    _now, earlier, last_week, failed = runs(org, 4)
    age(earlier, 5)
    age(last_week, 24 * 7)  # in neither window
    fail(failed)
    user = staff_user("olga", org)

    counted = figures(room_for(user))

    assert counted["running"] == ("1", "2")  # now; now and earlier
    assert counted["failed"] == ("1", "1")
    assert counted["succeeded"] == ("0", "0")


def test_counts_stop_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    org = OrganisationFactory.create()
    runs(org, 4)
    monkeypatch.setattr(room_module, "COUNT_CAP", 2)

    assert figures(room_for(staff_user("olga", org)))["running"] == ("2+", "2+")


def test_failed_and_stranded_runs_are_listed_with_links_to_their_pages() -> None:
    org = OrganisationFactory.create()
    failed, stranded, _fine = runs(org, 3)
    fail(failed, "the CRM said no")
    strand(stranded)

    stuck = panel(room_for(staff_user("olga", org)), "Failed or stuck")

    lines = {line.text: line for line in stuck.lines}
    failed_line = next(line for text, line in lines.items() if text.startswith(f"run {failed.pk} "))
    assert "the CRM said no" in failed_line.text
    assert failed_line.url == f"/admin/workflows/run/{failed.pk}/change/"
    assert any(text.startswith("workflows.stranded_runs: 1 live run has") for text in lines)
    stranded_line = next(
        line for text, line in lines.items() if text.startswith(f"run {stranded.pk}")
    )
    assert stranded_line.url == f"/admin/workflows/run/{stranded.pk}/change/"
    assert "no live step" in stranded_line.text


@pytest.mark.django_db(transaction=True)  # the worker commits
def test_a_member_of_one_organisation_sees_nothing_of_another() -> None:
    mine, theirs = OrganisationFactory.create(), OrganisationFactory.create()
    (my_run,) = runs(mine, 1, prefix="m")
    their_failed, their_stranded, _ = runs(theirs, 3, prefix="t")
    fail(their_failed, "their secret error")
    strand(their_stranded)
    their_approval_run = start(theirs, approval_definition(), slug="refunds",
                               run_input={"amount": 5, "customer": "Theirs"})  # fmt: skip
    drive(lane="human")
    user = staff_user("olga", mine)
    user.user_permissions.add(Permission.objects.get(codename="view_approvalrequest"))
    user = User.objects.get(pk=user.pk)  # permissions read afresh

    room = room_for(user)

    counted = figures(room)
    assert counted["running"] == ("1", "1") and counted["failed"] == ("0", "0")
    stuck = texts(panel(room, "Failed or stuck"))
    # Their failed and stranded runs are not ours; whether a sweeper leads is everyone's.
    assert [text for text in stuck if not text.startswith("workflows.sweep_leader")] == []
    assert texts(panel(room, "Waiting for people")) == []
    page = Client()
    page.force_login(user)
    html = page.get("/admin/").content.decode()
    for secret in ("their secret error", f"run {their_stranded.pk}", f"run {their_approval_run}"):
        assert secret not in html
    assert f"run {my_run.pk}" not in html  # parked on a signal: nothing to say about it

    # A superuser sees both organisations'.
    root = User.objects.create_superuser("root", password="pw")
    everything = room_for(root)
    assert figures(everything)["failed"] == ("1", "1")
    assert any(
        text.startswith(f"run {their_failed.pk} ")
        for text in texts(panel(everything, "Failed or stuck"))
    )


@pytest.mark.django_db(transaction=True)  # the worker commits
def test_approvals_waiting_for_the_signed_in_person_come_first() -> None:
    org = OrganisationFactory.create()
    # Someone else's request, due sooner, then one for the finance group, later.
    others = start(org, approval_definition(approvers=["group:ops"], deadline="1h"), slug="ops",
                   key="o1", run_input={"amount": 1, "customer": "Ops"})  # fmt: skip
    mine = start(org, approval_definition(deadline="2d"), slug="refunds", key="f1",
                 run_input={"amount": 120, "customer": "Maya"})  # fmt: skip
    drive(lane="human")
    alice = person(org, "alice")  # finance

    waiting = panel(room_for(alice), "Waiting for people")

    first, second = waiting.lines
    mine_request = ApprovalRequest.objects.get(run_id=mine)
    assert first.tone == "mine" and first.text.startswith(f"approval {mine_request.pk} ")
    assert "Refund 120 EUR to Maya?" in first.text
    assert first.url == f"/admin/approvals/approvalrequest/{mine_request.pk}/review/"
    assert second.tone == "" and f"run {others}," in second.text
    assert waiting.title == "Waiting for people (2)"


def review_and_open_circuit(org: Organisation) -> tuple[Effect, Connection]:
    run_id = start(org, IO_DEFINITION, slug="calls", key=f"calls-{org.pk}")
    effect = Effect.objects.create(
        org=org, run_id=run_id, step_id="work", iteration=1, key=f"{run_id}/work/1",
        provider="http", state="needs_review", token="", owner="", step_attempt=1,
    )  # fmt: skip
    connection = Connection.objects.create(
        org=org, name=f"crm-{org.pk}", provider="http", circuit="open", consecutive_failures=5
    )
    return effect, connection


def test_effects_to_review_and_open_circuit_breakers_are_the_organisations_own() -> None:
    mine, theirs = OrganisationFactory.create(), OrganisationFactory.create()
    effect, connection = review_and_open_circuit(mine)
    their_effect, their_connection = review_and_open_circuit(theirs)
    user = staff_user("olga", mine)
    user.user_permissions.add(Permission.objects.get(codename="view_effect"))
    user = User.objects.get(pk=user.pk)

    effects = panel(room_for(user), "Effects to review")

    assert effects.title == "Effects to review (1) and circuit breakers"
    review, circuit = effects.lines
    assert review.text.startswith(f"effect {effect.pk} (http, run {effect.run_id} work#1)")
    assert review.url == f"/admin/effects/effect/{effect.pk}/change/"
    assert circuit.text.startswith(f"connection {connection.name} (http): circuit breaker open")
    assert circuit.url == f"/admin/effects/connection/{connection.pk}/change/"
    assert ("Effects to review", "/admin/effects/effect/?state__exact=needs_review") in [
        (link.text, link.url) for link in effects.links
    ]
    # Without the permission to see effects, no panel.
    assert not [
        p for p in room_for(staff_user("vic", mine)).panels if p.title.startswith("Effects")
    ]
    assert their_effect.pk != effect.pk and their_connection.name not in circuit.text


def test_the_most_overdue_timer_of_the_organisations_is_shown() -> None:
    mine, theirs = OrganisationFactory.create(), OrganisationFactory.create()
    late = start(mine, TIMER_DEFINITION, slug="late", key="late")
    later = start(theirs, TIMER_DEFINITION, slug="later", key="later")
    # By the transaction's clock, which the panel reads (now()); Django's Now() is the
    # statement's, later by however long the test took so far (89.9 s late on a busy machine).
    Timer.objects.filter(run_id=late).update(due_at=TRANSACTION_NOW - timedelta(seconds=90))
    Timer.objects.filter(run_id=later).update(due_at=TRANSACTION_NOW - timedelta(hours=3))

    (line,) = panel(room_for(staff_user("olga", mine)), "Timers").lines
    (everyone,) = panel(room_for(User.objects.create_superuser("root")), "Timers").lines

    assert line.text.startswith("the most overdue: timer") and f"of run {late} " in line.text
    assert line.tone == "warning" and line.url == f"/admin/workflows/run/{late}/change/"
    assert line.values[0].endswith(" s late") and 90 <= float(line.values[0].split()[0]) < 3600
    assert f"of run {later} " in everyone.text  # the superuser's most overdue is theirs


def test_the_page_runs_the_same_queries_whatever_the_history_holds() -> None:
    org = OrganisationFactory.create()
    root = User.objects.create_superuser("root", password="pw")
    page = Client()
    page.force_login(root)
    page.get("/admin/")  # sessions, content types: cached from here on

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert page.get("/admin/").status_code == 200
        return len(captured)

    for run in runs(org, 3, prefix="a"):
        fail(run)
    few = queries()
    for run in runs(org, 30, prefix="b"):
        fail(run)
    for run in runs(OrganisationFactory.create(), 5, prefix="c")[:2]:
        strand(run)
    assert queries() == few  # the same statements (another organisation: still one each)


def test_workflows_comes_first_among_the_apps() -> None:
    root = User.objects.create_superuser("root", password="pw")
    page = Client()
    page.force_login(root)

    html = page.get("/admin/").content.decode()

    apps = html[html.index('id="content-main"') :]
    assert apps.index("app-workflows") < apps.index("app-approvals") < apps.index("app-effects")
    assert html.index('id="control-room"') < html.index('id="content-main"')


# Runs of two days ago and older: the history the page must not read (succeeded and failed).
HISTORY = """
INSERT INTO workflows_run (org_id, automation_id, version_id, start_key, start_key_derived,
                           input, input_digest, status, vars, outputs, entered, error,
                           steps_executed, max_steps, deadline_at, created_at, finished_at)
SELECT %(org)s, %(automation)s, %(version)s, 'old-' || g, false, '{}', '',
       CASE WHEN g %% 10 = 0 THEN 'failed' ELSE 'succeeded' END, '{}', '{}', '{}', '', 1,
       1000, now(), now() - interval '2 days' - make_interval(secs => g), now()
  FROM generate_series(1, 20000) g
"""


@pytest.mark.django_db(transaction=True)  # ANALYZE sees the rows
def test_the_counts_read_their_windows_not_the_history() -> None:
    org = OrganisationFactory.create()
    recent = runs(org, 10)
    for run in recent[:3]:
        fail(run)
    version = Run.objects.get(pk=recent[0].pk).version
    with connection.cursor() as cursor:
        cursor.execute(HISTORY, {"org": org.pk, "automation": version.automation_id,
                                 "version": version.pk})  # fmt: skip
        cursor.execute("ANALYZE workflows_run")
    by_status: dict[str, Any] = {
        "orgs": [org.pk],
        "statuses": list(RunStatus.values),
        "cap": COUNT_CAP + 1,
    }

    scans, rows = read(room_sql.RUNS_BY_STATUS, by_status)
    assert all(n["Node Type"] != "Seq Scan" for n in scans), scans
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + room_sql.RUNS_BY_STATUS, by_status)
        assert "run_org_status_created" in " ".join(row[0] for row in cursor.fetchall())
    assert rows <= 2 * 10, rows  # the ten recent runs, once per window: of 20,010
    scans, rows = read(room_sql.NEWEST_FAILED_RUNS, {"orgs": [org.pk], "limit": 5})
    assert all(n["Node Type"] != "Seq Scan" for n in scans) and rows <= 5, (rows, scans)


def test_a_staff_member_of_no_organisation_sees_empty_panels() -> None:
    org = OrganisationFactory.create()
    fail(runs(org, 1)[0])
    nobody = staff_user("nobody")
    page = Client()
    page.force_login(nobody)

    assert page.get("/admin/").status_code == 200
    room = room_for(nobody)
    assert set(figures(room).values()) == {("0", "0")}
    assert [t for t in texts(panel(room, "Failed or stuck")) if "sweep_leader" not in t] == []


def test_the_manual_is_linked_from_the_control_room_and_the_apis_docs(settings) -> None:
    """Where people read the manual (WAYMARK_DOCS_URL): a link among the control room's
    "Go to" links, for everyone who opens it, and in the API schema's description, which
    the API's docs page (/api/v1/docs/) shows at its top."""
    org = Organisation.objects.create(slug="readers", name="Readers")
    settings.WAYMARK = {**settings.WAYMARK, "DOCS_URL": "https://docs.example.test/waymark/"}
    links = {link.text: link.url for link in room_for(staff_user("reader", org)).links}
    assert links["Documentation"] == "https://docs.example.test/waymark/"
    client = Client()
    client.force_login(staff_user("page", org))
    page = client.get("/admin/").content.decode()
    assert 'href="https://docs.example.test/waymark/"' in page
    schema = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    default = f"http://127.0.0.1:{8001}/"  # WAYMARK_DOCS_PORT's default, read at start-up
    assert f"The manual: [{default}]({default})" in schema.json()["info"]["description"]
