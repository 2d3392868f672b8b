"""Faults inside one process, with real connections: deadlocks, dropped connections, a walk
that raises, locked rows, a heartbeat cut off from the database."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now

from workflows.engine import sql
from workflows.engine import worker as worker_module
from workflows.engine.executors import StepResult
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim, claim_suspect, promote_due_retries, settle_success
from workflows.engine.transport import own_connection
from workflows.engine.worker import Attempt, Worker
from workflows.models import Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .factories import IO_DEFINITION, OrganisationFactory
from .processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def start_io_run(org, key: str = "k") -> int:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    return run_start(org=org, automation_slug="io", run_input={}, start_key=key).run_id


def lapse(step_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workflows_step SET lease_until = now() - interval '5 seconds' WHERE id = %s",
            [step_id],
        )


def test_a_claim_racing_a_settle_on_the_same_run_does_not_deadlock(org) -> None:
    # A's lease lapsed. B tries to claim the step while the run's lock is held as a settle
    # holds it (C, FOR NO KEY UPDATE), with A's settle queued behind it (A's one statement
    # locks the run, then the step). A claim that waited for the run's holder, while a
    # settle holding the run waited for B's step, was a deadlock. The claim takes a share
    # lock on the step's run with SKIP LOCKED (a run being changed, by a settle or a move
    # between versions, is not claimed from: its row may no longer match the claim's
    # snapshot), so B returns at once with nothing, and A's settle, when its turn comes,
    # goes through: no deadlock, and the step is not run twice.
    run_id = start_io_run(org)
    policy = lane_policy("io")
    (a,) = claim(policy=policy, worker="A", limit=1)
    lapse(a.id)
    results: dict[str, Any] = {}
    a_done = threading.Event()

    def settle_a() -> None:
        try:
            results["A"] = settle_success(a, StepResult(output={"by": "A"}), worker="A")
        except Exception as exc:
            results["A"] = exc
        finally:
            a_done.set()
            connection.close()

    with own_connection() as holder, own_connection() as watch:
        holder.execute("BEGIN")
        holder.execute(sql.LOCK_RUN, {"id": run_id})  # the engine's own lock of a run
        settler = threading.Thread(target=settle_a)
        settler.start()
        # A waits for the holder's transaction (a row lock's wait), on this test's database
        # (the suite's other process tests on a database of its own).
        waiting = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                   " AND wait_event_type = 'Lock' AND wait_event = 'transactionid'")  # fmt: skip
        for _ in range(3000):
            row = watch.execute(waiting).fetchone()
            if row and row[0]:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("A's settle never waited for the run's lock")
        try:
            with connection.cursor() as cursor:  # B never waits for a lock: no wait is short
                cursor.execute("SET lock_timeout = '5s'")
            results["B"] = [claim_suspect(policy=policy, worker="B")]
        finally:
            results["B_before_A"] = not a_done.is_set()
            holder.execute("COMMIT")
        settler.join(30)
    assert results["B"] == [None]  # the run was locked: nothing taken, no wait
    assert results["B_before_A"]  # B's claim returned while the run's lock was held
    assert results["A"] is True, results["A"]  # A's settle went through, no deadlock victim
    assert Run.objects.get(pk=run_id).status == "succeeded"  # its one io step, settled once


def test_a_settle_survives_a_dropped_connection(org) -> None:
    run_id = start_io_run(org)
    worker = Worker(lane_policy("io"), concurrency=1, name="w")
    (step,) = claim(policy=worker.policy, worker="w", limit=1)
    connection.ensure_connection()
    backend = connection.connection.info.backend_pid
    with own_connection() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [backend])
    worker._settle(step, lambda: settle_success(step, StepResult(output=1), worker="w"))
    assert Run.objects.get(pk=run_id).status == "succeeded"


class LockedSettle:
    """A worker's settle of a step, tried again and again in a thread of its own: each try
    meets lock_timeout (100 ms) while the test holds the run's lock."""

    def __init__(self, worker: Worker, step: Any) -> None:
        self.worker, self.step = worker, step
        self.tries: list[int] = []
        self.finished = threading.Event()
        self.outcome: dict[str, Any] = {}

    def write(self) -> object:
        self.tries.append(1)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '100ms'")
        return settle_success(self.step, StepResult(output=1), worker="w")

    def settle(self) -> None:
        try:
            self.outcome["settled"] = self.worker._settle(self.step, self.write)
        finally:
            self.finished.set()
            connection.close()


@contextmanager
def settle_behind_a_held_lock(worker: Worker, step: Any, run_id: int) -> Iterator[LockedSettle]:
    """The run locked as a stuck transaction would hold it while the worker settles; the
    lock goes when the block ends, and the settle's thread is then waited for."""
    locked = LockedSettle(worker, step)
    settler = threading.Thread(target=locked.settle)
    with own_connection() as holder:
        holder.execute("BEGIN")
        holder.execute(sql.LOCK_RUN, {"id": run_id})
        settler.start()
        try:
            yield locked
        finally:
            holder.execute("COMMIT")
    settler.join()


def test_a_settle_held_off_past_its_patience_gives_up_and_leaves_the_step_to_lapse(
    org, settings
) -> None:
    """WAYMARK_SETTLE_PATIENCE_SECONDS bounds how long a settle meeting transient errors is
    tried again: the run's row is held locked (as a stuck transaction would) and each try
    fails on lock_timeout. With 1 s of patience the worker gives up after a few tries and
    leaves the step running under its lease; the lock is released only after twenty tries,
    so a worker ignoring its patience would settle the step, and this test would fail."""
    settings.WAYMARK = {**settings.WAYMARK, "SETTLE_PATIENCE_SECONDS": 1.0}
    run_id = start_io_run(org)
    worker = Worker(lane_policy("io"), concurrency=1, name="w")
    (step,) = claim(policy=worker.policy, worker="w", limit=1)
    with settle_behind_a_held_lock(worker, step, run_id) as locked:
        wait_for(lambda: locked.finished.is_set() or len(locked.tries) >= 20)
    assert locked.outcome == {"settled": None}
    assert len(locked.tries) < 20  # gave up (a loaded machine may fit only one try in 1 s)
    left = Step.objects.get(pk=step.id)
    assert (left.status, left.owner, left.attempt) == ("running", "w", step.attempt)  # to lapse
    assert Run.objects.get(pk=run_id).status == "running"


def test_a_settle_being_retried_keeps_its_attempt_past_the_lanes_timeout(org) -> None:
    """The executor returned; its settle meets lock_timeout again and again past the lane's
    timeout (0.5 s here). The attempt is not timed out meanwhile (its heartbeat goes on, and
    it is not counted as a hung executor), and the settle goes through once the lock goes."""
    run_id = start_io_run(org)
    worker = Worker(replace(lane_policy("io"), timeout_seconds=0.5), concurrency=1, name="w")
    (step,) = claim(policy=worker.policy, worker="w", limit=1)
    now = time.monotonic()
    attempt = Attempt(step, deadline=now + 0.5, extended=now)
    worker.inflight[attempt.key] = attempt
    with settle_behind_a_held_lock(worker, step, run_id) as locked:
        wait_for(lambda: time.monotonic() > now + 1.0 and len(locked.tries) >= 2)
        worker._time_out_attempts()  # the heartbeat thread's check, past the lane's timeout
        timed_out = attempt.timed_out
    assert not timed_out
    assert locked.outcome["settled"] is True
    assert Run.objects.get(pk=run_id).status == "succeeded"


def test_a_step_kept_waiting_by_the_database_is_deferred_without_spending_an_attempt(
    org, caplog
) -> None:
    """A step's own statement meets lock_timeout (the run's row held by a slow transaction,
    as on a loaded machine): not the step's fault. The attempt is deferred
    (`database_busy: ...`) without counting and without a traceback; once the lock goes, the
    step runs again and succeeds, its one counted attempt spent."""
    work = {"id": "work", "type": "probe", "lock_wait_attempts": 1, "next": "done"}
    definition = {"start": "work", "steps": [work, {"id": "done", "type": "end"}]}
    automation_publish_definition(org=org, slug="probe", definition=definition)
    run_id = run_start(org=org, automation_slug="probe", run_input={}, start_key="k").run_id
    worker = Worker(lane_policy("io"), concurrency=1, name="w")
    (step,) = claim(policy=worker.policy, worker="w", limit=1)
    now = time.monotonic()
    with own_connection() as holder:
        holder.execute("BEGIN")
        holder.execute(sql.LOCK_RUN, {"id": run_id})
        worker._execute_attempt(Attempt(step, deadline=now + 60, extended=now))
        holder.execute("COMMIT")
    deferred = RunEvent.objects.get(run_id=run_id, kind="step.deferred").detail
    assert deferred and deferred["error"] == "database_busy: OperationalError", deferred
    assert not RunEvent.objects.filter(run_id=run_id, kind="step.retry_scheduled").exists()
    assert not [r for r in caplog.records if r.exc_info], "no traceback for the database's wait"
    Step.objects.filter(pk=step.id).update(wake_at=Now())  # its 1 s deferral, passed
    assert promote_due_retries(lane="io", worker="w") == 1
    (again,) = claim(policy=worker.policy, worker="w", limit=1)
    assert again.id == step.id
    worker._execute_attempt(Attempt(again, deadline=now + 60, extended=now))
    assert Run.objects.get(pk=run_id).status == "succeeded"
    counted = Step.objects.get(pk=step.id)
    assert counted.attempt - counted.release_count - counted.series_offset == 1
    assert counted.error == ""  # the deferral's reason is in its event, not on the done step


def test_a_walk_that_raises_while_the_database_is_away_is_retried_not_failed(org, caplog) -> None:
    """A settle meets an error that is not a database error (as the embedded server's wheel
    raised AssertionError while the server restarted) while the database does not answer:
    the outage's, not the walk's. The settle is tried again once the database answers, and
    the run succeeds; it is never failed with engine_error, and no traceback is written."""
    run_id = start_io_run(org)
    worker = Worker(lane_policy("io"), concurrency=1, name="w")
    (step,) = claim(policy=worker.policy, worker="w", limit=1)
    tries: list[int] = []
    name = connection.settings_dict["NAME"]

    def walk_during_a_restart() -> object:
        tries.append(1)
        if len(tries) == 1:
            # The server goes away under the settle: new connections fail (they name a
            # database that does not exist; the embedded backend creates no test_ database).
            connection.settings_dict["NAME"] = "test_gone_away"
            raise AssertionError("assert self._postmaster_info.status == 'ready'")
        connection.settings_dict["NAME"] = name  # back
        return settle_success(step, StepResult(output={"ok": True}), worker="w")

    try:
        settled = worker._settle(step, walk_during_a_restart)
    finally:
        connection.settings_dict["NAME"] = name
    assert settled is True and len(tries) == 2
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("succeeded", "")
    assert not RunEvent.objects.filter(run_id=run_id, kind="step.failed").exists()
    assert not [r for r in caplog.records if r.exc_info], "no traceback for the outage"


def test_a_walk_that_raises_fails_the_step_and_run_instead_of_rerunning(org) -> None:
    run_id = start_io_run(org)
    worker = Worker(lane_policy("io"), concurrency=1, name="w")
    (step,) = claim(policy=worker.policy, worker="w", limit=1)

    def broken_walk() -> bool:
        raise ValueError("an engine bug")

    worker._settle(step, broken_walk)
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("failed", "engine_error: ValueError: an engine bug")
    assert Step.objects.get(pk=step.id).status == "failed"
    assert list(
        RunEvent.objects.filter(run_id=run_id).values_list("kind", flat=True).order_by("id")
    )[-2:] == ["step.failed", "run.failed"]


def test_a_claim_for_one_slot_is_not_stuck_behind_a_locked_organisation(org) -> None:
    first, second = org, OrganisationFactory.create()
    start_io_run(first)
    start_io_run(second)
    locked = Step.objects.get(org=first)
    with own_connection(autocommit=False) as other:
        # Another claimer (or a stalled settle) holds the first organisation's only row.
        other.execute("SELECT id FROM workflows_step WHERE id = %s FOR UPDATE", [locked.pk])
        batch = claim(policy=lane_policy("io"), worker="w", limit=1, after_org=0)
        other.rollback()
    assert [step.org_id for step in batch] == [second.pk]


def test_a_worker_cut_off_from_the_database_gives_up_its_leases(org) -> None:
    worker = Worker(lane_policy("io"), concurrency=1, name="w")
    run_id = start_io_run(org)
    (step,) = claim(policy=worker.policy, worker="w", limit=1)
    now = time.monotonic()
    stale = Attempt(step, deadline=now + 60, extended=now - worker.policy.lease_seconds)
    fresh = Attempt(replace(step, attempt=2), deadline=now + 60, extended=now)
    worker.inflight = {stale.key: stale, fresh.key: fresh}
    worker._give_up_stale_leases()
    assert stale.lost.is_set(), run_id
    assert not fresh.lost.is_set()


def test_a_step_of_a_run_past_its_max_age_is_not_executed(org) -> None:
    run_id = start_io_run(org)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workflows_run SET deadline_at = now() - interval '1 second' WHERE id = %s",
            [run_id],
        )
    worker = Worker(lane_policy("io"), concurrency=1, name="w")
    (step,) = claim(policy=worker.policy, worker="w", limit=1)
    assert step.run_expired
    worker._execute(Attempt(step, deadline=time.monotonic() + 60, extended=time.monotonic()))
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"
    assert run.error.startswith("max_age_exceeded")
    assert Step.objects.get(pk=step.id).error.startswith("max_age_exceeded")


def test_every_connection_is_bounded_by_statement_lock_and_idle_transaction_timeouts(db) -> None:
    # A half-open settle connection must not keep its step's row locked for hours, nor a
    # statement wait for a row lock longer than the lock timeout.
    expected = {
        "statement_timeout": "1min",
        "idle_in_transaction_session_timeout": "1min",
        "lock_timeout": "20s",
    }
    with connection.cursor() as cursor:
        for name, value in expected.items():
            cursor.execute(f"SHOW {name}")
            assert cursor.fetchone()[0] == value, name
    with own_connection() as heartbeat_connection:  # the worker's own connections too
        for name, value in expected.items():
            row = heartbeat_connection.execute(f"SHOW {name}").fetchone()
            assert row is not None and row[0] == value, name
        # Over TCP, a statement sent into a black-holed route fails within a minute.
        assert "tcp_user_timeout=60000" in heartbeat_connection.info.dsn.split()
    connection.ensure_connection()
    assert "tcp_user_timeout=60000" in connection.connection.info.dsn.split()


def other_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_an_idle_slot_gives_its_database_connection_back(org, monkeypatch) -> None:
    """A slot that ran a step keeps its connection while busy, and gives it back once idle:
    idle slots holding connections let three hosts exhaust max_connections 100 and stall,
    the one settle needing a connection unable to get one
    (docs/how-to/scale-to-several-hosts.md)."""
    monkeypatch.setattr(worker_module, "IDLE_CONNECTION_SECONDS", 0.5)
    worker = Worker(lane_policy("io"), concurrency=1, name="w")
    run_id = start_io_run(org)
    before = other_connections()
    slot = threading.Thread(target=worker._execute_loop, daemon=True)
    slot.start()
    (step,) = claim(policy=worker.policy, worker="w", limit=1)
    attempt = Attempt(step, deadline=time.monotonic() + 60, extended=time.monotonic())
    worker.inflight[attempt.key] = attempt
    worker.tasks.put(attempt)  # run and settled on the slot's own connection
    wait_for(lambda: Run.objects.get(pk=run_id).status == "succeeded", what="the run")
    wait_for(lambda: other_connections() == before, what="the idle slot's connection to close")
    worker.halt.set()
    worker.tasks.put(None)
    slot.join(timeout=30)
    assert not slot.is_alive()
