"""What rendering one template costs: in-process (the fast path, and Jinja's compiled
template as before the budget) against a rendering process (the pool).

    .venv/bin/python benchmarks/render_cost.py [--n 2000]

Prints microseconds per render for the templates of benchmarks/throughput.py's mixed shape
and for a loop, which only the pool may render. Needs no database and no Django.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workflows.definitions import sandbox
from workflows.definitions.rendering import (
    build_context,
    evaluate_condition_here,
    render_template_here,
)

CONTEXT = build_context(run_input={"n": 7, "tags": ["a", "b", "c"]}, variables={"greeting": "hi 7"})
CASES: list[tuple[str, str]] = [
    ("template", "hi {{ input.n }}"),
    ("template", "{{ vars.greeting }}"),
    ("condition", "input.n % 2 == 1"),
    ("template", "{% for t in input.tags %}{{ t }}{% endfor %}"),
]


def per_call_us(func: Callable[[], Any], n: int) -> float:
    func()  # warm: compile caches, the rendering process
    started = time.perf_counter()
    for _ in range(n):
        func()
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    n = parser.parse_args().n
    print(f"{'template':48} {'jinja here':>11} {'engine':>9} {'pool':>9}  path")
    for op, source in CASES:
        here_func: Callable[[str, dict[str, Any]], Any]
        if op == "condition":
            here_func = evaluate_condition_here
            fast = sandbox._fast_condition(source) is not None
        else:
            here_func = render_template_here
            fast = sandbox._fast_template(source) is not None
        here = per_call_us(functools.partial(here_func, source, CONTEXT), n)
        engine = per_call_us(functools.partial(sandbox.render, op, source, CONTEXT, 65536), n)
        pool = per_call_us(functools.partial(sandbox.render_in_pool, op, source, CONTEXT, 65536), n)
        print(
            f"{source:48} {here:9.1f}µs {engine:7.1f}µs {pool:7.1f}µs  "
            f"{'in-process (fast path)' if fast else 'pool'}"
        )


if __name__ == "__main__":
    main()
