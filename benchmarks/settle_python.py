"""The io worker's Python for one settle: its hop planned and its JSON document encoded
(hops.plan_hop, then what hops_together sends), for the side-by-side shape and for the same
three steps as a code workflow. Figures for comparing two versions of the code, taken in one
process, where a drain's rates move with the machine by a fifth from one pass to the next.

    .venv/bin/python benchmarks/settle_python.py [--runs 300] [--repeats 15]

It first drains ``--runs`` runs of each shape through a real worker's code path in this
process (workflows.code.testing.run_due_steps: claim, execute, settle), keeping the
arguments of every settle as the worker planned it. Then it plans and encodes each kept
settle again, the two shapes alternated, ``--repeats`` times, and prints per settle the
median and lowest microseconds and the document's bytes. Planning writes nothing: a hop's
walk runs ahead of its transaction, on the run as the worker saw it. A code-3 run settles
three times as a three-io run does (its first step runs with its first turn), so the two
figures compare per io step too. Uses the database waymark_bench; exits non-zero when a run
did not succeed.

    .venv/bin/python benchmarks/settle_python.py --instructions [--runs 100] [--repeats 3]

counts instead the instructions one settle takes, planned and encoded (callgrind, in a
process of its own per shape, counting only while the kept settles are replayed): a figure
the machine's speed and load do not move, for comparing two versions of the code. Needs
valgrind (``apt-get install valgrind``); takes about half a minute a shape.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from common import drain_here, setup, shapes_organisation, use_peer_code_workflows

use_peer_code_workflows()  # code-3
setup("waymark_bench")

from workflows.engine import group_settle  # noqa: E402
from workflows.engine.hops import json_params, plan_hop  # noqa: E402
from workflows.engine.lanes import lane_policy  # noqa: E402
from workflows.engine.sql.rows import dumps_cells  # noqa: E402
from workflows.engine.worker import Worker  # noqa: E402
from workflows.models import Organisation  # noqa: E402

SHAPES = {"three-io": "three", "code-3": "code-3"}  # shape -> automation slug

Settle = tuple[Any, Any, Any, str]  # the step, its result, the worker's offer, the worker


def kept_settles(org: Organisation, slug: str, runs: int) -> list[Settle]:
    """Drain ``runs`` runs of ``slug`` in this process; the settles the worker planned."""
    kept: list[Settle] = []
    planner = group_settle.plan_hop

    def keeping(step: Any, result: Any, *, worker: str, take: Any) -> Any:
        kept.append((step, result, take, worker))
        return planner(step, result, worker=worker, take=take)

    group_settle.plan_hop = keeping
    try:
        drain_here(org, slug, runs, Worker(lane_policy("io"), concurrency=1, name="settle-python"))
    finally:
        group_settle.plan_hop = planner
    return kept


def planned_and_encoded(settles: list[Settle]) -> tuple[float, float]:
    """Microseconds per settle to plan and encode them all once; the mean document size."""
    size = 0
    began = time.perf_counter()
    for step, result, take, worker in settles:
        planned = plan_hop(step, result, worker=worker, take=take)
        if planned is not None:
            size += len(dumps_cells(json_params(planned.params)))
    return (time.perf_counter() - began) / len(settles) * 1e6, size / len(settles)


def counted_settles(shape: str, runs: int, repeats: int) -> None:
    """In a process under callgrind (``--count``): keep the settles of ``runs`` runs, replay
    them twice uncounted, then ``repeats`` times counted (callgrind_control turns counting
    on and off in this process); print how many settles were counted."""
    kept = kept_settles(shapes_organisation("settle-python"), SHAPES[shape], runs)
    planned_and_encoded(kept)
    planned_and_encoded(kept)
    counting = [shutil.which("callgrind_control") or "callgrind_control", str(os.getpid())]
    subprocess.run([*counting, "--instr=on"], check=True, capture_output=True)  # noqa: S603
    for _ in range(repeats):
        planned_and_encoded(kept)
    subprocess.run([*counting, "--instr=off"], check=True, capture_output=True)  # noqa: S603
    print(f"settles {len(kept) * repeats}")


def instructions_per_settle(shape: str, runs: int, repeats: int) -> float:
    valgrind = shutil.which("valgrind") or "valgrind"
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(  # noqa: S603
            [valgrind, "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/cg",
             sys.executable, __file__, "--count", shape, "--runs", str(runs),
             "--repeats", str(repeats)],
            capture_output=True, text=True,
        )  # fmt: skip
        counted = re.search(r"Collected : (\d+)", done.stderr)
        settles = re.search(r"settles (\d+)", done.stdout)
        if done.returncode != 0 or counted is None or settles is None:
            raise SystemExit(f"{shape} failed under callgrind:\n{done.stderr[-2000:]}")
    return int(counted.group(1)) / int(settles.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--count", choices=SHAPES, help=argparse.SUPPRESS)  # the counted child
    args = parser.parse_args()
    if args.count:
        counted_settles(args.count, args.runs, args.repeats)
        return
    if args.instructions:
        for shape in SHAPES:
            each = instructions_per_settle(shape, args.runs or 100, args.repeats or 3)
            print(f"{shape}: {each / 1000:,.0f}k instructions a settle planned and encoded")
        return
    args.runs, args.repeats = args.runs or 300, args.repeats or 15
    org = shapes_organisation("settle-python")
    settles = {shape: kept_settles(org, slug, args.runs) for shape, slug in SHAPES.items()}
    timings: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    sizes: dict[str, float] = {}
    for _ in range(args.repeats):
        for shape, kept in settles.items():
            took, sizes[shape] = planned_and_encoded(kept)
            timings[shape].append(took)
    for shape, taken in timings.items():
        print(
            f"{shape}: {len(settles[shape])} settles; planned and encoded in "
            f"{statistics.median(taken):.1f} us a settle (median of {args.repeats}; lowest "
            f"{min(taken):.1f}), a document of {sizes[shape]:,.0f} bytes"
        )


if __name__ == "__main__":
    main()
