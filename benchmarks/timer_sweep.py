"""The due sweep of timers: fairness, a batch's cost against the backlog, and lateness.

    .venv/bin/python benchmarks/timer_sweep.py fairness [--backlog 200000]
    .venv/bin/python benchmarks/timer_sweep.py batch [--backlog 200000] [--small-backlog 2000]
    .venv/bin/python benchmarks/timer_sweep.py lateness [--timers 10000] [--lead 90]
    .venv/bin/python benchmarks/timer_sweep.py instant [--timers 10000] [--lead 90]
    .venv/bin/python benchmarks/timer_sweep.py sleep2 [--runs 200] [--repeats 3] [--no-peer]
    .venv/bin/python benchmarks/timer_sweep.py all

In its own database (bench_timers), emptied before each figure:

- fairness: one organisation with ``--backlog`` due timers and 50 with 10 each; calls
  ``fire_due_timers()`` batch by batch and counts the small organisations' timers fired
  after batch 1 and batch 2 (the claim: all 500 within two batches).
- batch: the time of one sweep batch with a ``--backlog`` and a ``--small-backlog`` of due
  timers in one organisation (topped up after each batch, so the backlog stays the same),
  median of ``--batches``, their ratio (target <= 1.5), and EXPLAIN (ANALYZE, BUFFERS) of
  the due query for both (in a transaction rolled back: the query locks its rows); and the
  CPU time the process spent per batch (the sweep's own work: the part the database's
  speed does not move, and what a sweeper's firing threads share one interpreter for).
- lateness: ``--timers`` runs whose ``wait_until`` names one instant ``--lead`` seconds
  ahead (no spread), a ``manage.py sweep`` process running, the fast path on and off; then
  the same number due evenly within one minute from that instant (each run's instant from
  its input), on and off.
- instant: the first of lateness's four figures alone (at one instant, fast path on).
- sleep2: ``--runs`` runs with a ``wait`` of 2s started one after the other, the sweeper
  running, ``--repeats`` times; then DBOS's 200 ``DBOS.sleep(2)`` workflows
  (``dbos_bench.py sleep`` of ../shared/bench, after ``bash ../shared/bench/setup.sh``)
  side by side.

Backlogs are clones of one real waiting run (its run, step and timer rows copied with
INSERT ... SELECT generate_series, the step's wait_detail pointing at its own timer), so
firing one does the same work as firing any other: its step wakes and its run ends. After
a bulk load the tables are VACUUM ANALYZEd, as autovacuum would have by then
(``--no-vacuum``: not).

Lateness, three ways: the step's ``step.timer_fired`` event (the batch transaction's now(),
as is the run's finished_at: when the sweeper began the batch); ``fired_at - due_at`` (the
clock when the batch marked the timer fired: its step woken and its run walked on, just
before the commit; the headline figure); and "visible": the database clock when a watcher
polling every ``--poll`` seconds (25 ms) first saw the batch committed (at most one poll
late). The watcher shares the machine's cores with the sweeper: polling every 10 ms made
the sweeper's p99 several ms worse on a 2-core machine.

Prints figures; exits non-zero when a timer was left unfired, failed, fired twice (a step
with two ``step.timer_fired`` events), or its run did not succeed, or when the small
organisations were not all served within two batches.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from common import ROOT, setup, start_runs

setup("bench_timers")

from django.db import connection, transaction  # noqa: E402

from timers import sql  # noqa: E402
from timers.sweep import BATCH, ORG_SCAN, ORGS_PER_BATCH, fire_due_timers  # noqa: E402
from workflows.models import Organisation  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402
from workflows.services.runs import run_start  # noqa: E402

PEER_DIR = ROOT.parent / "shared" / "bench"
# Where ../shared/bench/setup.sh puts DBOS (its PEERBENCH_VENV).
PEER_VENV = os.environ.get("PEERBENCH_VENV", "/tmp/peerbench/venv")  # noqa: S108
PEER_PYTHON = Path(PEER_VENV) / "bin" / "python"
PROBLEMS: list[str] = []
VACUUM = True  # after a bulk load (--no-vacuum: measure right after it)


def waits(step: dict[str, Any]) -> dict[str, Any]:
    return {
        "start": "pause",
        "steps": [
            {"id": "pause", **step, "next": "done"},
            {"id": "done", "type": "end", "output": "{{ steps.pause.output.due_at }}"},
        ],
    }


WAIT_1H = waits({"type": "wait", "duration": "1h"})
WAIT_2S = waits({"type": "wait", "duration": "2s"})

# ---------------------------------------------------------------------------------------
# The database: emptied per figure, organisations, runs, and cloned backlogs.


def reset() -> None:
    name = connection.settings_dict["NAME"]
    if not (name.startswith("bench_") or name.endswith("_bench")):
        raise SystemExit(f"refusing to empty database {name!r}: not a benchmark database")
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE timers_timer, timers_orgsweep, workflows_sweeplease, workflows_runevent,"
            " workflows_step, workflows_outbox, workflows_run CASCADE"
        )


def organisation(slug: str, definition: dict[str, Any], automation: str = "timer") -> Any:
    org, _ = Organisation.objects.get_or_create(slug=slug, defaults={"name": slug})
    automation_publish_definition(org=org, slug=automation, definition=definition)
    return org


def execute(statement: str, params: dict[str, Any] | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def db_now() -> datetime:
    return execute("SELECT now()")[0][0]


def vacuum() -> None:
    """As autovacuum would have by the time a backlog this size had built up."""
    if not VACUUM:
        return
    for table in ("timers_timer", "workflows_step", "workflows_run"):
        execute(f"VACUUM ANALYZE {table}")


# Copies of one waiting run: `n` runs, each with the template's step and timer; the timers
# due from now() + %(due)s seconds on, %(spacing)s seconds apart, in the runs' order.
CLONE_SQL = """
WITH runs AS (
    INSERT INTO workflows_run (org_id, automation_id, version_id, start_key,
        start_key_derived, input, input_digest, status, vars, outputs, entered, output, error,
        steps_executed, max_steps, deadline_at, created_at)
    SELECT org_id, automation_id, version_id, %(tag)s || g, false, input, input_digest,
           status, vars, outputs, entered, output, error, steps_executed, max_steps,
           deadline_at, now()
      FROM workflows_run, generate_series(1, %(n)s) g
     WHERE id = %(run)s
    RETURNING id, org_id
),
timers AS (
    INSERT INTO timers_timer (org_id, run_id, step_id, iteration, kind, intent, zone,
        spread_seconds, offset_seconds, due_at, error, created_at)
    SELECT r.org_id, r.id, t.step_id, t.iteration, t.kind, t.intent, t.zone,
           t.spread_seconds, t.offset_seconds,
           now() + make_interval(secs => %(due)s
                                 + %(spacing)s * row_number() OVER (ORDER BY r.id)),
           '', now()
      FROM runs r, timers_timer t
     WHERE t.run_id = %(run)s
    RETURNING id, run_id, step_id, iteration, due_at
)
INSERT INTO workflows_step (org_id, run_id, step_id, iteration, type, lane, status, attempt,
    release_count, max_attempts, series_offset, wait_kind, wait_detail, error, created_at)
SELECT s.org_id, t.run_id, s.step_id, s.iteration, s.type, s.lane, s.status, s.attempt,
       s.release_count, s.max_attempts, s.series_offset, s.wait_kind,
       s.wait_detail || jsonb_build_object('timer', t.id, 'parked_on', 'timer:' || t.id,
                                           'due_at', t.due_at),
       '', now()
  FROM timers t
  JOIN workflows_step s
    ON s.run_id = %(run)s AND s.step_id = t.step_id AND s.iteration = t.iteration
"""


class Backlog:
    """Due timers of one organisation, cloned from a waiting run of its own (whose timer,
    an hour ahead, never comes due here)."""

    def __init__(self, org: Any) -> None:
        self.template = start_runs(org, "timer", 1, f"template{time.time_ns()}", 1)[0]

    def add(self, n: int, due: float, spacing: float = 0.0) -> None:
        """`n` more timers, the first due `due` seconds from now, then `spacing` apart."""
        params = {"run": self.template, "n": n, "tag": f"clone{time.time_ns()}-",
                  "due": due, "spacing": spacing}  # fmt: skip
        execute(CLONE_SQL, params)


def backlog(org: Any, n: int) -> Backlog:
    """`n` due timers, 30 minutes' worth, the earliest an hour ago."""
    pile = Backlog(org)
    pile.add(n, -3600.0, spacing=1800 / max(1, n))
    vacuum()
    return pile


def make_due(orgs: list[int]) -> None:
    """Bring the organisations' timers to now (as tests/test_timers.py does)."""
    execute("UPDATE timers_timer SET due_at = now() WHERE org_id = ANY(%(orgs)s)", {"orgs": orgs})


def fired_count(org_ids: list[int]) -> int:
    rows = execute(
        "SELECT count(*) FROM timers_timer WHERE org_id = ANY(%(o)s) AND fired_at IS NOT NULL",
        {"o": org_ids},
    )
    return int(rows[0][0])


# ---------------------------------------------------------------------------------------
# Checks: every timer of a figure fired once, without error, and its run succeeded.

CHECK_SQL = """
SELECT count(*) FILTER (WHERE t.fired_at IS NULL) AS unfired,
       count(*) FILTER (WHERE t.error <> '') AS failed,
       count(*) FILTER (WHERE t.fired_at IS NOT NULL AND r.status <> 'succeeded') AS stuck
  FROM timers_timer t JOIN workflows_run r ON r.id = t.run_id
 WHERE t.run_id = ANY(%(runs)s) OR (t.org_id = %(org)s AND t.fired_at IS NOT NULL)
"""

TWICE_SQL = """
SELECT run_id, step_id, iteration, count(*) FROM workflows_runevent
 WHERE kind = 'step.timer_fired' GROUP BY 1, 2, 3 HAVING count(*) > 1 ORDER BY 1 LIMIT 5
"""


def check(label: str, runs: Sequence[int] = (), org: int | None = None) -> None:
    """`runs`: their timers all fired; `org`: the timers it fired so far (a backlog)."""
    row = execute(CHECK_SQL, {"runs": list(runs), "org": org})[0]
    twice = execute(TWICE_SQL)
    for count, what in zip(row, ("left unfired", "fired with an error",
                                 "fired but their run did not succeed"), strict=True):  # fmt: skip
        if count:
            PROBLEMS.append(f"{label}: {count} timer(s) {what}")
    if twice:
        PROBLEMS.append(f"{label}: step(s) with two step.timer_fired events: {twice}")
    print(f"check {label}: {row[0]} unfired, {row[1]} failed, {row[2]} runs stuck, "
          f"{len(twice)} steps fired twice")  # fmt: skip


# ---------------------------------------------------------------------------------------
# Figures


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def p50_p99_max(values: list[float]) -> str:
    """p50/p99/max of seconds, in ms."""
    return "p50 {:8.1f}  p99 {:8.1f}  max {:8.1f} ms".format(
        *(v * 1000 for v in (pct(values, 0.5), pct(values, 0.99), max(values)))
    )


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs, load average {load} (other processes share this machine)"


def heading(title: str) -> None:
    print(f"\n== {title} ==  [{machine()}]", flush=True)


def timed_batch() -> tuple[float, Any]:
    began = time.perf_counter()
    batch = fire_due_timers()
    return time.perf_counter() - began, batch


def cpu_timed_batch() -> tuple[float, float, Any]:
    """A batch's wall time and this process's CPU time (the sweep's own Python and psycopg
    work: what its firing threads share one interpreter lock for)."""
    cpu = time.process_time()
    seconds, batch = timed_batch()
    return seconds, time.process_time() - cpu, batch


# ---------------------------------------------------------------------------------------
# 1. Fairness


def fairness(args: argparse.Namespace) -> None:
    heading(f"fairness: 1 organisation x {args.backlog:,} due timers + 50 x 10")
    reset()
    big = organisation("fair-backlog", WAIT_1H)  # created first: the lowest id, first in ties
    smalls = [organisation(f"fair-small-{i:02}", WAIT_1H) for i in range(50)]
    small_runs = [
        run for n, org in enumerate(smalls) for run in start_runs(org, "timer", 10, f"s{n}", 1)
    ]
    small_ids = [org.pk for org in smalls]
    make_due(small_ids)  # due after the whole backlog: the newest timers of all
    backlog(big, args.backlog)
    print(f"backlog: {args.backlog:,} due timers (cloned); small: {len(small_runs)} due timers "
          f"of real runs in 50 organisations, due last")  # fmt: skip
    plan = explain()
    print("-- EXPLAIN (ANALYZE, BUFFERS) DUE_BATCH before batch 1 --")
    print("\n".join(plan))
    print(f"DUE_BATCH before batch 1: {plan_figures(plan)}")
    served = []
    for number in (1, 2):
        seconds, batch = timed_batch()
        served.append(fired_count(small_ids))
        print(f"batch {number}: {batch.fired} fired across {batch.orgs} organisations in "
              f"{seconds * 1000:.0f} ms; small organisations' timers fired so far: "
              f"{served[-1]}/500")  # fmt: skip
    print(f"backlog organisation: {fired_count([big.pk]):,} of {args.backlog:,} fired")
    if served[-1] != len(small_runs):
        PROBLEMS.append(f"fairness: only {served[-1]}/500 small timers fired in two batches")
    check("small organisations", small_runs)
    check("backlog, fired so far", org=big.pk)


# ---------------------------------------------------------------------------------------
# 2. A batch's cost against the backlog


def explain() -> list[str]:
    """The due query's plan as the sweeper runs it: a prepared statement, which PostgreSQL
    may run with a generic plan after five executions; that generic plan is the one shown
    (parameters bound on the server, plan_cache_mode forced)."""
    params = {"scan": ORG_SCAN, "orgs": ORGS_PER_BATCH, "batch": BATCH, "part": 0, "parts": 1}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        server_bound = psycopg.Cursor(cursor.connection)
        server_bound.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql.DUE_BATCH}", params)
        lines = [row[0] for row in server_bound.fetchall()]
        transaction.set_rollback(True)  # the query locked its timers
    return lines


def batch_times(size: int, batches: int) -> dict[str, Any]:
    """Time `batches` sweep batches (after one to warm up) with `size` due timers, topped
    up after each batch with as many due later (new timers join at the end)."""
    reset()
    org = organisation("batch-backlog", WAIT_1H)
    pile = backlog(org, size)
    # As the sweep process does (processes.engine_process): what start-up made is out of the
    # collector's view, so a batch's collections scan only what came after.
    gc.collect()
    gc.freeze()
    times, cpus = [], []
    for number in range(batches + 1):
        seconds, cpu, batch = cpu_timed_batch()
        if batch.fired != BATCH:
            PROBLEMS.append(f"batch: a batch fired {batch.fired}, not {BATCH}")
        if number:
            times.append(seconds)
            cpus.append(cpu)
        pile.add(batch.fired, -1.0)
    plan = explain()
    check(f"backlog {size:,}, fired", org=org.pk)
    return {"times": times, "cpus": cpus, "plan": plan}


def plan_figures(plan: list[str]) -> str:
    text = "\n".join(plan)
    buffers = re.search(r"Buffers: (shared [^\n]*)", text)
    took = re.search(r"Execution Time: ([\d.]+) ms", text)
    return f"{took.group(1) if took else '?'} ms, {buffers.group(1) if buffers else '?'}"


def batch(args: argparse.Namespace) -> None:
    heading(f"batch time: {args.small_backlog:,} vs {args.backlog:,} due timers, batch {BATCH}")
    figures = {size: batch_times(size, args.batches) for size in (args.small_backlog, args.backlog)}
    for size, result in figures.items():
        print(f"\n-- EXPLAIN (ANALYZE, BUFFERS) DUE_BATCH, backlog {size:,} --")
        print("\n".join(result["plan"]))
    print()
    medians = {}
    for size, result in figures.items():
        medians[size] = statistics.median(result["times"])
        each = " ".join(f"{t * 1000:.0f}" for t in result["times"])
        print(f"backlog {size:>7,}: batch median {medians[size] * 1000:6.0f} ms  (each: {each})")
        cpu = statistics.median(result["cpus"])
        print(
            f"                 CPU of this process: median {cpu * 1000:.1f} ms a batch, "
            f"{cpu / BATCH * 1e6:.0f} us a timer"
        )
        print(f"                 DUE_BATCH alone: {plan_figures(result['plan'])}")
    ratio = medians[args.backlog] / medians[args.small_backlog]
    print(f"ratio {args.backlog:,} / {args.small_backlog:,}: {ratio:.2f} (target <= 1.5)")


# ---------------------------------------------------------------------------------------
# Lateness, with a sweeper process


@contextmanager
def sweeper(**env: str) -> Iterator[subprocess.Popen[bytes]]:
    """A `manage.py sweep` process on this database, leading before the block begins,
    stopped (then killed) when it ends. What it logged is checked: a sweeper that failed
    (and slept a whole tick after it) makes the figure a problem."""
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "sweep"], cwd=ROOT, env={**os.environ, **env},
            stderr=log,
        )  # fmt: skip
        try:
            wait_until(lambda: leads(process), timeout=60, what="the sweeper to lead")
            yield process
        finally:
            stop(process)
            log.seek(0)
            logged(log.read().decode(errors="replace"))


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def logged(text: str) -> None:
    errors = [line for line in text.splitlines() if " ERROR " in line]
    if errors:
        last = text.strip().splitlines()[-1]
        PROBLEMS.append(f"the sweeper logged {len(errors)} error(s), e.g. {errors[0]}: {last}")
        print(f"  sweeper logged {len(errors)} error(s): {errors[0]} ... {last}")


def leads(process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise SystemExit(f"the sweeper exited with {process.returncode}")
    rows = execute(
        "SELECT 1 FROM workflows_sweeplease WHERE holder LIKE %(me)s AND lease_until > now()",
        {"me": f"%:{process.pid}:sweep"},
    )
    return bool(rows)


def wait_until(predicate: Any, *, timeout: float, what: str, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def all_fired(runs: list[int]) -> bool:
    rows = execute(
        "SELECT count(*) FROM timers_timer WHERE run_id = ANY(%(r)s) AND fired_at IS NULL",
        {"r": runs},
    )
    return rows[0][0] == 0


class Watcher(threading.Thread):
    """When each batch became visible: every `poll` seconds, the database clock at which each
    batch's transaction (the fired timers' xmin: one batch, one transaction) was first seen
    committed. One row per batch, not per timer: reading every fired timer's own fired_at
    (the clock, a different instant for each) on each look took this process half a core
    of a 2-core machine during a storm, beside the sweeper it measures."""

    def __init__(self, poll: float) -> None:
        super().__init__(daemon=True)
        self.poll, self.halt, self.seen = poll, threading.Event(), {}
        self.since = db_now()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                rows = execute(
                    "SELECT xmin::text, clock_timestamp() FROM timers_timer"
                    " WHERE fired_at >= %(since)s GROUP BY xmin::text",
                    {"since": self.since},
                )
                for batch, now in rows:
                    self.seen.setdefault(batch, now)
                self.halt.wait(self.poll)
        finally:
            connection.close()

    def stop(self) -> None:
        time.sleep(3 * self.poll)  # a look after the last commit
        self.halt.set()
        self.join(timeout=10)


LATENESS_SQL = """
SELECT t.due_at, t.fired_at, e.at, r.finished_at, t.xmin::text AS batch
  FROM timers_timer t
  JOIN workflows_run r ON r.id = t.run_id
  LEFT JOIN workflows_runevent e ON e.run_id = t.run_id AND e.kind = 'step.timer_fired'
   AND e.step_id = t.step_id AND e.iteration = t.iteration
 WHERE t.run_id = ANY(%(runs)s) AND t.fired_at IS NOT NULL
"""


def lateness_of(runs: list[int], watcher: Watcher) -> tuple[dict[str, list[float]], int]:
    """Seconds late, per fired timer: fired_at, the step's event, the run's end, visible;
    and the number of batches that fired them (distinct transaction starts: fired_at is the
    clock, a different instant for each timer of a batch)."""
    rows = execute(LATENESS_SQL, {"runs": runs})
    late: dict[str, list[float]] = {"fired_at": [], "event": [], "finished": [], "visible": []}
    for due, fired, event, finished, batch in rows:
        late["fired_at"].append((fired - due).total_seconds())
        late["event"].append((event - due).total_seconds())
        late["finished"].append((finished - due).total_seconds())
        if batch in watcher.seen:
            late["visible"].append((watcher.seen[batch] - due).total_seconds())
    return late, len({row[2] for row in rows})


def print_lateness(late: dict[str, list[float]], poll: float) -> None:
    same = late["event"] == late["fired_at"] == late["finished"]
    print(f"  fired_at - due_at            {p50_p99_max(late['fired_at'])}")
    if not same:
        print(f"  step.timer_fired event at    {p50_p99_max(late['event'])}")
        print(f"  run finished_at              {p50_p99_max(late['finished'])}")
    seen = f"visible, poll {poll * 1000:.0f} ms"
    print(f"  {seen:28} {p50_p99_max(late['visible'])}")
    if same:
        print("  (the step.timer_fired event and the run's finished_at equal fired_at: the")
        print("   batch transaction's now(); 'visible' is when the commit could be seen)")
    if len(late["visible"]) < len(late["fired_at"]):
        print(f"  ({len(late['fired_at']) - len(late['visible'])} timers' batch not seen)")


# ---------------------------------------------------------------------------------------
# 3a. Many timers due at one instant


def burst(args: argparse.Namespace, fast_path: bool, *, over: float = 0.0) -> None:
    """``args.timers`` runs whose ``wait_until`` instants lie ``args.lead`` seconds ahead: all
    at one instant (``over`` 0), or evenly across ``over`` seconds from it."""
    reset()
    mode = "on" if fast_path else "off"
    with sweeper(WAYMARK_TIMERS_FAST_PATH="1" if fast_path else "0"):
        at = (db_now() + timedelta(seconds=args.lead)).replace(microsecond=0)
        step = {"type": "wait_until", "at": "{{ input.at }}" if over else at.isoformat()}
        org = organisation("burst", waits(step), "burst")

        def instant(n: int) -> dict[str, Any]:
            return {"at": (at + timedelta(seconds=over * n / args.timers)).isoformat()}

        began = time.monotonic()
        runs = start_runs(org, "burst", args.timers, f"burst{time.time_ns()}", args.starters,
                          inputs=instant if over else None)  # fmt: skip
        started = time.monotonic() - began
        early = execute("SELECT count(*) FROM timers_timer WHERE created_at < due_at")[0][0]
        if early != len(runs):
            # Fired as they were written, before the watcher looks: no burst to measure.
            raise SystemExit(
                f"lateness: {len(runs) - early} of {len(runs):,} timers were written after "
                f"their instant (the starts took {started:.0f}s, --lead is {args.lead:.0f}s): "
                "give a longer --lead"
            )
        when = f"due from {at:%H:%M:%S} over {over:.0f}s" if over else f"all due at {at:%H:%M:%S}"
        print(f"fast path {mode}: {len(runs):,} runs started in {started:.1f}s "
              f"({len(runs) / started:.0f}/s), {when}")  # fmt: skip
        watcher = Watcher(args.poll or 0.025)
        watcher.start()
        wait_until(lambda: all_fired(runs), timeout=args.lead + over + 900,
                   what="the burst to fire", every=0.5)  # fmt: skip
        watcher.stop()
    late, batches = lateness_of(runs, watcher)
    last = max(late["visible"])
    rate = "" if over else f" ({len(runs) / last:.0f} timers/s)"
    print(f"  fired in {batches} batches; the last visible {last:.1f}s after its instant{rate}")
    print_lateness(late, watcher.poll)
    check(f"fast path {mode}", runs)


def instant(args: argparse.Namespace) -> None:
    heading(f"instant: {args.timers:,} timers due at one instant, fast path on, sweeper running")
    burst(args, fast_path=True)


def lateness(args: argparse.Namespace) -> None:
    heading(f"lateness: {args.timers:,} timers due at one instant, no spread, sweeper running")
    burst(args, fast_path=True)
    burst(args, fast_path=False)
    heading(f"lateness: {args.timers:,} timers due evenly within one minute, sweeper running")
    burst(args, fast_path=True, over=60.0)
    burst(args, fast_path=False, over=60.0)


# ---------------------------------------------------------------------------------------
# 3b. 200 runs waiting 2s, against DBOS.sleep(2)


def sleep2(args: argparse.Namespace) -> None:
    heading(f"sleep2: {args.runs} runs with a wait of 2s, started in a loop, sweeper running")
    reset()
    org = organisation("sleep2", WAIT_2S)
    repeats = []
    with sweeper():
        for repeat in range(args.repeats):
            watcher = Watcher(args.poll or 0.025)
            watcher.start()
            began = time.monotonic()
            runs = [
                run_start(org=org, automation_slug="timer", run_input={},
                          start_key=f"r{repeat}-{i}-{time.time_ns()}").run_id
                for i in range(args.runs)
            ]  # fmt: skip
            started = time.monotonic() - began
            wait_until(lambda runs=runs: all_fired(runs), timeout=120, what="the sleeps")
            watcher.stop()
            late, batches = lateness_of(runs, watcher)
            repeats.append(late)
            print(f"repeat {repeat}: started in {started:.2f}s, fired in {batches} batches")
            print_lateness(late, watcher.poll)
            check(f"repeat {repeat}", runs)
    summary = summarize(repeats)
    if args.no_peer:
        return
    side_by_side(summary, peer())


def summarize(repeats: list[dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Like dbos_bench.py: per measure, the median over repeats of p50, p99 and max (ms)."""
    out = {}
    for measure in ("fired_at", "visible"):
        out[measure] = {
            name: statistics.median(fn(r[measure]) * 1000 for r in repeats)
            for name, fn in (("p50_ms", lambda v: pct(v, 0.5)),
                             ("p99_ms", lambda v: pct(v, 0.99)), ("max_ms", max))
        }  # fmt: skip
    return out


def peer() -> dict[str, dict[str, float]] | None:
    """Runs `dbos_bench.py sleep` and returns its summary (min/median/max per figure)."""
    if not PEER_PYTHON.exists():
        print(f"\n(no {PEER_PYTHON}: run `bash ../shared/bench/setup.sh` for the DBOS side)")
        return None
    print(f"\n$ cd {PEER_DIR} && {PEER_PYTHON} dbos_bench.py sleep", flush=True)
    done = subprocess.run(  # noqa: S603
        [str(PEER_PYTHON), "dbos_bench.py", "sleep"], cwd=PEER_DIR, capture_output=True,
        text=True, timeout=900, check=False,
    )  # fmt: skip
    print(done.stdout, end="")
    found = re.search(r"^results: (\S+)", done.stdout, re.MULTILINE)
    if done.returncode or not found:
        PROBLEMS.append(f"dbos_bench.py sleep failed ({done.returncode}): {done.stderr[-500:]}")
        return None
    return json.loads(Path(found.group(1)).read_text())["summary"]


def side_by_side(ours: dict[str, dict[str, float]], dbos: dict | None) -> None:
    print("\n-- 200 x sleep 2s: lateness, median over repeats (ms) --")
    print(f"{'':10}{'waymark fired_at':>18}{'waymark visible':>17}{'DBOS':>9}"
          f"{'ratio fired_at':>16}{'ratio visible':>15}")  # fmt: skip
    for name in ("p50_ms", "p99_ms", "max_ms"):
        fired, seen = ours["fired_at"][name], ours["visible"][name]
        theirs = dbos[name]["median"] if dbos else float("nan")
        print(f"{name:10}{fired:18.1f}{seen:17.1f}{theirs:9.1f}"
              f"{fired / theirs:16.1f}{seen / theirs:15.1f}")  # fmt: skip


# ---------------------------------------------------------------------------------------


FIGURES = {
    "fairness": fairness, "batch": batch, "lateness": lateness, "instant": instant,
    "sleep2": sleep2,
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("figure", choices=[*FIGURES, "all"])
    parser.add_argument("--backlog", type=int, default=200_000)
    parser.add_argument("--small-backlog", type=int, default=2_000)
    parser.add_argument("--batches", type=int, default=8, help="timed batches per backlog")
    parser.add_argument("--timers", type=int, default=10_000, help="lateness: timers")
    parser.add_argument("--lead", type=float, default=90.0, help="lateness: seconds ahead")
    parser.add_argument("--starters", type=int, default=4, help="lateness: threads starting")
    parser.add_argument("--runs", type=int, default=200, help="sleep2: runs per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="sleep2: repeats")
    parser.add_argument("--poll", type=float, help="watcher: seconds (0.025)")
    parser.add_argument("--no-vacuum", action="store_true", help="no VACUUM after bulk loads")
    parser.add_argument("--no-peer", action="store_true", help="sleep2: without DBOS")
    args = parser.parse_args()
    global VACUUM
    VACUUM = not args.no_vacuum
    # "all": every figure once ("instant" is lateness's first)
    every = [name for name in FIGURES if name != "instant"]
    for name in every if args.figure == "all" else [args.figure]:
        FIGURES[name](args)
    if PROBLEMS:
        print("\nPROBLEMS:\n" + "\n".join(f"- {p}" for p in PROBLEMS))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
