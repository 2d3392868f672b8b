"""An idle worker is woken by the transaction that makes its work, not by the relay's next
batch; a busy lane's writers notify nobody (a NOTIFY serialises commits)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from workflows.engine.lanes import lane_policy
from workflows.engine.transport import channel_for, own_connection
from workflows.engine.worker import Worker
from workflows.models import IdleWorker, Outbox, Run
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .factories import IO_DEFINITION
from .processes import running, spawn_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def start_io_run(org, key: str) -> int:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    return run_start(org=org, automation_slug="io", run_input={}, start_key=key).run_id


def listening(lane: str = "io") -> psycopg.Connection:
    conn = own_connection()
    conn.execute(f"LISTEN {channel_for(lane)}")
    return conn


def first_notification(conn: psycopg.Connection) -> str:
    for notify in conn.notifies(timeout=30, stop_after=1):
        return notify.payload
    raise AssertionError("no notification within 30 s")


def marker(lane: str = "io") -> None:
    """A notification sent after the writes under test: notifications arrive in commit
    order, so if this one comes first, the writes sent none."""
    with own_connection() as conn:
        conn.execute("SELECT pg_notify(%s, 'marker')", [channel_for(lane)])


def test_a_start_notifies_a_lane_with_an_idle_worker_and_not_a_busy_one(org) -> None:
    worker = Worker(lane_policy("io"), concurrency=1, name="idle-w")
    with listening() as conn:
        assert worker._list_idle() is True  # newly listed: the claim loop claims once more
        assert worker._list_idle() is False  # listed already, refreshed at most once a poll
        assert IdleWorker.objects.get(worker="idle-w").lane == "io"
        start_io_run(org, "while-idle")
        assert first_notification(conn) == ""  # the start's own, not the relay's

        worker._strike_off_idle()
        assert not IdleWorker.objects.filter(worker="idle-w").exists()
        start_io_run(org, "while-busy")
        marker()
        assert first_notification(conn) == "marker"
    worker.claims.close()
    assert Outbox.objects.filter(sent_at=None).count() == 2  # the relay still has both


def test_a_dead_workers_listing_lapses(org) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO workflows_idleworker (worker, lane, idle_until)"
            " VALUES ('gone', 'io', now() - interval '1 second')"
        )
    with listening() as conn:
        start_io_run(org, "stale")
        marker()
        assert first_notification(conn) == "marker"


def test_another_lanes_idle_worker_is_not_notified(org) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO workflows_idleworker (worker, lane, idle_until)"
            " VALUES ('slow-w', 'slow', now() + interval '1 minute')"
        )
    with listening("slow") as conn:
        start_io_run(org, "io-only")
        marker("slow")
        assert first_notification(conn) == "marker"


def test_an_idle_worker_runs_a_new_run_without_a_relay_or_a_poll(org) -> None:
    # No relay, and a poll interval far longer than the wait below: only the start's own
    # notification can bring the worker to the run in time.
    worker = spawn_worker(concurrency=2, WAYMARK_WORKER_POLL_SECONDS="300")
    with running(worker):
        wait_for(lambda: IdleWorker.objects.filter(lane="io").exists(), what="an idle listing")
        run_id = start_io_run(org, "woken")
        run = wait_for(
            lambda: Run.objects.filter(pk=run_id, status="succeeded").first(),
            timeout=120,
            what="the run to finish",
        )
        assert run.status == "succeeded"
        assert Outbox.objects.filter(sent_at=None).count() == 1  # nobody relayed it
