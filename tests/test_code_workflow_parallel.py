"""ctx.parallel (docs/code-workflows.md, "Parallel branches"): a code workflow's branches
run on the engine's own fork and join (engine/forks.py), each decided by a decider of its
own against its branch's history, on the real engine and database."""

from __future__ import annotations

from typing import Any

import pytest

from workflows.models import Organisation, RunEvent, Step
from workflows.plugins.code import Context, workflow
from workflows.plugins.testing import WorkflowTest

from . import code_parallel_workflows  # noqa: F401 (registers the workflows shared with processes)
from .effect_setup import connect
from .stubs import ProviderStub

pytestmark = pytest.mark.django_db(transaction=True)


def rows(run_id: int) -> list[tuple[str, int, str, str, int | None]]:
    steps = Step.objects.filter(run_id=run_id).exclude(step_id__startswith="~").order_by("id")
    return [(s.step_id, s.iteration, s.type, s.status, s.branch) for s in steps]


def test_a_pair_of_effects_runs_each_once_and_returns_both_in_branch_order(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    connect(org, base_url=provider_stub.url)
    t = WorkflowTest(org=org)
    t.start("code-par-pair", version=1, input={"url": provider_stub.url}, start_key="p1")
    run = t.run_until_finished()
    assert (run.status, run.error) == ("succeeded", ""), rows(run.id)
    sent = sorted(item["body"]["branch"] for item in provider_stub.created)
    assert sent == ["left", "right"]  # each effect once
    by_branch = {item["body"]["branch"]: item["id"] for item in provider_stub.created}
    assert run.output == {"left": by_branch["left"], "right": by_branch["right"]}
    # Two rows of the same id, one per branch, each its own effect key (run/step/iteration).
    sends = Step.objects.filter(run_id=run.id, step_id="send").order_by("branch")
    assert [(s.branch, s.status) for s in sends] == [(0, "done"), (1, "done")]
    assert sorted(s.iteration for s in sends) == [1, 2]
    assert RunEvent.objects.filter(run_id=run.id, kind="step.succeeded", step_id="pair.join").count() == 1


def test_a_branch_sleeps_while_the_other_waits_for_a_signal_and_both_results_come_back(
    org: Organisation,
) -> None:
    t = WorkflowTest(org=org)
    t.start("code-par-waits", version=1, input={"order": "o-7"}, start_key="w1")
    run = t.run_until_waiting()
    assert sorted((s.step_id, s.type) for s in run.waiting) == [
        ("both.join", "join"), ("go", "wait_signal"), ("nap", "wait"),
    ]  # fmt: skip
    t.signal("go", correlation="o-7", payload={"ok": 1})
    run = t.run_until_waiting()
    assert sorted(s.step_id for s in run.waiting) == ["both.join", "nap"]  # not met yet
    assert t.skip_time() == 1
    run = t.run_until_finished()
    assert (run.status, run.error) == ("succeeded", "")
    assert run.output == ["rested", {"ok": 1}]
    # Each branch's steps on its own branch of the fork, in its own order.
    placed = [(s.step_id, s.branch) for s in Step.objects.filter(run_id=run.id).order_by("id")
              if s.branch is not None and s.type != "code"]  # fmt: skip
    assert sorted(placed) == [("go", 1), ("nap", 0), ("woke", 0)]


def test_complete_first_cancels_the_other_branch_and_gives_it_none(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("code-par-first", version=1, input={}, start_key="f1")
    run = t.run_until_waiting()
    assert sorted(s.step_id for s in run.waiting) == ["go", "never", "race.join"]
    t.signal("go", correlation="first")  # the quick branch returns first
    run = t.run_until_finished()
    assert (run.status, run.error) == ("succeeded", "")
    assert run.output == {"met": ["quick", None], "after": "after"}
    never = Step.objects.get(run_id=run.id, step_id="never")
    assert never.status == "cancelled"
    cancelled = RunEvent.objects.filter(run_id=run.id, kind="step.cancelled", step_id="never")
    assert cancelled.count() == 1
    # The main function went on once: one turn asked for "after".
    assert Step.objects.filter(run_id=run.id, step_id="after").count() == 1


def test_a_loop_around_parallel_forks_anew_each_pass_with_new_iterations(
    org: Organisation,
) -> None:
    t = WorkflowTest(org=org)
    t.start("code-par-loop", version=1, input={"turns": 3}, start_key="l1")
    run = t.run_until_finished()
    assert (run.status, run.error) == ("succeeded", "")
    assert run.output == [[0, 0], [2, 1], [4, 4]]
    assert [s.iteration for s in run.steps if s.step_id == "round"] == [1, 2, 3]
    assert [s.iteration for s in run.steps if s.step_id == "double"] == [1, 2, 3]
    joins = Step.objects.filter(run_id=run.id, step_id="round.join").order_by("iteration")
    assert [(j.iteration, j.status) for j in joins] == [(1, "done"), (2, "done"), (3, "done")]
    # Each pass's branches point at that pass's join row.
    for join in joins:
        doubles = Step.objects.filter(run_id=run.id, step_id="double", fork_join_id=join.id)
        assert doubles.count() == 1
