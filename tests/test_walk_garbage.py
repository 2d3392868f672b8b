"""A settle frees its walk as it ends: nothing of the engine is left for the garbage collector.

A walk whose parts point back at it (its compensation, its forks), or a group settle whose
leader holds the list it is in, is a reference cycle: freed only when the collector's next
pass finds it, and each pass stops every thread of the worker (gen1 passes were 3-5 % of a
drained io worker's time, docs/how-to/benchmarks.md). Runs are drained here in this process
through a real worker's code path (claim, execute, hop or slow settle, group settle), with
the collector keeping what it finds (gc.DEBUG_SAVEALL) instead of freeing it."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from workflows.models import Organisation, Run
from workflows.plugins.code import Context, publish_code_workflow, workflow
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .effect_setup import drive, settle_slowly

pytestmark = pytest.mark.django_db(transaction=True)

# Worker steps in a chain, a fork whose branches meet, quick steps inline.
FORKED = {
    "start": "a",
    "steps": [
        {"id": "a", "type": "noop", "next": "fork"},
        {"id": "fork", "type": "parallel", "branches": ["left", "right"], "next": "join"},
        {"id": "left", "type": "set", "values": {"left": "1"}, "next": "join"},
        {"id": "right", "type": "noop", "next": "join"},
        {"id": "join", "type": "join", "wait_for": ["left", "right"], "next": "b"},
        {"id": "b", "type": "noop", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


def made(n: int) -> int:
    return n


@workflow("garbage-free", version=1)
def garbage_free(ctx: Context, run_input: dict[str, Any]) -> list[Any]:
    ctx.step("s1", "noop")
    ctx.run("made", made, 1)
    ctx.compensate_with("undo", "noop")
    both = ctx.parallel("pair", lambda c: c.step("l", "noop"), lambda c: c.run("r", made, 2))
    ctx.step("s2", "noop")
    return both


@contextmanager
def engine_garbage() -> Iterator[Counter[str]]:
    """Around a block: what the collector found of the engine's own objects (by type)."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    found: Counter[str] = Counter()
    try:
        yield found
        gc.collect()
        found.update(
            type(each).__qualname__
            for each in gc.garbage
            if type(each).__module__.startswith("workflows.")
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def start(org: Organisation, slug: str, count: int) -> list[int]:
    return [
        run_start(org=org, automation_slug=slug, run_input={}, start_key=f"{slug}-{n}").run_id
        for n in range(count)
    ]


@pytest.mark.parametrize("settles", ["hops", "slow"])
def test_drained_runs_leave_no_engine_object_to_the_collector(
    org: Organisation, monkeypatch: pytest.MonkeyPatch, settles: str
) -> None:
    if settles == "slow":
        settle_slowly(monkeypatch)
    automation_publish_definition(org=org, slug="forked", definition=FORKED)
    publish_code_workflow(org=org, name="garbage-free", version=1)
    start(org, "forked", 1)
    start(org, "garbage-free", 1)
    drive(rounds=50)  # the first of each: what a process makes once and keeps (caches)
    ids = start(org, "forked", 4) + start(org, "garbage-free", 4)
    with engine_garbage() as found:
        drive(rounds=50)
    runs = Run.objects.filter(pk__in=ids)
    assert {(run.status, run.error) for run in runs} == {("succeeded", "")}
    assert found == Counter(), found
