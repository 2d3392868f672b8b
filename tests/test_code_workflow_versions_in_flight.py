"""Changing a code workflow while its runs are in flight (docs/how-to/change-code-workflows.md):
a migration checks a run inside a ctx.parallel against each branch's history, not only the
top level's; a patch gives one answer in a run's replay, its branches included, and a
branch that recorded its own answer before answers were shared keeps it; a run migrated off
a version no worker has goes on at once and is no longer reported; and a callable whose body
would never run is refused at registration."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from timers.sweep import fire_due_timers
from workflows.code.registry import registered, unregister
from workflows.models import Organisation, Run, RunEvent, Step
from workflows.plugins.code import CodeWorkflowError, Context, publish_code_workflow, workflow
from workflows.services.run_migration import dry_run, migration_plan, migration_start
from workflows.services.runs import run_start

from .effect_setup import drive
from .test_doctor import doctor, finding
from .test_timers import make_due

pytestmark = pytest.mark.django_db(transaction=True)

CODE = {"top_asks": False, "branch_asks": False}


def tag(value: str) -> str:
    return value


def send_go(api: APIClient, correlation: str) -> None:
    answer = api.post(
        "/api/v1/signals", {"name": "go", "correlation": correlation, "payload": {}}, format="json"
    )
    assert answer.status_code in (200, 201, 202), answer.json()


# --- a migration's check of a run inside a ctx.parallel ----------------------------------------


def waits(c: Context) -> str:
    c.run("x", tag, "x")
    c.wait_signal("go", signal="go", correlation="fan")
    return "b1"


def other_first(c: Context) -> str:
    c.run("x_other", tag, "x_other")  # the branch's history has "x" here
    c.wait_signal("go", signal="go", correlation="fan")
    return "b1"


def quick(c: Context) -> str:
    return str(c.run("y", tag, "y"))


@workflow("code-fanned", version=1)
def fanned_v1(ctx: Context, run_input: Any) -> Any:
    got = ctx.parallel("fan", waits, quick)
    ctx.run("after", tag, "after")
    return got


@workflow("code-fanned", version=2)
def fanned_v2(ctx: Context, run_input: Any) -> Any:
    """Does not fit: its first branch calls another step first."""
    got = ctx.parallel("fan", other_first, quick)
    ctx.run("after", tag, "after")
    return got


@workflow("code-fanned", version=3)
def fanned_v3(ctx: Context, run_input: Any) -> Any:
    """Fits: the same branches, another step after the join."""
    got = ctx.parallel("fan", waits, quick)
    ctx.run("after_v3", tag, "after_v3")
    return got


def fanned_run_then_version(org: Organisation, version: int) -> tuple[int, Any]:
    """A run of version 1 waiting in the first branch of its ctx.parallel, and the plan to
    move it onto ``version``, published since."""
    v1 = publish_code_workflow(org=org, name="code-fanned", version=1).number
    run_id = run_start(org=org, automation_slug="code-fanned", run_input={}, start_key="p").run_id
    drive()
    assert Step.objects.get(run_id=run_id, step_id="go").status == "waiting"
    to = publish_code_workflow(org=org, name="code-fanned", version=version).number
    return run_id, migration_plan(org=org, automation_slug="code-fanned", from_version=v1,
                                  to_version=to)  # fmt: skip


def test_a_run_inside_a_parallel_is_not_moved_to_code_its_branch_history_does_not_fit(
    org: Organisation, api: APIClient
) -> None:
    run_id, plan = fanned_run_then_version(org, 2)
    report = dry_run(plan)
    assert (report.would_move, migration_start(plan=plan, actor="ops").moved_now) == (0, 0)
    assert report.cannot["nondeterministic_workflow"]["sample"] == [run_id]
    assert Run.objects.get(pk=run_id).version_id == plan.from_version.pk
    assert RunEvent.objects.filter(run_id=run_id, kind="run.migration_refused").exists()

    send_go(api, "fan")  # it goes on, on its own version
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", ["b1", "y"]), run.error


def test_a_run_inside_a_parallel_moves_to_code_that_fits_its_branches(
    org: Organisation, api: APIClient
) -> None:
    run_id, plan = fanned_run_then_version(org, 3)
    assert dry_run(plan).would_move == 1
    assert migration_start(plan=plan, actor="ops").moved_now == 1
    send_go(api, "fan")
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", ["b1", "y"]), run.error
    assert Step.objects.filter(run_id=run_id, step_id="after_v3").exists()


# --- one answer per patch in a run's replay ----------------------------------------------------


@workflow("code-patched-fan", version=1)
def patched_fan(ctx: Context, run_input: Any) -> Any:
    top = bool(CODE["top_asks"] and ctx.patched("fix-x"))
    if top:
        ctx.run("top_new", tag, "top_new")
    ctx.sleep("nap", "1h")

    def branch(correlation: str) -> Any:
        def taken(c: Context) -> str:
            new = bool(CODE["branch_asks"] and c.patched("fix-x"))  # the same patch again
            if new:
                c.run("branch_new", tag, "branch_new")
            c.wait_signal("go", signal="go", correlation=correlation)
            return "new" if new else "old"

        return taken

    key = run_input["key"]
    return {"top": top, "branches": ctx.parallel("fan", branch(f"{key}a"), branch(f"{key}b"))}


def woken(*run_ids: int) -> None:
    for run_id in run_ids:
        make_due(run_id=run_id)
    fire_due_timers()
    drive()


def test_a_patch_asked_at_the_top_and_in_a_branch_gives_an_old_run_one_answer(
    org: Organisation, api: APIClient
) -> None:
    CODE.update(top_asks=False, branch_asks=False)
    publish_code_workflow(org=org, name="code-patched-fan", version=1)
    old = run_start(
        org=org, automation_slug="code-patched-fan", run_input={"key": "o"}, start_key="o"
    ).run_id
    drive()
    assert Step.objects.get(run_id=old, step_id="nap").status == "waiting"
    CODE.update(top_asks=True, branch_asks=True)  # the fix deployed under the sleeping run
    try:
        new = run_start(org=org, automation_slug="code-patched-fan", run_input={"key": "n"},
                        start_key="n").run_id  # fmt: skip
        drive()
        woken(old, new)
        for correlation in ("oa", "ob", "na", "nb"):
            send_go(api, correlation)
        drive()
    finally:
        CODE.update(top_asks=False, branch_asks=False)
    new_run, old_run = Run.objects.get(pk=new), Run.objects.get(pk=old)
    assert (new_run.status, new_run.output) == (
        "succeeded", {"top": True, "branches": ["new", "new"]}), new_run.error  # fmt: skip
    # The old run took the old path at the top: its branches take it too.
    assert (old_run.status, old_run.output) == (
        "succeeded", {"top": False, "branches": ["old", "old"]}), old_run.error  # fmt: skip
    # The new run recorded its answer once, where it was first asked.
    assert Step.objects.filter(run_id=new, step_id="ctx.patched").count() == 1


def test_a_branch_that_recorded_its_own_answer_keeps_it(org: Organisation, api: APIClient) -> None:
    """A run whose branches asked a patch the top level did not (each branch recorded its
    answer), then code that asks it at the top level too: the old run's top level answers
    False (nothing recorded there), and each branch replays its own record, as it ran."""
    CODE.update(top_asks=False, branch_asks=True)
    publish_code_workflow(org=org, name="code-patched-fan", version=1)
    run_id = run_start(org=org, automation_slug="code-patched-fan", run_input={"key": "b"},
                       start_key="b").run_id  # fmt: skip
    try:
        drive()
        woken(run_id)  # the branches ask the patch, record it, and wait for "go"
        assert Step.objects.filter(run_id=run_id, step_id="ctx.patched").count() == 2
        CODE.update(top_asks=True)
        send_go(api, "ba")
        send_go(api, "bb")
        drive()
    finally:
        CODE.update(top_asks=False, branch_asks=False)
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == (
        "succeeded", {"top": False, "branches": ["new", "new"]}), run.error  # fmt: skip


# --- a run moved off a version no worker has ---------------------------------------------------


@workflow("code-dropped", version=1)
def dropped_v1(ctx: Context, run_input: Any) -> str:
    ctx.run("a", tag, "a")
    ctx.sleep("nap", "1h")
    return str(ctx.run("b", tag, "b"))


@workflow("code-dropped", version=2)
def dropped_v2(ctx: Context, run_input: Any) -> str:
    ctx.run("a", tag, "a")
    ctx.sleep("nap", "1h")
    return str(ctx.run("c", tag, "c"))


def napping_then(step_id: str) -> Any:
    def branch(c: Context) -> str:
        c.sleep("nap", "1h")
        return str(c.run(step_id, tag, step_id))

    return branch


@workflow("code-dropped-fan", version=1)
def dropped_fan_v1(ctx: Context, run_input: Any) -> Any:
    return ctx.parallel("fan", napping_then("b"), lambda c: c.run("y", tag, "y"))


@workflow("code-dropped-fan", version=2)
def dropped_fan_v2(ctx: Context, run_input: Any) -> Any:
    return ctx.parallel("fan", napping_then("c"), lambda c: c.run("y", tag, "y"))


@pytest.mark.parametrize(
    ("name", "v1_function", "output"),
    [("code-dropped", dropped_v1, "c"), ("code-dropped-fan", dropped_fan_v1, ["c", "y"])],
    ids=["top-level", "in-a-branch"],
)
def test_a_run_migrated_off_a_missing_version_is_no_longer_reported_and_goes_on(
    org: Organisation, name: str, v1_function: Any, output: Any
) -> None:
    """In a branch, the deferred turn is the branch's decider's (``fan.0``): it was left to
    wait out its 30 s while doctor already said every version was registered."""
    v1 = publish_code_workflow(org=org, name=name, version=1).number
    run_id = run_start(org=org, automation_slug=name, run_input={}, start_key="d").run_id
    drive()
    v2 = publish_code_workflow(org=org, name=name, version=2).number
    unregister(name, 1)  # a deploy dropped v1 under the sleeping run
    try:
        make_due(run_id=run_id)
        fire_due_timers()
        drive(fast_forward=False)  # its decide step is deferred, 30 s at a time
        assert finding(doctor()[1], "workflows.workflow_version_missing")["severity"] == "broken"
        plan = migration_plan(org=org, automation_slug=name, from_version=v1,
                              to_version=v2)  # fmt: skip
        assert migration_start(plan=plan, actor="ops").moved_now == 1
        found = finding(doctor()[1], "workflows.workflow_version_missing")
        drive(fast_forward=False)  # due at once: no deferral's 30 s passed
    finally:
        workflow(name, version=1)(v1_function)
    run = Run.objects.get(pk=run_id)
    assert found["severity"] == "ok", found["examples"]
    assert (run.status, run.output) == ("succeeded", output), run.error


# --- callables whose body would never run ------------------------------------------------------


class AsyncCallable:
    async def __call__(self, ctx: Context, run_input: Any) -> str:
        return "never awaited"


def generator(ctx: Context, run_input: Any) -> Any:
    ctx.run("a", str, "a")
    yield "never iterated"


@pytest.mark.parametrize("function", [AsyncCallable(), generator], ids=["async-call", "yields"])
def test_a_callable_whose_body_never_runs_is_refused_at_registration(function: Any) -> None:
    try:
        with pytest.raises(CodeWorkflowError) as refused:
            workflow("code-never-runs", version=1)(function)
        assert refused.value.code == "invalid_workflow"
    finally:
        if registered("code-never-runs", 1) is not None:
            unregister("code-never-runs", 1)


# --- a migration onto code the organisation may not run ----------------------------------------


@workflow("code-narrowed-move", version=1)
def narrowed_v1(ctx: Context, run_input: Any) -> str:
    ctx.sleep("nap", "1h")
    return "v1"


def narrowed_v2(ctx: Context, run_input: Any) -> str:
    ctx.sleep("nap", "1h")
    return "v2"


def test_runs_are_not_moved_onto_code_their_organisation_may_not_run(
    org: Organisation, api: APIClient
) -> None:
    """Version 2 was published while it allowed every organisation, then narrowed: the
    organisation's runs may not start on it, nor move onto it (they would run its code)."""
    v1 = publish_code_workflow(org=org, name="code-narrowed-move", version=1).number
    run_id = run_start(org=org, automation_slug="code-narrowed-move", run_input={},
                       start_key="m").run_id  # fmt: skip
    drive()
    workflow("code-narrowed-move", version=2)(narrowed_v2)
    try:
        v2 = publish_code_workflow(org=org, name="code-narrowed-move", version=2).number
        unregister("code-narrowed-move", 2)
        workflow("code-narrowed-move", version=2, organisations=["someone-else"])(narrowed_v2)
        answer = api.post(
            "/api/v1/automations/code-narrowed-move/migrations",
            {"from_version": v1, "to_version": v2, "dry_run": False}, format="json",
        )  # fmt: skip
    finally:
        unregister("code-narrowed-move", 2)
    assert answer.status_code == 403, answer.json()
    assert answer.json()["code"] == "workflow_not_allowed"
    assert Run.objects.get(pk=run_id).version.number == v1


def test_a_deferral_for_a_missing_version_is_read_by_its_code_not_its_message(
    org: Organisation,
) -> None:
    # The deferral's event says what it is as data (code, workflow, version) beside its
    # message for people; the doctor and a migration read the data: a message worded
    # otherwise (another release, a translation) changes neither.
    v1 = publish_code_workflow(org=org, name="code-dropped", version=1).number
    run_id = run_start(org=org, automation_slug="code-dropped", run_input={}, start_key="t").run_id
    drive()
    v2 = publish_code_workflow(org=org, name="code-dropped", version=2).number
    unregister("code-dropped", 1)
    try:
        make_due(run_id=run_id)
        fire_due_timers()
        drive(fast_forward=False)  # its decide step is deferred
        deferral = RunEvent.objects.filter(run_id=run_id, kind="step.deferred").latest("id")
        assert deferral.detail is not None
        assert {k: deferral.detail.get(k) for k in ("code", "workflow", "version")} == {
            "code": "workflow_version_missing", "workflow": "code-dropped", "version": 1,
        }  # fmt: skip
        RunEvent.objects.filter(pk=deferral.pk).update(
            detail={**deferral.detail, "error": "the code of this workflow is not here"}
        )
        assert finding(doctor()[1], "workflows.workflow_version_missing")["severity"] == "broken"
        plan = migration_plan(org=org, automation_slug="code-dropped", from_version=v1,
                              to_version=v2)  # fmt: skip
        assert migration_start(plan=plan, actor="ops").moved_now == 1
        drive(fast_forward=False)  # woken by the migration: no deferral's 30 s passed
    finally:
        workflow("code-dropped", version=1)(dropped_v1)
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", "c"), run.error


# --- a migration's check of code that raises after a call stopped it -------------------------


def guarded_nap(ctx: Context, then: str) -> str:
    finished = False
    try:
        ctx.sleep("nap", "1h")
        finished = True
    finally:
        if not finished:  # a cleanup that raises while the call stops the turn
            raise RuntimeError("cleanup before the nap ended")
    return str(ctx.run(then, tag, then))


@workflow("code-guarded", version=1)
def guarded_v1(ctx: Context, run_input: Any) -> str:
    return guarded_nap(ctx, "b")


@workflow("code-guarded", version=2)
def guarded_v2(ctx: Context, run_input: Any) -> str:
    return guarded_nap(ctx, "c")


def test_a_migration_s_check_ends_a_replay_with_the_call_that_stopped_it(
    org: Organisation,
) -> None:
    """The dry replay took the raise after the stop for the code's own failure: the run was
    refused (workflow_failed) though the new code fits its history."""
    v1 = publish_code_workflow(org=org, name="code-guarded", version=1).number
    run_id = run_start(org=org, automation_slug="code-guarded", run_input={}, start_key="g").run_id
    drive()
    assert Step.objects.get(run_id=run_id, step_id="nap").status == "waiting"
    v2 = publish_code_workflow(org=org, name="code-guarded", version=2).number
    plan = migration_plan(org=org, automation_slug="code-guarded", from_version=v1,
                          to_version=v2)  # fmt: skip
    report = dry_run(plan)
    assert (report.would_move, dict(report.cannot)) == (1, {})
    assert migration_start(plan=plan, actor="ops").moved_now == 1
    make_due(run_id=run_id)
    fire_due_timers()
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", "c"), run.error
