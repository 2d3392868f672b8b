"""A process whose clock is ten minutes off neither takes leases early nor fires timers early
(nor, ten minutes behind, late): the database's clock rules every lease, timer and deadline.

The skewed process is a real engine process (``manage.py worker`` / ``manage.py sweep``) run
under libfaketime (``LD_PRELOAD``, ``FAKETIME="+10m"`` or ``"-10m"``): its wall clock
(``time.time()``, ``datetime.now()``) is ten minutes off, as on a machine whose clock drifted.
Only that child is skewed; the PostgreSQL server and this test keep the machine's clock.
``FAKETIME_DONT_FAKE_MONOTONIC`` keeps its monotonic clock true, as a drifted machine's is
(libfaketime would otherwise shift it as well), so its local budgets (heartbeat intervals,
poll sleeps) run as they do anywhere.

Each test first shows the child really is skewed (libfaketime mapped into it, and a Python
started with the same environment reads a clock ten minutes off the database's), then that it
works (it claims and finishes steps, it fires due timers), so nothing here can pass because
the skewed process was dead or not skewed. Every wait is for an event; the one "not early"
check compares the database's own times (the firing's ``clock_timestamp()`` with the timer's
``due_at``; the take-over's ``now()`` with the last lease), so a decision taken on the
process's clock fails it: ahead, the timer fires ten minutes early and the lease is taken
while its holder heartbeats; behind, the due timer and the lapsed lease wait ten minutes,
past every bound here.

libfaketime is the distribution's ``faketime`` package (``./waymark test`` installs it);
``WAYMARK_FAKETIME_LIB`` names the library elsewhere.
"""

from __future__ import annotations

import email.utils
import glob
import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pytest
from django.db import connection

from timers.models import Timer
from workflows.models import IdleWorker, Run, RunEvent, Step, SweepLease
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start
from workflows.services.tenancy import api_key_create

from .processes import ROOT, engine_env, spawn, spawn_worker, stop, wait_for

pytestmark = [pytest.mark.long_running, pytest.mark.django_db(transaction=True)]

SKEW_SECONDS = 600.0
# How far the child's clock may be from the skew asked for: a process start and two queries
# on a loaded machine, and the machine's own clock against the database server's (the same
# machine here).
SKEW_TOLERANCE_SECONDS = 30.0
LIBRARY_GLOBS = (
    "/usr/lib/*/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/lib64/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)
INSTALL = "apt-get install faketime (or set WAYMARK_FAKETIME_LIB to libfaketime.so.1)"
# A lease a heartbeat every third of it keeps on a loaded machine: ten minutes of skew is
# two hundred of them.
LEASE_SECONDS = "3"


def faketime_library() -> str:
    """libfaketime's path; a missing library fails the test, saying how to install it."""
    given = os.environ.get("WAYMARK_FAKETIME_LIB", "")
    found = [given] if given else [path for pattern in LIBRARY_GLOBS for path in glob.glob(pattern)]
    for path in found:
        if Path(path).is_file():
            return path
    pytest.fail(f"libfaketime is not installed: {INSTALL}", pytrace=False)


@pytest.fixture(params=[+SKEW_SECONDS, -SKEW_SECONDS], ids=["ahead", "behind"])
def skew(request: pytest.FixtureRequest) -> dict[str, str]:
    """The environment that puts a child's clock ten minutes ahead of (or behind) the
    database's, checked on a Python started with it."""
    seconds: float = request.param
    env = {
        "LD_PRELOAD": faketime_library(),
        "FAKETIME": f"{seconds / 60:+.0f}m",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    before = database_clock()
    child = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env=engine_env(**env), capture_output=True, check=True, text=True,
    )  # fmt: skip
    after = database_clock()
    measured = float(child.stdout)
    assert before + seconds - SKEW_TOLERANCE_SECONDS <= measured
    assert measured <= after + seconds + SKEW_TOLERANCE_SECONDS
    return env


def database_clock() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")
        (now,) = cursor.fetchone()
    return float(now)


def assert_under_faketime(pid: int) -> None:
    """libfaketime is loaded into this very process (it maps the library at start)."""
    maps = Path(f"/proc/{pid}/maps")
    wait_for(lambda: "libfaketime" in maps.read_text(), what=f"libfaketime in process {pid}")


def start(org, slug: str, definition: dict, key: str) -> int:
    automation_publish_definition(org=org, slug=slug, definition=definition)
    return run_start(org=org, automation_slug=slug, run_input={}, start_key=key).run_id


def finished(run_id: int) -> Run | None:
    run = Run.objects.get(pk=run_id)
    return run if run.status not in ("running", "paused") else None


# --- leases -----------------------------------------------------------------------------------


def probe(**fields: object) -> dict:
    return {
        "start": "work",
        "steps": [
            {"id": "work", "type": "probe", **fields, "next": "done"},
            {"id": "done", "type": "end", "output": "{{ steps.work.output.pid }}"},
        ],
    }


def work_step(run_id: int) -> Step:
    return Step.objects.get(run_id=run_id, step_id="work")


def held_by(run_id: int, pid: int, attempt: int) -> bool:
    step = work_step(run_id)
    return step.status == "running" and step.attempt == attempt and f":{pid}:" in (step.owner or "")


def listed_idle(pid: int) -> bool:
    """The worker went round its loop with nothing to do: it claimed nothing, looked for
    steps whose lease lapsed (its first idle round always looks), found none, and listed
    itself idle (a claim strikes it off again)."""
    return IdleWorker.objects.filter(worker__contains=f":{pid}:").exists()


def test_a_skewed_worker_takes_a_lease_only_once_the_database_says_it_lapsed(org, procs, skew):
    # A, on the true clock, holds a long step and heartbeats (a lease of 3 s, extended every
    # second). One slot: what else comes is the skewed worker's.
    long_run = start(org, "long", probe(sleep_seconds=120, sleep_attempts=1), key="long")
    a = spawn_worker(concurrency=1, WAYMARK_IO_LEASE_SECONDS=LEASE_SECONDS)
    procs.append(a)
    wait_for(lambda: held_by(long_run, a.pid, 1), what="worker A to claim the long step")
    b = spawn_worker(concurrency=1, WAYMARK_IO_LEASE_SECONDS=LEASE_SECONDS, **skew)
    procs.append(b)
    assert_under_faketime(b.pid)
    # B looks for lapsed leases when idle: its first idle round did, while A held the step.
    wait_for(lambda: listed_idle(b.pid), what="the skewed worker to go idle")
    # B works: it claims and finishes an ordinary step, with its clock ten minutes off.
    short_run = start(org, "short", probe(clock=True), key="short")
    run = wait_for(lambda: finished(short_run), what="the skewed worker to finish a step")
    assert (run.status, run.output) == ("succeeded", str(b.pid))
    short = work_step(short_run)
    assert short.output is not None and short.finished_at is not None
    off = short.output["clock"] - short.finished_at.timestamp()
    assert abs(off - float(skew["FAKETIME"][:-1]) * 60) < SKEW_TOLERANCE_SECONDS, off
    wait_for(lambda: listed_idle(b.pid), what="the skewed worker to look again")
    # All that while, A kept its step: ahead, B's clock had A's lease lapsed ten minutes ago.
    assert held_by(long_run, a.pid, 1)
    # A dies: its lease lapses on the database's clock, and only then does B take the step.
    assert stop(a, signal.SIGKILL) == -signal.SIGKILL
    last_lease = work_step(long_run).lease_until
    assert last_lease is not None
    # Behind, a B deciding on its own clock would wait ten minutes more: past this bound.
    wait_for(lambda: held_by(long_run, b.pid, 2) or finished(long_run), what="B to take over")
    taken = RunEvent.objects.get(run_id=long_run, kind="step.claimed", attempt=2)
    assert taken.at >= last_lease
    assert f":{b.pid}:" in taken.worker
    run = wait_for(lambda: finished(long_run), what="the long run to end")
    assert (run.status, run.output) == ("succeeded", str(b.pid))


# --- timers and the sweeper's lease -----------------------------------------------------------


def sweeper(**env: str) -> subprocess.Popen[bytes]:
    return spawn("sweep", WAYMARK_SWEEP_SECONDS="0.3", **env)


def sweep_holder() -> str:
    lease = SweepLease.objects.filter(name="sweep").first()
    return lease.holder if lease is not None else ""


def lease_tries() -> int:
    """Sweeper connections whose last statement, finished (idle: committed), took or tried
    to take the sweep's lease: one per sweeper once it has tried, leader or not."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'waymark-sweep' AND state = 'idle'"
            " AND query LIKE '%%INSERT INTO workflows_sweeplease%%'"
        )
        (count,) = cursor.fetchone()
    return int(count)


def waits(duration: str) -> dict:
    return {
        "start": "pause",
        "steps": [
            {"id": "pause", "type": "wait", "duration": duration, "next": "done"},
            {"id": "done", "type": "end"},
        ],
    }


def fired(run_id: int) -> Timer | None:
    timer = Timer.objects.get(run_id=run_id)
    return timer if timer.fired_at is not None else None


def test_a_skewed_sweeper_neither_takes_the_lead_nor_fires_a_timer_early(org, procs, skew):
    n = sweeper()  # on the true clock
    procs.append(n)
    leader = wait_for(sweep_holder, what="the true sweeper to lead")
    assert f":{n.pid}:" in leader
    s = sweeper(**skew)
    procs.append(s)
    assert_under_faketime(s.pid)
    # S has tried to take the lead, and N's lease (0.9 s long, renewed every 0.1 s) held:
    # ahead, S's clock had it lapsed ten minutes ago.
    wait_for(lambda: lease_tries() >= 2, what="the skewed sweeper to try for the lead")
    assert sweep_holder() == leader
    # N dies: S leads once its lease lapses on the database's clock (behind, S deciding on
    # its own clock would wait ten minutes more: past the bound).
    assert stop(n, signal.SIGKILL) == -signal.SIGKILL
    wait_for(lambda: f":{s.pid}:" in sweep_holder(), what="the skewed sweeper to lead")
    # It fires a due timer (a second's wait), and the minute's one no earlier than its
    # instant (ahead, its clock had both due at once).
    soon = start(org, "soon", waits("1s"), key="soon")
    later = start(org, "later", waits("15s"), key="later")
    for run_id in (soon, later):
        timer = wait_for(partial(fired, run_id), what=f"run {run_id}'s timer")
        assert timer.fired_at is not None and timer.fired_at >= timer.due_at
        event = RunEvent.objects.get(run_id=run_id, kind="step.timer_fired")
        assert event.at >= timer.due_at and f":{s.pid}:" in event.worker
        run = wait_for(partial(finished, run_id), what=f"run {run_id} to end")
        assert run.status == "succeeded"
    first, second = (Timer.objects.get(run_id=r).fired_at for r in (soon, later))
    assert first is not None and second is not None and first < second


# --- the decisions made in Python -------------------------------------------------------------

# Run in a skewed Django process: each decision a process makes in Python about an instant,
# from the values the test chose around the database's clock (in "given").
DECISIONS = """
import json, sys
from datetime import UTC, datetime
from django.core import signing
from approvals.slack import TOKEN_SALT, BadToken, read_token
from effects.providers.http import retry_after_seconds
from timers.cron import first_occurrence
from workflows.errors import ApiKeyExpired
from workflows.services import quotas
from workflows.services.tenancy import api_key_authenticate

given = json.loads(sys.stdin.read())

def token(expires):
    payload = {k: 1 for k in "arsidlv"}
    try:
        read_token(signing.dumps({**payload, "e": expires}, salt=TOKEN_SALT, compress=True))
    except BadToken as bad:
        return bad.code
    return "ok"

def key(raw):
    try:
        api_key_authenticate(raw)
    except ApiKeyExpired:
        return "expired"
    return "ok"

print(json.dumps({
    "process": datetime.now(UTC).timestamp(),
    "quota_clock": quotas.database_seconds(),
    "first_occurrence": first_occurrence("* * * * *", "UTC").timestamp(),
    "retry_after": retry_after_seconds(given["retry_date"]),
    "token_soon": token(given["soon"]), "token_past": token(given["past"]),
    "key_soon": key(given["key_soon"]), "key_past": key(given["key_past"]),
}))
"""


def test_a_skewed_process_decides_expiries_windows_and_schedules_on_the_database_clock(org, skew):
    """Five minutes either side of the database's clock, inside the ten of skew: a process
    deciding on its own clock gets each of these wrong."""
    now = database_clock()
    soon, past = now + 300, now - 300
    _, key_soon = api_key_create(org=org, name="soon", expires_at=_at(soon))
    _, key_past = api_key_create(org=org, name="past", expires_at=_at(past))
    given = {
        "retry_date": email.utils.formatdate(now + 120, usegmt=True),
        "soon": int(soon), "past": int(past), "key_soon": key_soon, "key_past": key_past,
    }  # fmt: skip
    child = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", DECISIONS], cwd=ROOT,
        env=engine_env(**skew), input=json.dumps(given), capture_output=True, text=True,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    after = database_clock()
    skewed = seen["process"] - after
    assert abs(skewed - float(skew["FAKETIME"][:-1]) * 60) < SKEW_TOLERANCE_SECONDS, skewed
    assert now <= seen["quota_clock"] <= after  # the starts-per-minute window's minute
    assert now < seen["first_occurrence"] <= after + 60  # a schedule's first start
    assert 120 - SKEW_TOLERANCE_SECONDS <= seen["retry_after"] <= 120  # a Retry-After date
    assert (seen["token_soon"], seen["token_past"]) == ("ok", "token_expired")  # Slack buttons
    assert (seen["key_soon"], seen["key_past"]) == ("ok", "expired")  # API keys


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def test_a_retry_after_date_counts_from_the_answers_own_date():
    """Both on the provider's clock, whatever ours or the database's says."""
    from effects.providers.http import retry_after_seconds

    later, sent = "Wed, 21 Oct 2015 07:30:00 GMT", "Wed, 21 Oct 2015 07:28:00 GMT"
    assert retry_after_seconds(later, sent) == 120.0
