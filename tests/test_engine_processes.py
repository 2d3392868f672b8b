"""Crash, fencing and hand-over proofs with real worker and relay processes.

Each test starts `manage.py worker` / `manage.py relay` subprocesses against the test
database and kills or stops them at the moment that matters. Leases are short (seconds) so
the tests run quickly; every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from functools import partial

import pytest
from django.db import connection

from workflows.models import IdleWorker, Outbox, Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .processes import ROOT, engine_env, spawn_relay, spawn_worker, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def probe_definition(*, max_attempts: int | None = None, **probe: object) -> dict:
    work: dict = {"id": "work", "type": "probe", **probe, "next": "done"}
    if max_attempts is not None:
        work["retry"] = {"max_attempts": max_attempts}
    return {
        "start": "work",
        "steps": [work, {"id": "done", "type": "end", "output": "{{ steps.work.output.pid }}"}],
    }


def start(org, definition: dict, key: str = "k1") -> int:
    automation_publish_definition(org=org, slug="probe", definition=definition)
    return run_start(org=org, automation_slug="probe", run_input={}, start_key=key).run_id


def step_row(run_id: int) -> Step:
    return Step.objects.get(run_id=run_id, step_id="work")


def finished(run_id: int) -> Run | None:
    run = Run.objects.get(pk=run_id)
    return run if run.status != "running" else None


def claimed_by(run_id: int, pid: int, attempt: int) -> bool:
    step = step_row(run_id)
    return step.status == "running" and step.attempt == attempt and f":{pid}:" in (step.owner or "")


def kinds(run_id: int, kind: str) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id, kind=kind).order_by("id"))


def test_expired_lease_cannot_settle_and_newer_attempt_stands(org, procs) -> None:
    run_id = start(org, probe_definition(sleep_seconds=4))
    # A stops heartbeating (as in a long pause) while its step takes longer than the lease.
    # One slot, so A cannot re-claim the step itself once its lease lapses.
    a = spawn_worker(
        concurrency=1, WAYMARK_PAUSE_HEARTBEATS="forever", WAYMARK_IO_LEASE_SECONDS="1"
    )
    procs.append(a)
    wait_for(lambda: claimed_by(run_id, a.pid, 1), what="worker A to claim")
    b = spawn_worker(WAYMARK_IO_LEASE_SECONDS="1")
    procs.append(b)
    wait_for(lambda: claimed_by(run_id, b.pid, 2), timeout=15, what="B to take over")
    run = wait_for(lambda: finished(run_id), timeout=20, what="the run to end")
    # A woke up after 4 s, long after losing its lease: its settle was refused.
    assert a.poll() is None, "worker A must survive a refused settle"
    assert run.status == "succeeded"
    assert run.output == str(b.pid)
    step = step_row(run_id)
    assert step.output is not None
    assert (step.status, step.attempt, step.output["pid"]) == ("done", 2, b.pid)
    assert [e.attempt for e in kinds(run_id, "step.succeeded") if e.step_id == "work"] == [2]
    assert len(kinds(run_id, "run.succeeded")) == 1


def test_heartbeats_keep_a_slow_step_with_its_worker(org, procs) -> None:
    run_id = start(org, probe_definition(sleep_seconds=3))
    a = spawn_worker(WAYMARK_IO_LEASE_SECONDS="1")
    procs.append(a)
    wait_for(lambda: claimed_by(run_id, a.pid, 1), what="worker A to claim")
    b = spawn_worker(WAYMARK_IO_LEASE_SECONDS="1")
    procs.append(b)
    run = wait_for(lambda: finished(run_id), timeout=20, what="the run to end")
    assert run.status == "succeeded"
    assert (step_row(run_id).attempt, run.output) == (1, str(a.pid))


def test_sigkilled_worker_is_replaced_after_its_lease_lapses(org, procs) -> None:
    run_id = start(org, probe_definition(sleep_seconds=3, sleep_attempts=1))
    a = spawn_worker(WAYMARK_IO_LEASE_SECONDS="1")
    procs.append(a)
    wait_for(lambda: claimed_by(run_id, a.pid, 1), what="worker A to claim")
    assert stop(a, signal.SIGKILL) == -signal.SIGKILL
    b = spawn_worker(WAYMARK_IO_LEASE_SECONDS="1")
    procs.append(b)
    run = wait_for(lambda: finished(run_id), timeout=20, what="B to finish the run")
    assert run.status == "succeeded"
    assert run.output == str(b.pid)
    assert step_row(run_id).attempt == 2
    assert not kinds(run_id, "step.released")  # nobody handed it back: the lease lapsed


def test_sigtermed_worker_hands_its_step_over_at_once(org, procs) -> None:
    # A 60 s lease: without the hand-back, B would wait a minute.
    run_id = start(org, probe_definition(sleep_seconds=30, sleep_attempts=1))
    a = spawn_worker(grace=0.5, WAYMARK_IO_LEASE_SECONDS="60")
    procs.append(a)
    wait_for(lambda: claimed_by(run_id, a.pid, 1), what="worker A to claim")
    b = spawn_worker(WAYMARK_IO_LEASE_SECONDS="60")
    procs.append(b)
    time.sleep(1.0)  # B is up and idle
    stopped_at = time.monotonic()
    assert stop(a, signal.SIGTERM) == 0
    run = wait_for(lambda: finished(run_id), timeout=15, what="B to finish the run")
    assert time.monotonic() - stopped_at < 15
    assert (run.status, run.output) == ("succeeded", str(b.pid))
    released = kinds(run_id, "step.released")
    assert [(e.attempt, f":{a.pid}:" in e.worker) for e in released] == [(1, True)]
    step = step_row(run_id)
    assert (step.attempt, step.release_count) == (2, 1)


def test_poison_step_is_stopped_after_its_attempts(org, procs) -> None:
    run_id = start(org, probe_definition(crash_attempts=99, max_attempts=2))
    exits = []
    for _ in range(4):
        worker = spawn_worker(WAYMARK_IO_LEASE_SECONDS="1")
        procs.append(worker)

        def crashed_or_finished(w: subprocess.Popen[bytes] = worker) -> bool | Run | None:
            return w.poll() is not None or finished(run_id)

        ended = wait_for(crashed_or_finished, timeout=20, what="a crash")
        if isinstance(ended, Run):
            break
        exits.append(worker.returncode)
    assert exits == [137, 137]  # each attempt killed its worker...
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"  # ...and the third claim failed the step instead
    assert "attempts exhausted" in run.error
    step = step_row(run_id)
    assert (step.status, step.attempt) == ("failed", 3)


def test_failed_attempts_are_retried_with_backoff(org, procs) -> None:
    run_id = start(org, probe_definition(fail_attempts=2, max_attempts=3))
    procs.append(spawn_worker())
    run = wait_for(lambda: finished(run_id), timeout=20, what="the run to end")
    assert run.status == "succeeded"
    assert step_row(run_id).attempt == 3
    assert [e.attempt for e in kinds(run_id, "step.retry_scheduled")] == [1, 2]


def test_worker_claims_no_more_than_its_free_slots(org, procs) -> None:
    automation_publish_definition(
        org=org, slug="probe", definition=probe_definition(sleep_seconds=0.5)
    )
    run_ids = [
        run_start(org=org, automation_slug="probe", run_input={"n": i}, start_key=f"k{i}").run_id
        for i in range(12)
    ]
    worker = spawn_worker(concurrency=3)
    procs.append(worker)
    most = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        held = Step.objects.filter(status="running", owner__contains=f":{worker.pid}:").count()
        most = max(most, held)
        if not Run.objects.filter(pk__in=run_ids, status="running").exists():
            break
        time.sleep(0.02)
    assert Run.objects.filter(pk__in=run_ids, status="succeeded").count() == 12
    assert 1 <= most <= 3


def _start_and_crash_after_commit(org_slug: str) -> subprocess.CompletedProcess:
    code = (
        "from workflows.models import Organisation\n"
        "from workflows.services.runs import run_start\n"
        f"org = Organisation.objects.get(slug={org_slug!r})\n"
        "run_start(org=org, automation_slug='probe', run_input={}, start_key='crashy')\n"
        "print('survived')\n"
    )
    return subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=engine_env(WAYMARK_CRASH_AT="run_start.after_commit"),
        capture_output=True,
        timeout=60,
    )


def _listening(lane: str) -> bool:
    """A connection to *this* test database LISTENs on the lane (another instance's worker,
    on another database, does not count)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query = %s",
            [f"LISTEN waymark_lane_{lane}"],
        )
        (count,) = cursor.fetchone()
        return bool(count > 0)


def _claimed_and_idle() -> bool:
    """A connection to this database ran a claim and is idle: the worker is past its first
    claims and sleeps until woken (or its poll)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND state = 'idle' AND (query LIKE %s OR query LIKE %s)",
            ["%WITH RECURSIVE ahead%", "%WITH picked AS%"],  # a claim, or a suspect's claim
        )
        (count,) = cursor.fetchone()
        return bool(count > 0)


def test_process_killed_after_start_commit_is_still_woken_by_the_relay(org, procs) -> None:
    automation_publish_definition(org=org, slug="probe", definition=probe_definition())
    # The worker polls only every 600 s: a finish proves the relay's wake-up reached it.
    worker = spawn_worker(WAYMARK_WORKER_POLL_SECONDS="600")
    procs.append(worker)
    wait_for(lambda: _listening("io"), what="the worker to LISTEN")
    wait_for(_claimed_and_idle, what="the worker's first (empty) claim")
    # Unlisted as idle (as a busy worker is), the start's own notification does not reach it.
    wait_for(lambda: IdleWorker.objects.filter(lane="io").delete()[0], what="an idle listing")

    crashed = _start_and_crash_after_commit(org.slug)
    assert crashed.returncode == 137 and b"survived" not in crashed.stdout
    run = Run.objects.get(org=org, start_key="crashy")
    assert Outbox.objects.filter(sent_at=None).count() == 1

    procs.append(spawn_relay())
    done = wait_for(lambda: finished(run.pk), timeout=120, what="the relay to wake the worker")
    assert done.status == "succeeded"
    assert not Outbox.objects.filter(sent_at=None).exists()


def test_relay_killed_after_publish_duplicates_do_no_harm(org, procs) -> None:
    run_id = start(org, probe_definition())
    procs.append(spawn_worker())
    crashing = spawn_relay(WAYMARK_CRASH_AT="relay.after_publish")
    assert crashing.wait(timeout=30) == 137
    row = Outbox.objects.get()
    assert row.sent_at is None  # published, never marked sent

    procs.append(spawn_relay())  # publishes the same outbox id again
    wait_for(lambda: Outbox.objects.filter(pk=row.pk, sent_at__isnull=False).exists(),
             what="the second relay to mark the row sent")  # fmt: skip
    run = wait_for(lambda: finished(run_id), timeout=20, what="the run to end")
    assert run.status == "succeeded"
    assert Step.objects.filter(run_id=run_id, step_id="work").count() == 1
    assert step_row(run_id).attempt == 1
    assert len(kinds(run_id, "run.succeeded")) == 1


def test_worker_that_lost_a_lease_stops_the_step_and_frees_its_slot(org, procs) -> None:
    # A's heartbeats stall for its first 6 s (lease 1 s), so B takes the 120 s step over.
    # When A's heartbeats resume they find the lease lost: A stops the step at once and, with
    # its one slot free again, runs the next step. Had it waited its step out, the next step
    # would not finish before the wait below gives up. Waits are for events, with room for a
    # loaded machine.
    automation_publish_definition(
        org=org, slug="probe", definition=probe_definition(sleep_seconds=120, sleep_attempts=1)
    )
    automation_publish_definition(org=org, slug="quick", definition=probe_definition())
    first = run_start(org=org, automation_slug="probe", run_input={}, start_key="first").run_id
    a = spawn_worker(concurrency=1, WAYMARK_PAUSE_HEARTBEATS="6", WAYMARK_IO_LEASE_SECONDS="1")
    procs.append(a)
    wait_for(lambda: claimed_by(first, a.pid, 1), what="worker A to claim")
    b = spawn_worker(concurrency=1, WAYMARK_IO_LEASE_SECONDS="1")
    procs.append(b)
    # B's attempt (2) does not sleep: it finishes the first run right away. Then B leaves.
    done = wait_for(lambda: finished(first), timeout=90, what="B to take over")
    assert done.output == str(b.pid)
    assert stop(b) == 0
    second = run_start(org=org, automation_slug="quick", run_input={}, start_key="second")
    run = wait_for(lambda: finished(second.run_id), timeout=90, what="A to run the next step")
    assert run.output == str(a.pid)  # A's 120 s step was stopped, not waited out


def test_an_attempt_past_its_timeout_is_stopped_and_retried(org, procs) -> None:
    run_id = start(org, probe_definition(sleep_seconds=120, sleep_attempts=1, max_attempts=3))
    procs.append(spawn_worker(WAYMARK_IO_TIMEOUT_SECONDS="1.5", WAYMARK_IO_LEASE_SECONDS="1"))
    # Within the wait only if the 120 s attempt was cut off at its 1.5 s timeout.
    run = wait_for(lambda: finished(run_id), timeout=90, what="the retried attempt to finish")
    assert run.status == "succeeded"
    assert step_row(run_id).attempt == 2
    retries = kinds(run_id, "step.retry_scheduled")
    errors = [(e.attempt, (e.detail or {}).get("error")) for e in retries]
    assert errors == [(1, "timed out after 1.5 s")]


def listed_idle(pid: int) -> bool:
    return IdleWorker.objects.filter(worker__contains=f":{pid}:").exists()


def test_a_worker_process_yields_the_cpu_to_the_processes_that_start_runs(org, procs) -> None:
    """WAYMARK_WORKER_NICE (default 10): a worker runs at a lower CPU priority than its
    parent (runengine, or here this test), so on busy cores the web and API processes that
    start runs come first (docs/how-to/benchmarks.md, "Speed, side by side"); 0 leaves it as is."""
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    default, level = spawn_worker(), spawn_worker(WAYMARK_WORKER_NICE="0")
    procs.extend([default, level])
    for worker in (default, level):  # listed idle: past its start-up, nice already applied
        wait_for(partial(listed_idle, worker.pid), what=f"worker {worker.pid} listed idle")
    assert os.getpriority(os.PRIO_PROCESS, default.pid) == min(ours + 10, 19)
    assert os.getpriority(os.PRIO_PROCESS, level.pid) == ours


def without_the_right_to_raise_priority() -> None:
    """In the child before exec: no CAP_SYS_NICE after exec (dropped from the bounding set,
    which root may do; others never had it) and no RLIMIT_NICE head-room, as for an ordinary
    user."""
    import ctypes
    import resource

    pr_capbset_drop, cap_sys_nice = 24, 23
    ctypes.CDLL(None, use_errno=True).prctl(pr_capbset_drop, cap_sys_nice, 0, 0, 0)
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))


def test_a_negative_worker_nice_that_may_not_be_applied_stops_the_worker_with_a_clear_error(
    org,
) -> None:
    """Raising a worker's priority needs root or CAP_SYS_NICE. Without them the worker says
    so with a stable code and exits with EXIT_CONFIG (78), so runengine's supervisor stops
    with the reason instead of restarting a worker that can never start."""
    from workflows.engine.supervisor import EXIT_CONFIG

    worker = subprocess.Popen(
        [sys.executable, "manage.py", "worker", "--lane", "io"],
        cwd=ROOT,
        env=engine_env(WAYMARK_WORKER_NICE="-5"),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=without_the_right_to_raise_priority,
    )
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == EXIT_CONFIG, err
    assert "invalid_worker_nice: WAYMARK_WORKER_NICE=-5" in err
    assert "Traceback" not in err
