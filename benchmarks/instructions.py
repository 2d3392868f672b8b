"""Instructions a start's client and a worker spend, counted by callgrind: figures the
machine's speed does not move (CPU times on a shared 2-core machine vary by ±20 %). The
worker's still follow timing (how often it polls, how many hops settle as a group): one
commit's three-io read 2,867 k and 3,287 k a run; compare versions over several runs.

    .venv/bin/python benchmarks/instructions.py [--side start|worker|both] [--shape three-io|code-3]

Needs valgrind (``apt-get install valgrind``). Each side runs twice under callgrind, small
and large, and the totals are differenced, so start-up (imports, migrations check, the first
connection) cancels out:

- start: a process makes ``--starts`` (200 and 1,200) `run_start` calls of the side-by-side
  shape with no engine running; prints instructions per start (the client only: the database
  server is another process);
- worker: ``--runs`` (100 and 700) runs are queued, then `manage.py worker --lane io` runs
  under callgrind until none is running and is stopped (SIGTERM); prints instructions per
  run (three io steps each). With ``--shape code-3``, the runs are the same three steps as a
  code workflow (benchmarks/peer/peer_code.py): what a code run's turns add to the worker.

Both run in the database waymark_bench (WAYMARK_DB_NAME wins). Asserts nothing; exits
non-zero when a run did not succeed. Under callgrind a process is about 50 times slower: a
side takes two to three minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from common import (
    ROOT,
    empty_run_tables,
    setup,
    shapes_organisation,
    start_runs,
    use_peer_code_workflows,
)

use_peer_code_workflows()  # --shape code-3
setup("waymark_bench")

from django.db import connection  # noqa: E402

SHAPES = ("three-io", "code-3")  # code-3: its automation is named after the workflow

VALGRIND = shutil.which("valgrind") or "valgrind"
SMALL_STARTS, LARGE_STARTS = 200, 1200
SMALL_RUNS, LARGE_RUNS = 100, 700


def start_three(count: int, tag: str, shape: str = "three-io") -> None:
    """``count`` runs of the side-by-side shape (or the same as a code workflow), one after
    the other (one thread)."""
    slug = "three" if shape == "three-io" else shape
    start_runs(shapes_organisation("instructions"), slug, count, tag, threads=1)


def counted(command: list[str], *, until_done: bool = False) -> int:
    """Instructions ``command`` executed under callgrind. ``until_done``: it is a worker,
    stopped with SIGTERM once no run is running."""
    with tempfile.TemporaryDirectory() as out:
        process = subprocess.Popen(  # noqa: S603
            [VALGRIND, "--tool=callgrind", f"--callgrind-out-file={out}/cg", *command],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        if until_done:
            while running_runs():
                time.sleep(0.2)
            process.terminate()
        _, err = process.communicate()
    found = re.search(r"Collected : (\d+)", err)
    if process.returncode not in (0, -15) or found is None:
        raise SystemExit(f"{' '.join(command)} failed under callgrind:\n{err[-2000:]}")
    return int(found.group(1))


def running_runs() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM workflows_run WHERE status = 'running'")
        return int(cursor.fetchone()[0])


def per_start() -> float:
    totals = []
    for count in (SMALL_STARTS, LARGE_STARTS):
        empty_run_tables()
        tag = f"i{int(time.time())}"
        totals.append(counted([sys.executable, __file__, "--starts", str(count), "--tag", tag]))
    return (totals[1] - totals[0]) / (LARGE_STARTS - SMALL_STARTS)


def per_run(shape: str) -> float:
    totals = []
    for count in (SMALL_RUNS, LARGE_RUNS):
        empty_run_tables()
        start_three(count, f"w{int(time.time())}", shape)
        worker = [sys.executable, "manage.py", "worker", "--lane", "io"]
        totals.append(counted(worker, until_done=True))
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM workflows_run WHERE status <> 'succeeded'")
            failed = cursor.fetchone()[0]
        if failed:
            raise SystemExit(f"{failed} runs did not succeed")
    return (totals[1] - totals[0]) / (LARGE_RUNS - SMALL_RUNS)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=["start", "worker", "both"], default="both")
    parser.add_argument("--shape", choices=SHAPES, default="three-io", help="the worker's runs")
    parser.add_argument("--starts", type=int, help=argparse.SUPPRESS)  # the counted child
    parser.add_argument("--tag", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.starts is not None:
        start_three(1, f"{args.tag}-warm")  # the automation remembered: the ordinary path
        start_three(args.starts, args.tag)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    os.environ["WAYMARK_LOG_LEVEL"] = "WARNING"
    if args.side in ("start", "both"):
        print(f"client instructions per start: {per_start() / 1e3:,.0f} k")
    if args.side in ("worker", "both"):
        per = per_run(args.shape)
        print(f"worker instructions per run (three io steps, {args.shape}): {per / 1e3:,.0f} k")


if __name__ == "__main__":
    main()
