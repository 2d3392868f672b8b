"""The absence monitors: `manage.py doctor` and `/readyz` find each broken invariant produced
by hand (a waiting run whose timer row is deleted, an effect left in flight past its lease,
an unsent outbox row, a lease held by a dead worker, a run with no way forward), naming the
run, and say nothing broken about a healthy engine, at rest or under load."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from effects.models import Effect
from effects.resolve import park_orphaned_calls
from timers.models import Timer
from workflows.engine.health import (
    EXIT_BROKEN,
    EXIT_HEALTHY,
    EXIT_UNCHECKED,
    HEALTH_CHECKS,
    Finding,
    Limits,
    Severity,
    run_checks,
)
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim
from workflows.engine.sweeper import LEASE_NAME
from workflows.health.views import forget
from workflows.models import Membership, Outbox, Run, Signal, Step, SweepLease
from workflows.services.automations import automation_publish_definition
from workflows.services.control import run_act
from workflows.services.runs import run_start

from .engine_harness import Harness
from .factories import IO_DEFINITION, SIGNAL_WAIT_DEFINITION
from .processes import ROOT, engine_env, wait_for

TIMER_DEFINITION: dict = {
    "start": "pause",
    "steps": [
        {"id": "pause", "type": "wait", "duration": "2h", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}

LATE = "10 minutes"  # past the default late threshold (300 s)


def doctor(*args: str) -> tuple[int, dict[str, Any]]:
    """`manage.py doctor --json`, in this process (it sees this test's transaction): its exit
    code and its report."""
    out = io.StringIO()
    try:
        call_command("doctor", "--json", *args, stdout=out)
        code = EXIT_HEALTHY
    except SystemExit as exit:
        code = int(exit.code or 0)
    report: dict[str, Any] = json.loads(out.getvalue())
    return code, report


def finding(report: dict[str, Any], check: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [f for f in report["findings"] if f["check"] == check]
    assert len(found) == 1, found
    return found[0]


def broken_runs(report: dict[str, Any], check: str) -> dict[int, str]:
    """The runs a broken finding lists, with why."""
    found = finding(report, check)
    assert found["severity"] == "broken", found
    return {e["run_id"]: e["why"] for e in found["examples"]}


def start(org, definition: dict, *, slug: str = "doctor", **run_input) -> int:
    automation_publish_definition(org=org, slug=slug, definition=definition)
    return run_start(org=org, automation_slug=slug, run_input=run_input, start_key=slug).run_id


def backdate(sql: str, **params: Any) -> None:
    """An UPDATE that moves something ``LATE`` into the past (the database's clock)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, {"late": LATE, **params})


# --- at rest -------------------------------------------------------------------------------------


def test_a_healthy_engine_at_rest_has_nothing_broken(org):
    """Runs waiting on each thing that will move them: a timer, a signal, a worker."""
    timer_run = start(org, TIMER_DEFINITION, slug="t")
    signal_run = start(org, SIGNAL_WAIT_DEFINITION, slug="s", order="o-1")
    io_run = start(org, IO_DEFINITION, slug="io")
    assert Run.objects.filter(pk__in=[timer_run, signal_run, io_run], status="running").count() == 3
    code, report = doctor()
    assert code == EXIT_HEALTHY, report
    assert report["status"] == "ok" and report["broken"] == []
    assert {f["severity"] for f in report["findings"]} <= {"ok", "info", "warning"}
    io_ready = [f for f in report["findings"]
                if f["check"] == "workflows.oldest_ready" and f["subject"] == "io"]  # fmt: skip
    assert io_ready[0]["count"] == 1  # the io run's step, a measure


def test_a_paused_run_waits_for_its_resume_and_is_not_stranded(org):
    run_id = start(org, IO_DEFINITION)
    run_act(org=org, run_id=run_id, action="pause", actor="test")
    assert Step.objects.get(run_id=run_id, step_id="work").wait_kind == "paused"
    code, report = doctor()
    assert code == EXIT_HEALTHY, report


# --- each broken invariant, produced by hand ---------------------------------------------------


def test_a_waiting_run_whose_timer_row_is_deleted_is_stranded(org):
    run_id = start(org, TIMER_DEFINITION)
    Timer.objects.filter(run_id=run_id).delete()
    code, report = doctor()
    assert code == EXIT_BROKEN
    assert {"workflows.stranded_runs", "timers.waits_without_timer"} <= set(report["broken"])
    why = broken_runs(report, "workflows.stranded_runs")[run_id]
    assert "pause#1 waits on timer:" in why and "timer is not pending" in why, why
    assert broken_runs(report, "timers.waits_without_timer") == {
        run_id: "waits on a timer, and its timer row is gone"
    }


def test_a_timer_fired_without_waking_its_step_is_found(org):
    run_id = start(org, TIMER_DEFINITION)
    Timer.objects.filter(run_id=run_id).update(fired_at="2026-01-01T00:00:00Z", error="boom")
    code, report = doctor()
    assert code == EXIT_BROKEN
    assert run_id in broken_runs(report, "workflows.stranded_runs")
    why = broken_runs(report, "timers.waits_without_timer")[run_id]
    assert "fired with an error: boom" in why, why


def test_a_timer_overdue_past_the_threshold_is_found(org):
    run_id = start(org, TIMER_DEFINITION)
    backdate("UPDATE timers_timer SET due_at = now() - %(late)s::interval WHERE run_id = %(r)s",
             r=run_id)  # fmt: skip
    code, report = doctor()
    assert code == EXIT_BROKEN and report["broken"] == ["timers.overdue"], report["broken"]
    assert "not fired" in broken_runs(report, "timers.overdue")[run_id]
    assert finding(report, "timers.overdue")["value"] >= 600
    # With a threshold past its lateness, it is not late yet.
    assert doctor("--late-seconds", "3600")[0] == EXIT_HEALTHY


def test_an_effect_left_in_flight_past_its_lease_is_found(org):
    run_id = start(org, IO_DEFINITION)
    effect = Effect.objects.create(
        org=org, run_id=run_id, step_id="work", iteration=1, key=f"{run_id}/work/1",
        provider="http", state="in_flight", token="t", owner="gone-worker", step_attempt=1,
    )  # fmt: skip
    backdate("UPDATE effects_effect SET lease_until = now() - %(late)s::interval"
             " WHERE id = %(id)s", id=effect.pk)  # fmt: skip
    code, report = doctor()
    assert code == EXIT_BROKEN and report["broken"] == ["effects.lapsed_in_flight"]
    why = broken_runs(report, "effects.lapsed_in_flight")[run_id]
    assert f"effect {effect.pk}" in why and "gone-worker" in why
    assert "its step is ready, and its next attempt will reconcile it" in why

    run_act(org=org, run_id=run_id, action="cancel", actor="test")  # now nobody will look
    why = broken_runs(doctor()[1], "effects.lapsed_in_flight")[run_id]
    assert "its step is cancelled: no attempt will come" in why, why

    # The sweep parks it for a person (effects.park_orphaned_calls): no longer in flight.
    assert park_orphaned_calls() == 1
    effect.refresh_from_db()
    assert effect.state == "needs_review" and "check at the provider" in effect.error
    assert doctor()[0] == EXIT_HEALTHY


def test_an_unsent_outbox_row_older_than_the_threshold_is_found(org):
    run_id = start(org, IO_DEFINITION)
    row = Outbox.objects.create(org=org, topic="lane.wake", payload={"lane": "io", "run": run_id})
    assert doctor()[0] == EXIT_HEALTHY  # unsent, but not late yet
    backdate("UPDATE workflows_outbox SET created_at = now() - %(late)s::interval"
             " WHERE id = %(id)s", id=row.pk)  # fmt: skip
    code, report = doctor()
    assert code == EXIT_BROKEN and report["broken"] == ["workflows.unsent_outbox"]
    assert (
        f"outbox row {row.pk} (lane.wake)" in broken_runs(report, "workflows.unsent_outbox")[run_id]
    )


def test_a_lease_held_by_a_dead_worker_is_found(org):
    run_id = start(org, IO_DEFINITION)
    (claimed,) = claim(policy=lane_policy("io"), worker="dead-worker", limit=1)
    assert claimed.run_id == run_id
    backdate("UPDATE workflows_step SET lease_until = now() - %(late)s::interval"
             " WHERE id = %(id)s", id=claimed.id)  # fmt: skip
    code, report = doctor()
    assert code == EXIT_BROKEN and report["broken"] == ["workflows.lapsed_leases"]
    why = broken_runs(report, "workflows.lapsed_leases")[run_id]
    assert "held by dead-worker" in why and "lane io" in why, why


def test_a_run_with_no_live_step_is_stranded(org):
    run_id = start(org, IO_DEFINITION)
    Step.objects.filter(run_id=run_id).update(status="cancelled")
    code, report = doctor()
    assert code == EXIT_BROKEN and report["broken"] == ["workflows.stranded_runs"]
    assert broken_runs(report, "workflows.stranded_runs") == {
        run_id: "the run is running but has no live step: nothing will ever end it"
    }


def test_a_step_parked_for_a_pause_in_a_running_run_is_stranded(org):
    run_id = start(org, IO_DEFINITION)
    Step.objects.filter(run_id=run_id).update(status="waiting", wait_kind="paused")
    code, report = doctor()
    assert code == EXIT_BROKEN
    why = broken_runs(report, "workflows.stranded_runs")[run_id]
    assert why == "work#1 is parked for a pause, but the run is running: no resume will unpark it"


def test_an_untimed_wait_no_app_answers_for_is_stranded(org):
    run_id = start(org, IO_DEFINITION)
    Step.objects.filter(run_id=run_id).update(
        status="waiting", wait_kind="external", wait_detail={"parked_on": "nobody:1"}
    )
    why = broken_runs(doctor()[1], "workflows.stranded_runs")[run_id]
    assert "waits on nobody:1 (external) with no deadline, and no app answers" in why, why


def test_a_deadline_the_sweep_did_not_fire_is_found(org):
    run_id = start(org, SIGNAL_WAIT_DEFINITION, order="o-1")
    backdate("UPDATE workflows_step SET wake_at = now() - %(late)s::interval"
             " WHERE run_id = %(r)s", r=run_id)  # fmt: skip
    code, report = doctor()
    assert code == EXIT_BROKEN and report["broken"] == ["workflows.late_wakes"]
    why = broken_runs(report, "workflows.late_wakes")[run_id]
    assert "for its deadline" in why and "signal order.paid" in why, why


def test_a_signal_its_waiter_missed_is_found(org):
    run_id = start(org, SIGNAL_WAIT_DEFINITION, order="o-1")
    # A signal and the wait that committed together and missed each other, long ago.
    signal = Signal.objects.create(org=org, name="order.paid", correlation="o-1",
                                   correlations=["o-1"], identity="late-1")  # fmt: skip
    backdate("UPDATE workflows_signal SET received_at = now() - %(late)s::interval"
             " WHERE id = %(id)s", id=signal.pk)  # fmt: skip
    code, report = doctor()
    assert code == EXIT_BROKEN and report["broken"] == ["workflows.matched_signals_pending"]
    why = broken_runs(report, "workflows.matched_signals_pending")[run_id]
    assert f"signal {signal.pk} matching it" in why, why


def test_signals_nobody_waits_for_are_a_measure(org):
    Signal.objects.create(org=org, name="order.paid", correlation="nobody", identity="n-1")
    code, report = doctor()
    assert code == EXIT_HEALTHY
    pending = finding(report, "workflows.pending_signals")
    assert (pending["severity"], pending["count"]) == ("info", 1)


# --- the report and its exit codes -------------------------------------------------------------


def test_the_readable_report_names_the_broken_run_and_why(org):
    run_id = start(org, TIMER_DEFINITION)
    Timer.objects.filter(run_id=run_id).delete()
    out = io.StringIO()
    with pytest.raises(SystemExit) as exit:
        call_command("doctor", stdout=out)
    assert exit.value.code == EXIT_BROKEN
    text = out.getvalue()
    assert text.startswith("waymark doctor: BROKEN: 2 invariant(s) broken")
    assert (
        f"run {run_id} (org {org.pk}) pause#1: waits on a timer, and its timer row is gone" in text
    )


def test_a_check_that_cannot_run_in_time_is_unchecked_and_the_others_still_run(db, monkeypatch):
    def sleepy(limits: Limits) -> list[Finding]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(5)")
        return []

    def buggy(limits: Limits) -> list[Finding]:
        raise RuntimeError("a bug")

    monkeypatch.setitem(HEALTH_CHECKS, "test.sleepy", sleepy)
    monkeypatch.setitem(HEALTH_CHECKS, "test.buggy", buggy)
    report = run_checks(Limits(late_seconds=300, examples=3), timeout_seconds=0.2)
    unchecked = {f.check: f.summary for f in report.findings if f.severity == Severity.UNCHECKED}
    assert unchecked.keys() == {"test.sleepy", "test.buggy"}
    assert "statement timeout" in unchecked["test.sleepy"]
    assert unchecked["test.buggy"] == "failed: RuntimeError: a bug"
    assert report.exit_code == EXIT_UNCHECKED and report.status == "unchecked"
    assert any(f.check == "workflows.stranded_runs" for f in report.findings)
    with connection.cursor() as cursor:  # the timeout went with the check's transaction
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] != "200ms"


@pytest.mark.parametrize(
    "args", [("--late-seconds", "0"), ("--late-seconds", "nan"), ("--examples", "0"),
             ("--timeout", "-1")],
)  # fmt: skip
def test_bad_options_are_refused_with_a_code(db, args):
    with pytest.raises(CommandError, match="invalid_input"):
        call_command("doctor", *args, stdout=io.StringIO())


@pytest.mark.django_db(transaction=True)
def test_no_database_or_an_unmigrated_one_is_no_verdict_not_a_broken_invariant():
    """Exit 2 with one line, never 1 (which says an invariant is broken), never a traceback."""
    bare = f"{connection.settings_dict['NAME']}_doctor_bare"
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{bare}"')
        cursor.execute(f'CREATE DATABASE "{bare}"')
    try:
        for env, code in (({"WAYMARK_DB_NAME": bare}, "database_not_migrated"),
                          ({"DATABASE_URL": "postgres://nobody@127.0.0.1:1/nowhere"},
                           "database_unreachable")):  # fmt: skip
            done = subprocess.run(
                [sys.executable, "manage.py", "doctor"], cwd=ROOT, env=engine_env(**env),
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert done.returncode == EXIT_UNCHECKED, done.stderr
            assert f"CommandError: {code}: " in done.stderr and "Traceback" not in done.stderr
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{bare}" WITH (FORCE)')


# --- /readyz ----------------------------------------------------------------------------------


@pytest.fixture
def fresh_readyz(db):
    forget()  # no verdict kept from before this test
    yield
    forget()


def readyz(client: Client) -> tuple[int, dict[str, Any]]:
    forget()
    response = client.get("/readyz")
    return response.status_code, response.json()


def test_readyz_answers_200_when_healthy_and_503_with_the_broken_checks(org, fresh_readyz):
    run_id = start(org, TIMER_DEFINITION)
    status, body = readyz(Client())
    assert (status, body["status"], body["broken"]) == (200, "ok", [])
    Timer.objects.filter(run_id=run_id).delete()
    status, body = readyz(Client())
    assert (status, body["status"]) == (503, "broken")
    assert body["broken"] == ["timers.waits_without_timer", "workflows.stranded_runs"]
    stranded = next(f for f in body["findings"] if f["check"] == "workflows.stranded_runs")
    assert stranded["count"] == 1 and "examples" not in stranded  # counts, not runs
    assert "run_id" not in json.dumps(body)


def stranded_examples(body: dict[str, Any]) -> Any:
    """The examples of /readyz's stranded_runs finding, or None when it shows none."""
    return finding(body, "workflows.stranded_runs").get("examples")


def signed_in(username: str, *, orgs: tuple[Any, ...] = (), **flags: bool) -> Client:
    user = get_user_model().objects.create_user(username)
    for flag, value in flags.items():
        setattr(user, flag, value)
    user.save()
    for member_of in orgs:
        Membership.objects.create(user=user, org=member_of)
    client = Client()
    client.force_login(user)
    return client


def test_readyz_shows_staff_the_examples_of_their_own_organisations_only(
    org, other_org, fresh_readyz
):
    ours = start(org, TIMER_DEFINITION)
    theirs = start(other_org, TIMER_DEFINITION)
    Timer.objects.filter(run_id__in=[ours, theirs]).delete()
    SweepLease.objects.create(name=LEASE_NAME, holder="host-a:4242",
                              lease_until=timezone.now() + timedelta(minutes=1))  # fmt: skip
    status, body = readyz(signed_in("op", orgs=(org,), is_staff=True))
    assert status == 503 and body["broken"] == ["timers.waits_without_timer",
                                                "workflows.stranded_runs"]  # fmt: skip
    stranded = finding(body, "workflows.stranded_runs")
    assert stranded["count"] == 2  # the installation's count, as anyone sees it
    assert [(e["run_id"], e["org_id"]) for e in stranded["examples"]] == [(ours, org.pk)]
    shown = json.dumps(body)
    assert f'"run_id": {theirs}' not in shown and f'"org_id": {other_org.pk}' not in shown
    # The sweep's leader (a process's name, no organisation's) is the installation's.
    assert "host-a" not in shown and finding(body, "workflows.sweep_leader")["examples"] == []

    outsider = readyz(signed_in("op2", is_staff=True))[1]  # staff, a member of nothing
    assert stranded_examples(outsider) == []
    boss = readyz(signed_in("boss", is_staff=True, is_superuser=True))[1]
    assert sorted(e["run_id"] for e in stranded_examples(boss) or []) == sorted([ours, theirs])
    assert "host-a:4242" in json.dumps(boss)
    for member in (signed_in("someone", orgs=(org, other_org)), Client()):  # not staff
        assert "examples" not in json.dumps(readyz(member)[1])


def test_readyz_reuses_its_answer_for_a_while(org, fresh_readyz, settings):
    settings.WAYMARK = {**settings.WAYMARK, "READYZ_CACHE_SECONDS": 3600.0}
    run_id = start(org, TIMER_DEFINITION)
    assert Client().get("/readyz").status_code == 200
    Timer.objects.filter(run_id=run_id).delete()
    assert Client().get("/readyz").status_code == 200  # the answer of a moment ago
    forget()
    assert Client().get("/readyz").status_code == 503


# --- what the checks read ----------------------------------------------------------------------

# A history the bounded checks must not read: finished runs' steps, sent outbox rows,
# consumed signals, and waits, timers and effects that are not late. Written with SQL, in one
# statement.
HISTORY = """
WITH runs AS (
    INSERT INTO workflows_run (org_id, automation_id, version_id, start_key, start_key_derived,
                               input, input_digest, status, vars, outputs, entered, error,
                               steps_executed, max_steps, deadline_at, created_at, finished_at)
    SELECT %(org)s, %(automation)s, %(version)s, 'h-' || g, false, '{}', '',
           CASE WHEN g <= 100 THEN 'succeeded' ELSE 'running' END, '{}', '{}', '{}', '', 0,
           1000, now() + interval '1 day', now(), CASE WHEN g <= 100 THEN now() END
      FROM generate_series(1, 200) g
    RETURNING id, status
),
done AS (
    INSERT INTO workflows_step (org_id, run_id, step_id, iteration, type, lane, status,
                                attempt, release_count, series_offset, max_attempts, wait_kind,
                                error, created_at, finished_at)
    SELECT %(org)s, r.id, 's' || k, 1, 'noop', 'io', 'done', 1, 0, 0, 5, '', '', now(), now()
      FROM runs r CROSS JOIN generate_series(1, 100) k
),
waiting AS (
    INSERT INTO workflows_step (org_id, run_id, step_id, iteration, type, lane, status,
                                attempt, release_count, series_offset, max_attempts, wait_kind,
                                wake_at, wait_detail, error, created_at)
    SELECT %(org)s, r.id, 'w', 1, 'wait_signal', 'inline', 'waiting', 1, 0, 0, 1, 'external',
           now() + interval '1 hour', '{"signal": "go", "correlation": "x"}', '', now()
      FROM runs r WHERE r.status = 'running'
),
timers AS (
    INSERT INTO timers_timer (org_id, run_id, step_id, iteration, kind, intent, zone,
                              spread_seconds, offset_seconds, due_at, error, created_at)
    SELECT %(org)s, r.id, 't' || k, 1, 'wait', '{}', '', 0, 0, now() + interval '1 hour', '',
           now()
      FROM runs r CROSS JOIN generate_series(1, 50) k
),
signals AS (
    INSERT INTO workflows_signal (org_id, name, correlation, correlations, identity, source,
                                  received_at, consumed_at, consumed_by)
    SELECT %(org)s, 'go', 'c-' || g, ARRAY['c-' || g], 'c-' || g, 'api', now(), now(), 'x'
      FROM generate_series(1, 20000) g
),
effects AS (
    INSERT INTO effects_effect (org_id, run_id, step_id, iteration, key, external_key,
                                provider, state, token, owner, step_attempt, lease_until,
                                calls, reserved_cost, error, resolved_by, resolution,
                                lookup_failures, created_at, updated_at)
    SELECT %(org)s, r.id, 'e' || k, 1, 'e-' || r.id || '-' || k, '', 'http', 'settled', '', '',
           1, NULL, 1, 0, '', '', '', 0, now(), now()
      FROM runs r CROSS JOIN generate_series(1, 20) k
)
INSERT INTO workflows_outbox (org_id, topic, payload, created_at, sent_at)
SELECT %(org)s, 'lane.wake', '{"lane": "io"}', now(), now() FROM generate_series(1, 20000)
"""

BIG_TABLES = {"workflows_step", "workflows_outbox", "timers_timer", "effects_effect",
              "workflows_signal", "workflows_run"}  # fmt: skip


def table_scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    own = [node] if node.get("Relation Name") in BIG_TABLES else []
    return own + [n for child in node.get("Plans", []) for n in table_scans(child)]


def read(statement: str, params: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The statement's scans of the big tables, and the rows they read (kept or thrown
    away, over all their loops)."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
        raw = cursor.fetchone()[0]
    scans = table_scans((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])
    return scans, rows_read(scans)


def rows_read(scans: list[dict[str, Any]]) -> int:
    return int(sum((n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0))
                   * n.get("Actual Loops", 1) for n in scans))  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_the_bounded_checks_read_what_they_look_for_not_the_history(org):
    from effects import sql as effects_sql
    from timers import sql as timers_sql
    from workflows.engine.health import WAIT_ANSWERS
    from workflows.engine.sql import health as health_sql

    version = automation_publish_definition(org=org, slug="h", definition=IO_DEFINITION)
    with connection.cursor() as cursor:
        cursor.execute(HISTORY, {"org": org.pk, "automation": version.automation_id,
                                 "version": version.pk})  # fmt: skip
        for table in BIG_TABLES:
            cursor.execute(f"ANALYZE {table}")
    params = {**Limits(late_seconds=300, examples=10).params(), "lane": "io"}
    bounded = {
        "late_wakes": health_sql.LATE_WAKES, "lapsed_leases": health_sql.LAPSED_LEASES,
        "unsent_outbox": health_sql.UNSENT_OUTBOX, "oldest_ready": health_sql.OLDEST_READY,
        "pending_signals": health_sql.PENDING_SIGNALS,
        "overdue_timers": timers_sql.OVERDUE_TIMERS,
        "lapsed_in_flight": effects_sql.LAPSED_IN_FLIGHT,
    }  # fmt: skip
    for name, statement in bounded.items():
        scans, rows = read(statement, params)
        assert all(n["Node Type"] != "Seq Scan" for n in scans), (name, scans)
        assert rows <= 10, (name, rows)  # of tens of thousands of history rows
    # The run-level check reads the live runs' live steps (each by the partial indexes that
    # hold it), never the finished runs' steps.
    answers = [(prefix, answer.holds) for prefix, answer in sorted(WAIT_ANSWERS.items())]
    scans, _ = read(health_sql.stranded_runs(answers), params)
    steps = [n for n in scans if n["Relation Name"] == "workflows_step"]
    assert all(n["Node Type"] != "Seq Scan" for n in steps), steps
    assert rows_read(steps) <= 400, steps  # 100 live waits, of 20,100 steps


# --- under load -------------------------------------------------------------------------------

# Each run calls the provider stub (an effect), then forks: one branch waits on a timer, the
# other on a signal the harness sends; they join, and the run ends.
LOADED: dict = {
    "start": "call",
    "steps": [
        {"id": "call", "type": "http", "connection": "api", "next": "fork",
         "request": {"method": "POST", "url": "{{ input.api }}/items",
                     "body": {"n": "{{ input.n }}"}}},
        {"id": "fork", "type": "parallel", "branches": ["nap", "hear"], "next": "meet"},
        {"id": "nap", "type": "wait", "duration": "1s", "next": "meet"},
        {"id": "hear", "type": "wait_signal", "signal": "go",
         "correlation": "{{ run.id }}", "timeout": "10m", "next": "meet"},
        {"id": "meet", "type": "join", "wait_for": ["nap", "hear"], "next": "done"},
        {"id": "done", "type": "end"},
    ],
}  # fmt: skip
RUNS = 40
# Tighter than the default (300 s), so the timed invariants are looked at too, with room for a
# busy 2-core machine: nothing of a healthy engine is 30 s late.
LOAD_LATE = 30.0


class Watch:
    """The doctor in a thread of its own, again and again while the runs go on."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.reports: list[tuple[int, list[str]]] = []  # (live runs, what was not fine)
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                live = Run.objects.filter(status__in=("running", "paused")).count()
                report = run_checks(Limits(late_seconds=LOAD_LATE, examples=5), timeout_seconds=30)
                bad = [f"{f.label}: {f.summary} {f.examples}" for f in report.findings
                       if f.severity in (Severity.BROKEN, Severity.UNCHECKED)]  # fmt: skip
                self.reports.append((live, bad))
        finally:
            connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_healthy_engine_under_load_has_nothing_broken(harness: Harness):
    slug = harness.publish(LOADED)
    # The engine's processes may still be starting (seconds, on a busy machine), and an absent
    # relay or sweeper is what the doctor reports: first one run through, and its outbox
    # rows relayed, so every role is up.
    harness.wait_finished([harness.start(slug, {"api": harness.stubs.provider.url, "n": -1})])
    wait_for(lambda: not Outbox.objects.filter(sent_at=None).exists(), what="the relay")
    watch = Watch()
    watch.thread.start()
    try:
        runs = [
            harness.start(slug, {"api": harness.stubs.provider.url, "n": n}) for n in range(RUNS)
        ]
        finished = harness.wait_finished(runs)
    finally:
        watch.stop.set()
        watch.thread.join(timeout=120)
    assert {run.status for run in finished.values()} == {"succeeded"}
    assert watch.reports, "the doctor never ran"
    assert [bad for _, bad in watch.reports if bad] == []
    assert any(live for live, _ in watch.reports), "no report while runs were in flight"

    # After: `manage.py doctor` as a process, as cron runs it: exit 0 and JSON.
    done = subprocess.run(
        [sys.executable, "manage.py", "doctor", "--json", "--late-seconds", str(LOAD_LATE)],
        cwd=ROOT, env=engine_env(), capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == EXIT_HEALTHY, done.stdout.decode() + done.stderr.decode()
    report = json.loads(done.stdout)
    assert report["status"] == "ok" and report["broken"] == []
    # The engine is running: a sweeper leads.
    assert finding(report, "workflows.sweep_leader")["severity"] == "info"
