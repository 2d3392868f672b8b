"""Operating code runs as definitions' runs are operated: the run page draws a nested
ctx.parallel as a definition's nested fork and the path a run went along bold (past a
failure its code caught too); a re-run refuses a step entered only in branches
(rerun_step_not_top_level, naming the top-level parallel) and a compensation step
(rerun_step_is_compensation), as it refuses a definition's (docs/reference/api-runs.md);
``runs list`` names the step a code run's function called last, not its decider's turn."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

from workflows.admin.run_graph import steps_taken
from workflows.engine import metrics
from workflows.models import Organisation, Run
from workflows.plugins.code import Context, StepFailed, publish_code_workflow, workflow
from workflows.services.runs import run_start

from .effect_setup import drive

pytestmark = pytest.mark.django_db(transaction=True)


def refuse(n: int) -> int:
    raise ValueError(f"no {n}")


@workflow("code-nested-drawn", version=1)
def nested(ctx: Context, run_input: Any) -> Any:
    def a(c: Context) -> Any:
        return c.parallel("inner", lambda d: d.run("x1", str, "x"),
                          lambda d: d.run("y1", str, "y"))  # fmt: skip

    def b(c: Context) -> Any:
        return c.run("b1", str, "b")

    met = ctx.parallel("outer", a, b)
    ctx.run("after", str, "after")
    return met


@workflow("code-caught-drawn", version=1)
def caught(ctx: Context, run_input: Any) -> Any:
    try:
        ctx.run("flaky", refuse, 1)
    except StepFailed:
        ctx.run("noted", str, "failed")
    return ctx.run("after", str, "went on")


@workflow("code-undone-rerun", version=1)
def undone(ctx: Context, run_input: Any) -> None:
    ctx.step("reserve", "noop")
    ctx.compensate_with("release", "noop")
    ctx.fail("out_of_stock")


def finished(org: Organisation, name: str, status: str = "succeeded") -> Run:
    publish_code_workflow(org=org, name=name, version=1)
    run_id = run_start(org=org, automation_slug=name, run_input={}, start_key="k").run_id
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == status, run.error
    return run


def test_a_nested_parallel_is_drawn_as_a_definitions_nested_fork(
    org: Organisation, admin_client: Client
) -> None:
    run = finished(org, "code-nested-drawn")
    _, links = steps_taken(run, "code")
    assert {(link.source, link.target, link.kind) for link in links} == {
        ("outer", "inner", "branch"), ("outer", "b1", "branch"),
        ("inner", "x1", "branch"), ("inner", "y1", "branch"),
        ("x1", "inner.join", "join"), ("y1", "inner.join", "join"),
        ("inner.join", "outer.join", "join"), ("b1", "outer.join", "join"),
        ("outer.join", "after", "next"),
    }  # fmt: skip
    assert admin_client.get(f"/admin/workflows/run/{run.pk}/change/").status_code == 200


def test_the_link_a_code_run_took_past_a_failure_it_caught_is_drawn_taken(
    org: Organisation, admin_client: Client
) -> None:
    run = finished(org, "code-caught-drawn")
    html = admin_client.get(f"/admin/workflows/run/{run.pk}/change/").content.decode()
    drawn = re.findall(r'<g class="(edge[^"]*)">', html)
    assert drawn and all(edge.endswith(" taken") for edge in drawn), drawn


@pytest.mark.parametrize("step", ["b1", "x1"])
def test_a_rerun_from_a_step_inside_a_branch_is_refused_naming_its_parallel(
    org: Organisation, api: APIClient, step: str
) -> None:
    run = finished(org, "code-nested-drawn")
    refused = api.post(f"/api/v1/runs/{run.pk}/rerun", {"from_step": step}, format="json")
    assert refused.status_code == 400
    assert refused.json()["code"] == "rerun_step_not_top_level", refused.json()
    assert "outer" in refused.json()["detail"]


def test_a_rerun_from_a_code_parallel_s_join_names_the_parallel_and_the_step_after(
    org: Organisation, api: APIClient
) -> None:
    """It said the run's history had no such step, though the join's row is there."""
    run = finished(org, "code-nested-drawn")
    refused = api.post(f"/api/v1/runs/{run.pk}/rerun", {"from_step": "outer.join"}, format="json")
    assert refused.status_code == 400
    assert refused.json()["code"] == "unknown_step"
    assert refused.json()["detail"] == (
        "'outer.join' is where the branches of ctx.parallel 'outer' meet, not a step the code "
        "called: re-run from 'outer' (its branches run again) or from the step the code called "
        "after it."
    )


def test_a_rerun_from_a_compensation_step_is_refused(org: Organisation, api: APIClient) -> None:
    run = finished(org, "code-undone-rerun", status="compensated")
    for dry_run in (True, False):
        refused = api.post(f"/api/v1/runs/{run.pk}/rerun",
                           {"from_step": "release", "dry_run": dry_run}, format="json")  # fmt: skip
        assert refused.status_code == 400
        assert refused.json()["code"] == "rerun_step_is_compensation", refused.json()
    run.refresh_from_db()
    assert run.status == "compensated"


def io_failed_for_good() -> float:
    """This process's io steps failed with no retry left (engine/metrics.py)."""
    return float(metrics.STEPS_FAILED.labels(lane="io", final="true")._value.get())


def test_a_ctx_run_that_fails_for_good_counts_as_a_failed_step_of_its_lane(
    org: Organisation,
) -> None:
    """As a definition's io step failing on its last attempt does: the function failed on
    an io worker; its record is written in that worker's settle."""
    before = io_failed_for_good()
    finished(org, "code-caught-drawn")
    assert io_failed_for_good() - before == 1


@workflow("code-listed", version=1)
def listed(ctx: Context, run_input: Any) -> Any:
    ctx.run("price", str, "10")
    if run_input.get("wait"):
        ctx.wait_signal("paid", signal="paid", correlation="listed")
    if run_input.get("fail"):
        ctx.fail("out_of_stock")
    return ctx.step("receipt", "noop")


def test_runs_list_names_the_step_a_code_run_called_last_not_its_decider(
    org: Organisation,
) -> None:
    publish_code_workflow(org=org, name="code-listed", version=1)
    ids = {
        shape: run_start(org=org, automation_slug="code-listed", run_input={shape: True},
                         start_key=shape).run_id
        for shape in ("done", "wait", "fail")
    }  # fmt: skip
    drive()
    out = io.StringIO()
    call_command("runs", "list", "--org", org.slug, "--json", stdout=out)
    listed = {run["id"]: (run["status"], run["current_step"])
              for run in json.loads(out.getvalue())["results"]}  # fmt: skip
    assert listed == {
        ids["done"]: ("succeeded", "receipt"),  # not "decide": its last turn only returned
        ids["wait"]: ("running", "paid"),
        ids["fail"]: ("failed", "decide"),  # the turn that failed the run
    }
