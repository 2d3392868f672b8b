"""Migrating code runs between versions of their code (docs/reference/code-workflows.md, "Moving
runs to another version"): the new version's code is replayed, dry, against each run's history
before it moves; a history it does not fit keeps the run where it is, with the reason; a version
this process does not register is refused. On the real engine and database."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from timers.sweep import fire_due_timers
from workflows.code.registry import unregister
from workflows.errors import WorkflowVersionMissing
from workflows.models import Organisation, Run, RunEvent, Step
from workflows.plugins.code import Context, publish_code_workflow, workflow
from workflows.services.run_migration import dry_run, migration_plan, migration_start
from workflows.services.runs import run_start

from .effect_setup import drive
from .test_timers import make_due

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: list[str] = []  # each ctx.run function called, in order


def called(name: str) -> str:
    CALLS.append(name)
    return name


@workflow("code-move", version=1)
def first(ctx: Context, run_input: dict[str, Any]) -> str:
    ctx.run("a", called, "a")
    ctx.sleep("nap", "1h")
    return str(ctx.run("b", called, "b"))


@workflow("code-move", version=2)
def second(ctx: Context, run_input: dict[str, Any]) -> str:
    """Fits a history of the first: the same steps up to the sleep, another after it."""
    ctx.run("a", called, "a")
    ctx.sleep("nap", "1h")
    return str(ctx.run("c", called, "c"))


@workflow("code-move", version=3)
def third(ctx: Context, run_input: dict[str, Any]) -> str:
    """Does not fit: it calls another step where the history has "a"."""
    ctx.run("z", called, "z")
    ctx.sleep("nap", "1h")
    return "z"


@workflow("code-move", version=4)
def fourth(ctx: Context, run_input: dict[str, Any]) -> str:
    ctx.run("a", called, "a")
    raise RuntimeError("broken on every history")


@workflow("code-move", version=6)
def sixth(ctx: Context, run_input: dict[str, Any]) -> str:
    """Never gets past its first recorded step: its code between steps spins."""
    ctx.run("a", called, "a")
    while True:
        pass


class Unreadable(Exception):
    def __str__(self) -> str:
        return f"order {self.order}"  # type: ignore[attr-defined]  # never set


@workflow("code-move", version=7)
def seventh(ctx: Context, run_input: dict[str, Any]) -> str:
    """Fails on every history, with a NUL in what it says."""
    ctx.run("a", called, "a")
    ctx.fail("out of stock \x00")


@workflow("code-move", version=8)
def eighth(ctx: Context, run_input: dict[str, Any]) -> str:
    """Fails on every history, with an exception whose message cannot be read."""
    ctx.run("a", called, "a")
    raise Unreadable()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    CALLS.clear()


def sleeping_run(org: Organisation) -> tuple[int, dict[int, int]]:
    """A run of version 1 asleep after "a", and the automation's version numbers by code
    version (all published, version 1 first)."""
    numbers = {1: publish_code_workflow(org=org, name="code-move", version=1).number}
    run_id = run_start(org=org, automation_slug="code-move", run_input={},
                       start_key="m1").run_id  # fmt: skip
    drive()
    assert Step.objects.get(run_id=run_id, step_id="nap").status == "waiting"
    for version in (2, 3, 4, 6):
        numbers[version] = publish_code_workflow(org=org, name="code-move", version=version).number
    CALLS.clear()
    return run_id, numbers


def plan_to(org: Organisation, numbers: dict[int, int], version: int) -> Any:
    return migration_plan(org=org, automation_slug="code-move", from_version=numbers[1],
                          to_version=numbers[version])  # fmt: skip


def test_a_code_run_moves_to_a_version_whose_code_fits_its_history(
    org: Organisation, api: APIClient
) -> None:
    run_id, numbers = sleeping_run(org)
    url = "/api/v1/automations/code-move/migrations"
    body = {"from_version": numbers[1], "to_version": numbers[2]}
    preview = api.post(url, {**body, "dry_run": True}, format="json")
    assert preview.status_code == 200, preview.json()
    report = preview.json()["report"]
    assert (report["would_move"], report["cannot"]) == (1, {})
    assert [(s["step_id"], s["to"], s["how"]) for s in report["steps"]] == [
        ("nap", "nap", "mapped")
    ]
    assert CALLS == []  # the dry replay called no ctx.run function

    done = api.post(url, {**body, "dry_run": False}, format="json")
    assert done.status_code == 200, done.json()
    assert done.json()["moved_now"] == 1
    run = Run.objects.get(pk=run_id)
    assert run.version.number == numbers[2]
    assert Step.objects.get(run_id=run_id, step_id="nap").status == "waiting"  # kept as it was
    assert CALLS == []

    make_due(run_id=run_id)
    assert fire_due_timers().fired == 1
    drive()
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "c")
    assert CALLS == ["c"]  # "a" replayed from the history; the new code's own step after it


def test_a_code_run_whose_history_the_new_code_does_not_fit_stays_with_the_reason(
    org: Organisation,
) -> None:
    run_id, numbers = sleeping_run(org)
    for version, reason in ((3, "nondeterministic_workflow"), (4, "workflow_failed")):
        plan = plan_to(org, numbers, version)
        report = dry_run(plan)
        assert report.would_move == 0
        assert report.cannot[reason]["runs"] == 1
        assert report.cannot[reason]["sample"] == [run_id]

        progress = migration_start(plan=plan, actor="ops")
        assert progress.moved_now == 0
        job_report = progress.job.report
        assert job_report is not None
        assert job_report["would_move"] == 0
        assert job_report["cannot"][reason]["sample"] == [run_id]
        refused = RunEvent.objects.filter(run_id=run_id, kind="run.migration_refused")
        event = refused.order_by("id").last()
        assert event is not None and event.detail is not None
        assert event.detail["code"] == reason
        assert event.detail["to_version"] == numbers[version]
    assert CALLS == []
    run = Run.objects.get(pk=run_id)
    assert run.version.number == numbers[1] and run.status == "running"
    assert not RunEvent.objects.filter(run_id=run_id, kind="run.migrated").exists()

    # The run goes on, on its own version.
    make_due(run_id=run_id)
    fire_due_timers()
    drive()
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "b")


@pytest.mark.parametrize(
    ("version", "detail"),
    [
        (7, "workflow_failed: out of stock \\x00"),
        (8, "workflow_failed: Unreadable: (its message cannot be read: AttributeError)"),
    ],
)
def test_a_misfit_whose_text_holds_a_nul_or_cannot_be_read_is_reported_not_a_500(
    org: Organisation, api: APIClient, version: int, detail: str
) -> None:
    """The reason is kept in the run's run.migration_refused event (jsonb refuses a NUL);
    an exception's __str__ that raises was raised again by the replay's own handler."""
    run_id, numbers = sleeping_run(org)
    numbers[version] = publish_code_workflow(org=org, name="code-move", version=version).number
    url = "/api/v1/automations/code-move/migrations"
    body = {"from_version": numbers[1], "to_version": numbers[version]}
    for dry in (True, False):
        answer = api.post(url, {**body, "dry_run": dry}, format="json")
        assert answer.status_code == 200, answer.content
    event = RunEvent.objects.get(run_id=run_id, kind="run.migration_refused")
    assert event.detail is not None
    assert (event.detail["code"], event.detail["detail"]) == ("workflow_failed", detail)
    assert Run.objects.get(pk=run_id).version.number == numbers[1]


@workflow("code-move-fork", version=1)
def fork_first(ctx: Context, run_input: dict[str, Any]) -> Any:
    return ctx.parallel("pair", lambda c: c.sleep("nap", "1h"), lambda c: c.run("o", str, "o"))


@workflow("code-move-fork", version=2)
def fork_wrong_context(ctx: Context, run_input: dict[str, Any]) -> Any:
    def napping(c: Context) -> None:
        ctx.run("x", called, "x")  # the context around the parallel, not c
        c.sleep("nap", "1h")

    return ctx.parallel("pair", napping, lambda c: c.run("o", str, "o"))


def test_a_branch_calling_a_step_on_the_context_around_it_does_not_fit(
    org: Organisation,
) -> None:
    """Its dry replay took the call for new work and the run for one that fits: moved, it
    would fail at its next turn."""
    first = publish_code_workflow(org=org, name="code-move-fork", version=1).number
    run_id = run_start(org=org, automation_slug="code-move-fork", run_input={},
                       start_key="f").run_id  # fmt: skip
    drive()
    assert Step.objects.get(run_id=run_id, step_id="nap").status == "waiting"
    second = publish_code_workflow(org=org, name="code-move-fork", version=2).number
    plan = migration_plan(org=org, automation_slug="code-move-fork", from_version=first,
                          to_version=second)  # fmt: skip
    report = dry_run(plan)
    assert (report.would_move, report.cannot["invalid_code_step"]["sample"]) == (0, [run_id])
    assert CALLS == []


def test_code_that_spins_in_the_dry_replay_is_cut_at_the_turn_budget_and_the_run_stays(
    org: Organisation, settings: Any
) -> None:
    run_id, numbers = sleeping_run(org)
    settings.WAYMARK = {**settings.WAYMARK, "CODE_TURN_MS": 200.0}
    report = dry_run(plan_to(org, numbers, 6))  # as a web request's preview does: it returns
    assert report.would_move == 0
    assert report.cannot["code_turn_budget_exceeded"]["sample"] == [run_id]
    assert Run.objects.get(pk=run_id).version.number == numbers[1]


def test_a_migration_to_a_version_not_registered_here_is_refused(
    org: Organisation, api: APIClient
) -> None:
    run_id, numbers = sleeping_run(org)
    unregister("code-move", 4)
    try:
        with pytest.raises(WorkflowVersionMissing):
            plan_to(org, numbers, 4)
        refused = api.post("/api/v1/automations/code-move/migrations",
                           {"from_version": numbers[1], "to_version": numbers[4]},
                           format="json")  # fmt: skip
        assert refused.status_code == 400, refused.json()
        assert refused.json()["code"] == "workflow_version_missing"
        out = io.StringIO()
        with pytest.raises(Exception, match="workflow_version_missing"):
            call_command("migrate_runs", "--org", org.slug, "--automation", "code-move",
                         "--from", str(numbers[1]), "--to", str(numbers[4]), "--dry-run",
                         stdout=out)  # fmt: skip
    finally:
        workflow("code-move", version=4)(fourth)
    assert Run.objects.get(pk=run_id).version.number == numbers[1]


def test_a_run_waiting_for_a_version_no_longer_deployed_moves_without_its_code_being_run(
    org: Organisation,
) -> None:
    numbers = {2: publish_code_workflow(org=org, name="code-move", version=2).number}

    @workflow("code-move", version=5)
    def dropped(ctx: Context, run_input: dict[str, Any]) -> str:
        return str(ctx.run("a", called, "a"))

    numbers[5] = publish_code_workflow(org=org, name="code-move", version=5).number
    unregister("code-move", 5)  # a later deploy dropped it
    run_id = run_start(org=org, automation_slug="code-move", run_input={},
                       start_key="gone").run_id  # fmt: skip
    drive(fast_forward=False)  # its decider is deferred: workflow_version_missing
    decide = Step.objects.get(run_id=run_id, step_id="decide")
    assert (decide.status, decide.wait_kind) == ("waiting", "retry")

    plan = migration_plan(org=org, automation_slug="code-move", from_version=numbers[5],
                          to_version=numbers[2])  # fmt: skip
    assert dry_run(plan).would_move == 1
    assert migration_start(plan=plan, actor="ops").moved_now == 1
    # The dry replays met new work at once (the run's history is empty) and stopped there:
    # the new code's first ctx.run function was not called by either.
    assert CALLS == []
    drive()
    assert CALLS == ["a"]
    run = Run.objects.get(pk=run_id)
    assert run.version.number == numbers[2] and run.status == "running"
    assert Step.objects.get(run_id=run_id, step_id="nap").status == "waiting"


# A definition an organisation publishes as a version of the code workflow's automation: a
# wait, and one step the code workflow's versions call too.
TENANT_DEFINITION = {
    "start": "a",
    "steps": [
        {"id": "a", "type": "wait", "duration": "1h", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


def test_runs_never_move_between_a_code_version_and_a_definition_s(
    org: Organisation, api: APIClient
) -> None:
    """Either way the plan is refused, as a preview and for real, and nothing moves: a
    definition's run moved onto a code version skipped the code's checks (its organisations,
    whether it is registered here, whether its history fits), so the host's code ran for an
    organisation it does not name."""
    run_id, numbers = sleeping_run(org)
    published = api.post("/api/v1/automations/code-move/versions",
                         {"definition": TENANT_DEFINITION}, format="json")  # fmt: skip
    assert published.status_code == 201, published.json()
    tenant = published.json()["number"]
    made_live = api.post(f"/api/v1/automations/code-move/versions/{tenant}/publish")
    assert made_live.status_code == 200, made_live.json()
    url = "/api/v1/automations/code-move/migrations"
    for old, new in ((numbers[1], tenant), (tenant, numbers[2])):
        for dry in (True, False):
            refused = api.post(url, {"from_version": old, "to_version": new, "dry_run": dry},
                               format="json")  # fmt: skip
            assert refused.status_code == 400, refused.json()
            assert refused.json()["code"] == "migration_between_kinds", refused.json()
    assert Run.objects.get(pk=run_id).version.number == numbers[1]


def test_a_definition_may_not_hold_the_step_that_records_a_function_s_result(
    api: APIClient,
) -> None:
    """A ``code_result`` step is the engine's record of what a ``ctx.run`` function returned:
    a definition that held one was accepted, and a code run's replay could read it as the
    host's function's own result."""
    forged = {
        "start": "check",
        "steps": [
            {"id": "check", "type": "code_result", "output": "forged", "next": "done"},
            {"id": "done", "type": "end"},
        ],
    }
    assert api.post("/api/v1/automations", {"slug": "forger"}, format="json").status_code == 201
    refused = api.post("/api/v1/automations/forger/versions", {"definition": forged},
                       format="json")  # fmt: skip
    assert refused.status_code == 400, refused.json()
    assert refused.json()["code"] == "invalid_definition", refused.json()
    issues = [(issue["step"], issue["code"]) for issue in refused.json()["errors"]]
    assert issues == [("check", "code_step_not_allowed")], refused.json()
