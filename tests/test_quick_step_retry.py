"""A quick step whose failure is not its own fault is tried again by a worker, not failed.

Quick steps run inside the walk (a start, a settle, a signal's delivery). When one fails in a
way worth retrying (here the real one the chaos run found: no template renderer was free in
time, ``renderer_busy``), the walk hands the step to a continuation row on a worker lane
instead of failing the run; the continuation's walk tries it again under that lane's
attempts and backoff, and only its last attempt fails the step for good, which then follows
its declared failure path like any other failure.

The renderer pool is the real one (``TEMPLATE_PROCESSES`` = 1) with its only renderer held,
as another tenant's costly template would hold it; the worker is the real Worker's code path
(tests/effect_setup.drive).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.test import override_settings
from pytest_django.fixtures import Settings

from workflows.definitions import sandbox
from workflows.models import Run, RunEvent, Step

from .effect_setup import drive, start

pytestmark = pytest.mark.django_db(transaction=True)

# Rendered by a rendering child, not on the in-process fast path (a loop).
COSTLY = "{% for x in input.l %}{{ x }}{% endfor %}"


def chain(**on_failure: str) -> dict[str, Any]:
    """An io step, then the quick step with the costly template, then another io step: the
    quick step is entered by a settle's walk, in the middle of the run."""
    steps = [
        {"id": "first", "type": "noop", "next": "render"},
        {"id": "render", "type": "set", "values": {"joined": COSTLY}, "next": "last",
         **on_failure},
        {"id": "last", "type": "noop"},
    ]  # fmt: skip
    if on_failure:
        steps.append({"id": "fallback", "type": "set", "values": {"joined": "fallback"}})
    return {"start": "first", "steps": steps}


@pytest.fixture
def one_renderer(settings: Settings) -> Iterator[None]:
    settings.WAYMARK = {**settings.WAYMARK, "TEMPLATE_PROCESSES": 1,
                        "TEMPLATE_WAIT_SECONDS": 0.2}  # fmt: skip
    pool = sandbox.RenderPool()
    previous, sandbox._POOL = sandbox._POOL, pool
    try:
        yield
    finally:
        sandbox._POOL = previous
        pool.close()


@contextmanager
def renderer_held() -> Iterator[None]:
    """The pool's only renderer, taken by someone else for as long as the block lasts."""
    pool = sandbox._pool()
    held = pool._checkout(sandbox.template_limits(), time.monotonic() + 60)
    try:
        yield
    finally:
        pool._checkin(held, True)


def kinds(run_id: int, step_id: str = "") -> list[str]:
    events = RunEvent.objects.filter(run_id=run_id).order_by("id")
    if step_id:
        events = events.filter(step_id=step_id)
    return list(events.values_list("kind", flat=True))


def rows(run_id: int, step_id: str) -> list[tuple[int, str]]:
    steps = Step.objects.filter(run_id=run_id, step_id=step_id).order_by("iteration")
    return list(steps.values_list("iteration", "status"))


def test_a_busy_renderer_hands_the_quick_step_to_a_worker_and_the_run_goes_on(
    org: Any, one_renderer: None
) -> None:
    run_id = start(org, chain(), run_input={"l": [1, 2, 3]})
    with renderer_held():
        drive(rounds=1, fast_forward=False)  # `first` runs; its settle meets the busy pool
        run = Run.objects.get(pk=run_id)
        assert run.status == "running", run.error
        assert rows(run_id, "render") == []  # not entered after all: no failed row
        assert "step.retry_later" in kinds(run_id, "render")
        assert run.entered.get("render", 0) == 0

    drive()  # the renderer is free again: the continuation enters the step

    run = Run.objects.get(pk=run_id)
    assert (run.status, run.vars["joined"]) == ("succeeded", "123"), run.error
    assert rows(run_id, "render") == [(1, "done")]  # entered once, as iteration 1
    assert run.entered["render"] == 1
    assert "step.failed" not in kinds(run_id)


def test_a_continuation_meeting_the_busy_renderer_again_is_retried_with_backoff(
    org: Any, one_renderer: None
) -> None:
    run_id = start(org, chain(), run_input={"l": [4, 5]})
    with renderer_held():
        # The continuation is tried once, still without a renderer: by the round whose
        # settle wrote it, when that settle claims it for the worker (SETTLE_CLAIMS), or by
        # the next round's claim. No round after it: its backoff's full jitter can be a
        # millisecond, and a further round would try it again.
        for _ in range(2):
            drive(rounds=1, fast_forward=False)
            if "step.retry_scheduled" in kinds(run_id, "~continue"):
                break
        continuation = Step.objects.get(run_id=run_id, type="continue")
        assert (continuation.status, continuation.wait_kind) == ("waiting", "retry")
        assert continuation.attempt == 1  # one attempt used: the lane's backoff before the next
        assert "step.retry_scheduled" in kinds(run_id)
        assert rows(run_id, "render") == []  # the walk's writes were rolled back

    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.vars["joined"]) == ("succeeded", "45"), run.error
    assert rows(run_id, "render") == [(1, "done")]


def test_a_start_whose_first_quick_step_meets_the_busy_renderer_is_not_failed(
    org: Any, one_renderer: None
) -> None:
    definition = {"start": "render", "steps": chain()["steps"][1:3]}
    with renderer_held():
        run_id = start(org, definition, run_input={"l": [7]})
        assert Run.objects.get(pk=run_id).status == "running"
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.vars["joined"]) == ("succeeded", "7"), run.error


def test_past_the_lanes_attempts_the_quick_step_fails_for_good_and_follows_its_path(
    org: Any, one_renderer: None, settings: Settings
) -> None:
    lanes = {**settings.WAYMARK["LANES"]}
    lanes["io"] = {**lanes["io"], "max_attempts": 3}
    with override_settings(WAYMARK={**settings.WAYMARK, "LANES": lanes}), renderer_held():
        failing = start(org, chain(), run_input={"l": [1]}, key="plain")
        drive()
        routed = start(org, chain(on_failure="fallback"), run_input={"l": [1]}, key="routed",
                       slug="routed")  # fmt: skip
        drive()

    run = Run.objects.get(pk=failing)
    assert run.status == "failed"
    assert "step 'render' failed: template error: renderer_busy" in run.error, run.error
    assert rows(failing, "render") == [(1, "failed")]
    continuation = Step.objects.filter(run_id=failing, type="continue").latest("id")
    assert continuation.attempt == 3  # tried on every attempt of the lane

    run = Run.objects.get(pk=routed)
    assert (run.status, run.vars.get("joined")) == ("succeeded", "fallback"), run.error
    assert rows(routed, "render") == [(1, "failed")]
