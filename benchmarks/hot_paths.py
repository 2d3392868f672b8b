"""The engine's two hottest paths, one thread, no other process: Python time per operation.

    .venv/bin/python benchmarks/hot_paths.py [--runs 1500] [--repeats 3]

- start: ``run_start`` of a three-io-step automation, one after the other (after a warm-up).
- settle: the io worker's own path over those runs: claim one step, settle it with the
  worker's offer to take the run's next step (and, when the run ends, a ready step of the
  lane), again until nothing is ready: three settles per run, no relay; on a connection set
  up as a worker's are (sql.GENERIC_PLANS).

Prints per operation the process's CPU time (``time.process_time``: the interpreter's and
psycopg's work, the part this code controls) and the wall time (which adds the database's
work and the round trips), for each repeat. The machine's noise moves the wall time by about
10 % between runs; the CPU time moves less, which is why it is printed. Compare only figures
taken back to back. Exits non-zero when a run did not succeed.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from common import THREE_IO, empty_run_tables, setup

setup("bench_hot_paths")

from django.db import connection  # noqa: E402

from workflows.engine.executors import StepResult  # noqa: E402
from workflows.engine.lanes import lane_policy  # noqa: E402
from workflows.engine.steps import (  # noqa: E402
    claim,
    plan_claims_generically,
    settle_and_take_next,
)
from workflows.engine.walk import TakeNext  # noqa: E402
from workflows.models import Organisation, Run  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402
from workflows.services.runs import run_start  # noqa: E402


def reset() -> Any:
    empty_run_tables()
    org, _ = Organisation.objects.get_or_create(slug="hot", defaults={"name": "hot"})
    automation_publish_definition(org=org, slug="three", definition=THREE_IO)
    return org


def starts(org: Any, runs: int, tag: str) -> tuple[float, float]:
    for n in range(50):  # warm-up: prepared statements, caches
        run_start(org=org, automation_slug="three", run_input={"n": n}, start_key=f"{tag}w{n}")
    cpu, wall = time.process_time(), time.perf_counter()
    for n in range(runs):
        run_start(org=org, automation_slug="three", run_input={"n": n}, start_key=f"{tag}-{n}")
    return time.process_time() - cpu, time.perf_counter() - wall


def settles() -> tuple[int, float, float]:
    policy = lane_policy("io")
    take = TakeNext(worker="hot", lane="io", lease_seconds=60.0, claim_lane=True)
    plan_claims_generically(connection=connection)  # as a worker's connections are
    done = 0
    cpu, wall = time.process_time(), time.perf_counter()
    claimed = claim(policy=policy, worker="hot", limit=1)
    step = claimed[0] if claimed else None
    while step is not None:
        settled = settle_and_take_next(step, StepResult(output=None), worker="hot", take=take)
        step = settled.next_step
        done += 1
        if step is None:
            claimed = claim(policy=policy, worker="hot", limit=1)
            step = claimed[0] if claimed else None
    return done, time.process_time() - cpu, time.perf_counter() - wall


def report(repeat: int, label: str, unit: str, count: int, cpu: float, wall: float) -> None:
    print(f"repeat {repeat}: {label} {cpu / count * 1e6:5.0f} us CPU, "
          f"{wall / count * 1e6:5.0f} us wall per {unit}, {count / wall:.0f}/s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for repeat in range(args.repeats):
        org = reset()
        cpu, wall = starts(org, args.runs, f"r{repeat}-{time.time_ns()}")
        report(repeat, "start  ", "start", args.runs, cpu, wall)
        done, cpu, wall = settles()
        report(repeat, "settle ", f"io step ({done} steps)", done, cpu, wall)
        unfinished = Run.objects.exclude(status="succeeded").count()
        if unfinished:
            raise SystemExit(f"{unfinished} runs did not succeed")


if __name__ == "__main__":
    main()
