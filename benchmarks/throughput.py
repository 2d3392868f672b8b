"""End-to-end engine throughput and fairness, on the embedded PostgreSQL by default.

    .venv/bin/python benchmarks/throughput.py --runs 2000 [--shape mixed|three-io|code-3] [--drain]
    .venv/bin/python benchmarks/throughput.py --fairness --backlog 100000

Throughput: starts N runs of a 5-step automation (set -> noop -> branch -> noop -> end: three
quick steps inline in the walk, two io steps through a worker; or, with --shape three-io, the
side-by-side harness's three no-op io steps; with --shape code-3, the same three as a code
workflow, benchmarks/peer/peer_code.py) while a relay and the io worker processes run
with the default `runengine` settings, and prints runs/s, steps/s, p50/p99 start-to-end
latency and database commits (from pg_stat_database: everything counts, claims, settles,
heartbeats, the relay, idle polls; the starts and this script's own polls are counted and
taken out for the engine's figure), and the engine's transactions that wrote the runs'
history (distinct xmin of their events), and the CPU time per io step of the engine's
processes, of the database server (all its processes, when it runs on this machine) and of
the script itself (its starting threads, end to end; its polls): on a saturated 2-core
machine the rate is what that CPU allows. --drain starts every run first, then the engine,
and clocks from the first claim to the last finish (the side-by-side harness's drain; CPU
counted from the engine's start).

Fairness: gives organisation "busy" a backlog of ready io steps, then starts a few runs for
organisation "quiet" and prints how long those took while the backlog drains.

It uses its own database (waymark_bench) and prints figures; it asserts nothing, but exits
non-zero when runs do not finish, or do not succeed: a fast wrong engine never reads as fast.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

from common import (
    ROOT,
    THREE_IO,
    commits,
    database_cpu_seconds,
    empty_run_tables,
    setup,
    start_runs,
    use_peer_code_workflows,
)

use_peer_code_workflows()  # --shape code-3
setup("waymark_bench")

from django.db import connection  # noqa: E402

from workflows.engine.lanes import lane_policy  # noqa: E402
from workflows.models import Organisation, Run  # noqa: E402
from workflows.plugins.code import publish_code_workflow  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402

MIXED = {
    "start": "greet",
    "steps": [
        {"id": "greet", "type": "set", "values": {"greeting": "hi {{ input.n }}"}, "next": "a"},
        {"id": "a", "type": "noop", "output": {"n": "{{ input.n }}"}, "next": "route"},
        {"id": "route", "type": "branch", "when": [{"outcome": "odd", "if": "input.n % 2 == 1"}],
         "next": {"odd": "b", "default": "b"}},
        {"id": "b", "type": "noop", "next": "done"},
        {"id": "done", "type": "end", "output": {"greeting": "{{ vars.greeting }}"}},
    ],
}  # fmt: skip
# name -> (definition, steps per run, io steps per run)
SHAPES = {"mixed": (MIXED, 5, 2), "three-io": (THREE_IO, 4, 3), "code-3": (None, 4, 3)}
DEFINITION, STEPS_PER_RUN, IO_STEPS_PER_RUN = SHAPES["mixed"]
CODE_SLUG = "code-3"  # peer_code.py's


def engine(*roles: list[str]) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ)
    return [
        subprocess.Popen([sys.executable, "manage.py", *role], cwd=ROOT, env=env)  # noqa: S603
        for role in roles
    ]


def io_workers() -> list[list[str]]:
    """What runengine starts for the io lane: WAYMARK_IO_PROCESSES worker processes."""
    return [["worker", "--lane", "io"]] * lane_policy("io").processes


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=30)


def setup(slug: str) -> Organisation:
    org, _ = Organisation.objects.get_or_create(slug=slug, defaults={"name": slug})
    if DEFINITION is None:  # the code workflow: its automation is named after it
        publish_code_workflow(org=org, name=CODE_SLUG, version=1)
    else:
        automation_publish_definition(org=org, slug="bench", definition=DEFINITION)
    return org


def wait_finished(ids: list[int], timeout: float) -> int:
    """Wait for the runs to end; returns how many queries it made (each one a commit of its
    own, counted in pg_stat_database: the benchmark's own, not the engine's)."""
    # By the id range (one index range, one parameter each): a filter on the ids themselves
    # cost this script 20 ms of CPU and the server 11 ms of planning per poll at 3,000 runs,
    # which counted as the engine's.
    runs = Run.objects.filter(pk__gte=min(ids), pk__lte=max(ids), status="running")
    deadline, polls = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        polls += 1
        if not runs.exists():
            return polls
        time.sleep(0.1)
    raise SystemExit(f"runs did not finish within {timeout}s")


def write_transactions(ids: list[int]) -> int:
    """The engine's transactions that wrote these runs' history: every start, claim and
    settle writes events, so distinct xmin of their events counts them (read-only ones,
    such as an empty claim, are in the commit count only)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT xmin::text) FROM workflows_runevent WHERE run_id = ANY(%s)",
            [ids],
        )
        return int(cursor.fetchone()[0])


def latencies(ids: list[int]) -> list[float]:
    rows = Run.objects.filter(pk__in=ids).values_list("created_at", "finished_at", "status")
    bad = [status for _, _, status in rows if status != "succeeded"]
    if bad:
        raise SystemExit(f"{len(bad)} runs did not succeed")
    return sorted((done - made).total_seconds() for made, done, _ in rows)


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def throughput(args: argparse.Namespace) -> None:
    """End to end (the engine running while runs start) or, with --drain, drained (every
    run started first, then the engine: clocked from its first claim to the last finish)."""
    org = setup("bench")
    processes = [] if args.drain else engine(["relay"], *io_workers())
    time.sleep(0 if args.drain else 3)  # let them start
    before, began = commits(), time.monotonic()
    cpu = Cpu()
    slug = CODE_SLUG if DEFINITION is None else "bench"
    ids = start_runs(org, slug, args.runs, f"t{int(time.time())}", args.starters)
    if args.drain:
        cpu = Cpu()  # the engine's work only
        processes = engine(["relay"], *io_workers())
    polls = wait_finished(ids, timeout=600)
    elapsed = drained_seconds(ids) if args.drain else time.monotonic() - began
    used = commits() - before
    stop(processes)
    cpu.stop()
    lat = latencies(ids)
    steps = len(ids) * STEPS_PER_RUN
    io_steps = len(ids) * IO_STEPS_PER_RUN
    engine_commits = used - len(ids) - polls  # without the starts and this script's polls
    mode = "drained" if args.drain else f"end to end, {args.starters} starter threads"
    print(f"runs: {len(ids)} in {elapsed:.2f}s ({mode})")
    print(f"runs/s: {len(ids) / elapsed:.1f}")
    print(f"steps/s: {steps / elapsed:.1f} (io steps/s: {io_steps / elapsed:.1f})")
    if not args.drain:
        print(f"start-to-end latency: p50 {pct(lat, 0.5) * 1000:.0f} ms, "
              f"p99 {pct(lat, 0.99) * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms")  # fmt: skip
    per_io = engine_commits / io_steps
    print(f"commits: {used} in all: {len(ids)} starts, {polls} this script's polls, "
          f"{engine_commits} the engine's = {per_io:.2f} per io step")  # fmt: skip
    writes = write_transactions(ids) - len(ids)
    print(f"engine transactions that wrote these runs: {writes} = "
          f"{writes / io_steps:.2f} per io step")  # fmt: skip
    print(cpu.per(io_steps, "io step"))


class Cpu:
    """CPU time from now until stop(): the engine's processes (this script's children, once
    stopped), the database server's (common.database_cpu_seconds) and this script's own (its
    starting threads and polls)."""

    def __init__(self) -> None:
        self.marks = self._read()
        self.used: tuple[float, float | None, float] | None = None

    @staticmethod
    def _read() -> tuple[float, float | None, float]:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        me = resource.getrusage(resource.RUSAGE_SELF)
        return (children.ru_utime + children.ru_stime, database_cpu_seconds(),
                me.ru_utime + me.ru_stime)  # fmt: skip

    def stop(self) -> None:
        (engine, database, me), (engine0, database0, me0) = self._read(), self.marks
        spent = None if database is None or database0 is None else database - database0
        self.used = (engine - engine0, spent, me - me0)

    def per(self, count: int, what: str) -> str:
        assert self.used is not None
        engine, database, me = (None if v is None else f"{v / count * 1e6:.0f}"
                                for v in self.used)  # fmt: skip
        return (
            f"CPU per {what}: engine processes {engine} us, database server "
            f"{database or 'n/a'} us, this script {me} us"
        )


def drained_seconds(ids: list[int]) -> float:
    """From the first claim to the last finish, on the database's clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM (SELECT max(finished_at) FROM workflows_run"
            " WHERE id = ANY(%(ids)s)) - (SELECT min(at) FROM workflows_runevent"
            " WHERE run_id = ANY(%(ids)s) AND kind = 'step.claimed'))",
            {"ids": ids},
        )
        return float(cursor.fetchone()[0])


BACKLOG_SQL = """
WITH runs AS (
    INSERT INTO workflows_run (org_id, automation_id, version_id, start_key, start_key_derived,
        input, input_digest, status, vars, outputs, entered, error, steps_executed, max_steps,
        deadline_at, created_at)
    SELECT %(org)s, %(automation)s, %(version)s, %(tag)s || g, false, '{}', '', 'running',
           '{}', '{}', '{"a": 1}', '', 2, 1000, now() + interval '1 day', now()
      FROM generate_series(1, %(n)s) g
    RETURNING id
)
INSERT INTO workflows_step (org_id, run_id, step_id, iteration, type, lane, status, attempt,
    release_count, series_offset, max_attempts, lease_until, wait_kind, error, created_at)
SELECT %(org)s, id, 'a', 1, 'noop', 'io', 'ready', 0, 0, 0, 5, now(), '', '', now() FROM runs
"""


def fairness(args: argparse.Namespace) -> None:
    busy, quiet = setup("busy"), setup("quiet")
    automation = busy.automation_set.get(slug="bench")
    with connection.cursor() as cursor:
        cursor.execute(
            BACKLOG_SQL,
            {"org": busy.pk, "automation": automation.pk, "tag": f"b{int(time.time())}-",
             "version": automation.current_version_id, "n": args.backlog},
        )  # fmt: skip
    print(f"busy organisation: {args.backlog} ready io steps")
    processes = engine(["relay"], *io_workers())
    time.sleep(3)
    ids = start_runs(quiet, "bench", args.quiet_runs, f"q{int(time.time())}", 1)
    wait_finished(ids, timeout=600)
    lat = latencies(ids)
    remaining = Run.objects.filter(org=busy, status="running").count() if args.backlog else 0
    stop(processes)
    print(f"quiet organisation: {len(ids)} runs, latency p50 {pct(lat, 0.5) * 1000:.0f} ms, "
          f"max {lat[-1] * 1000:.0f} ms; busy runs still unfinished then: {remaining}")  # fmt: skip


def reset() -> None:
    """Start from empty run tables: a previous fairness backlog would skew the figures."""
    if not connection.settings_dict["NAME"].endswith("_bench"):
        raise SystemExit("refusing to reset a database whose name does not end in _bench")
    empty_run_tables()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), default="mixed",
        help="mixed: set, noop, branch, noop, end; three-io: the side-by-side harness's shape; "
        "code-3: three-io as a code workflow",
    )  # fmt: skip
    parser.add_argument("--starters", type=int, default=4, help="threads starting runs")
    parser.add_argument("--drain", action="store_true", help="start every run, then the engine")
    parser.add_argument("--fairness", action="store_true")
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--quiet-runs", type=int, default=10)
    args = parser.parse_args()
    global DEFINITION, STEPS_PER_RUN, IO_STEPS_PER_RUN
    DEFINITION, STEPS_PER_RUN, IO_STEPS_PER_RUN = SHAPES[args.shape]
    reset()
    fairness(args) if args.fairness else throughput(args)


if __name__ == "__main__":
    main()
