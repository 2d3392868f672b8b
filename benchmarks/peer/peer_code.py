"""The code workflows of the peer benchmark's Waymark side: the chain-3 work written as
Python (docs/reference/code-workflows.md). Named in WAYMARK_EXTRA_STEP_MODULES by waymark_side.py,
so the benchmark's process and every engine process register them as a host's ready() would.

- ``code-3``: three ``ctx.step(id, "noop")`` calls: the same steps, rows and worker hops as
  the definition ``start -> s1 -> s2 -> s3 -> end`` of noop io steps.
- ``code-run-3``: three ``ctx.run`` calls of a no-op function (each a ``code_result`` step
  recorded from a worker's ``decide`` turn, the function run there).
- ``code-10``: the chain-10 work, ten ``ctx.step(id, "noop")`` calls: against chain-10 it
  shows what a step costs once the run's first turn (a worker's, before any step: no code
  runs at the start) is spread over ten steps instead of three.
"""

from __future__ import annotations

from typing import Any

from workflows.plugins.code import Context, workflow


def nothing(n: int) -> int:
    return n


@workflow("code-3", version=1)
def code_3(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    for n in (1, 2, 3):
        ctx.step(f"s{n}", "noop")
    return run_input


@workflow("code-10", version=1)
def code_10(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    for n in range(1, 11):
        ctx.step(f"s{n}", "noop")
    return run_input


@workflow("code-run-3", version=1)
def code_run_3(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    for n in (1, 2, 3):
        ctx.run(f"s{n}", nothing, n)
    return run_input
