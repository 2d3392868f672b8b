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
