"""What the io worker leaves to Python's garbage collector: objects freed only by a collection
(they sit in reference cycles), per run, by type, for the side-by-side shape and the same
three steps as a code workflow.

    .venv/bin/python benchmarks/collector.py [--runs 300]

Each shape's runs are drained in this process through a real worker's code path
(workflows.code.testing.run_due_steps: claim, execute, settle) with the collector keeping
what it finds (gc.DEBUG_SAVEALL). Every collection stops all of a worker's threads, and the
younger ones run more often the more such objects a run leaves, so the figure to keep at
zero is the engine's own (``workflows.*``); the others are printed too. Uses the database
waymark_bench; exits non-zero when a run did not succeed. Asserts nothing:
tests/test_walk_garbage.py holds the engine's at zero.
"""

from __future__ import annotations

import argparse
import gc
from collections import Counter

from common import drain_here, setup, shapes_organisation, use_peer_code_workflows

use_peer_code_workflows()  # code-3
setup("waymark_bench")

from workflows.engine.lanes import lane_policy  # noqa: E402
from workflows.engine.worker import Worker  # noqa: E402
from workflows.models import Organisation  # noqa: E402

SHAPES = {"three-io": "three", "code-3": "code-3"}  # shape -> automation slug
WARM_UP_RUNS = 20  # what a process makes once and keeps (caches) is not a run's


def left_to_the_collector(org: Organisation, slug: str, runs: int) -> Counter[str]:
    """The objects a collection found after ``runs`` runs of ``slug``, by module and type."""
    worker = Worker(lane_policy("io"), concurrency=1, name="collector")
    drain_here(org, slug, WARM_UP_RUNS, worker)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        drain_here(org, slug, runs, worker)
        gc.collect()
        return Counter(f"{type(each).__module__}.{type(each).__qualname__}" for each in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    org = shapes_organisation("collector")
    for shape, slug in SHAPES.items():
        found = left_to_the_collector(org, slug, args.runs)
        engine = sum(n for name, n in found.items() if name.startswith("workflows."))
        print(
            f"{shape}: {args.runs} runs left {sum(found.values()) / args.runs:.2f} objects a "
            f"run to the collector, {engine / args.runs:.2f} of them the engine's"
        )
        for name, count in found.most_common(12):
            print(f"  {count / args.runs:8.2f}  {name}")


if __name__ == "__main__":
    main()
