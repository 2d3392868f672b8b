"""What a code workflow's replay hands back beyond step outputs (workflows/code/context.py):
time, ids and randomness recorded once (ctx.now, ctx.uuid, ctx.random), patches that change
behaviour for new runs only (ctx.patched), and step outcomes. On the real engine and
database: steps run through a real Worker's code path, in this process or in a worker
process of its own."""

from __future__ import annotations

import subprocess
from datetime import datetime
from typing import Any

import pytest
from django.db.models.functions import Now
from django.test import Client
from rest_framework.test import APIClient

from effects.models import Suppression
from timers.sweep import fire_due_timers
from workflows.engine.sweep import sweep_once
from workflows.models import Organisation, Run, Step
from workflows.plugins.code import Context, publish_code_workflow, workflow
from workflows.plugins.testing import WorkflowTest
from workflows.services.runs import run_start

from . import code_workflow_steps  # noqa: F401 (registers "code-values" here too)
from .effect_setup import connect, drive
from .processes import running, spawn, stop, wait_for
from .test_timers import make_due

pytestmark = pytest.mark.django_db(transaction=True)


def code_worker() -> subprocess.Popen[bytes]:
    modules = "tests.probe_steps,tests.code_workflow_steps"
    return spawn("worker", "--lane", "io", "--concurrency", "2", "--grace", "5",
                 WAYMARK_EXTRA_STEP_MODULES=modules)  # fmt: skip


def fire_timers_of(run_id: int) -> None:
    make_due(run_id=run_id)
    assert fire_due_timers().fired == 1


def path_of(run_id: int) -> list[tuple[str, int, str, str]]:
    steps = Step.objects.filter(run_id=run_id).order_by("id")
    return [(s.step_id, s.iteration, s.type, s.status) for s in steps if s.step_id != "decide"]


def start(org: Organisation, name: str, key: str, run_input: Any = None) -> int:
    publish_code_workflow(org=org, name=name, version=1)
    return run_start(org=org, automation_slug=name, run_input=run_input or {},
                     start_key=key).run_id  # fmt: skip


# --- ctx.now(), ctx.uuid(), ctx.random() ------------------------------------------------------


def test_time_ids_and_randomness_are_recorded_once_and_replayed_in_another_process(
    org: Organisation, api: APIClient, admin_client: Client
) -> None:
    run_id = start(org, "code-values", "v")
    drive()  # in this process: each value is recorded, then the run sleeps
    assert path_of(run_id) == [
        ("ctx.now", 1, "code_result", "done"),
        ("ctx.uuid", 1, "code_result", "done"),
        ("ctx.random", 1, "code_result", "done"),
        ("seen", 1, "code_result", "done"),
        ("nap", 1, "wait", "waiting"),
    ]
    seen = Step.objects.get(run_id=run_id, step_id="seen").output
    assert isinstance(seen, dict)
    recorded = {s.step_id: s.output for s in Step.objects.filter(run_id=run_id)}
    assert recorded["ctx.now"] == seen["now"] and recorded["ctx.uuid"] == seen["uuid"]
    assert recorded["ctx.random"] == seen["random"] and 0 <= seen["random"] < 1

    # After the sleep, a worker process of its own (its own clock, its own random state)
    # replays the function from the top: every value is the one recorded before the sleep.
    fire_timers_of(run_id)
    worker = code_worker()
    with running(worker):
        wait_for(lambda: Run.objects.get(pk=run_id).status != "running", what="the run to end")
        stop(worker)
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("succeeded", "")
    assert isinstance(run.output, dict)
    assert {key: run.output[key] for key in ("now", "uuid", "random")} == seen
    assert datetime.fromisoformat(run.output["later"]) > datetime.fromisoformat(seen["now"])
    assert Step.objects.filter(run_id=run_id, step_id="ctx.now").count() == 2  # two calls
    # The recorded values' rows read as any step's (their ids hold a dot).
    steps = api.get(f"/api/v1/runs/{run_id}/steps")
    assert steps.status_code == 200
    listed = steps.json()["results"] if isinstance(steps.json(), dict) else steps.json()
    assert {"ctx.now", "ctx.uuid", "ctx.random"} <= {step["step_id"] for step in listed}
    assert api.get(f"/api/v1/runs/{run_id}/history").status_code == 200
    assert admin_client.get(f"/admin/workflows/run/{run_id}/change/").status_code == 200


SEEN_IN_TURNS: list[tuple[str, float]] = []


@workflow("code-values-turns", version=1)
def values_every_turn(ctx: Context, run_input: dict[str, Any]) -> str:
    SEEN_IN_TURNS.append((str(ctx.uuid()), ctx.random()))
    ctx.run("one", str, "1")
    ctx.run("two", str, "2")
    return "done"


def test_every_decide_turn_sees_the_same_recorded_values(org: Organisation) -> None:
    SEEN_IN_TURNS.clear()
    run_id = start(org, "code-values-turns", "t")
    drive()
    assert Run.objects.get(pk=run_id).status == "succeeded"
    recorded = {s.step_id: s.output for s in Step.objects.filter(run_id=run_id)}
    # The turns once both were recorded (entering "one", "two", then the end; and the
    # turns inline in a settle that handed a ctx.run call to a worker) each saw exactly the
    # recorded values.
    seen = list(SEEN_IN_TURNS)
    assert len(seen) >= 3
    assert set(seen) == {(recorded["ctx.uuid"], recorded["ctx.random"])}


SENT: list[str] = []
SEEN_LOADED: list[str] = []


def send(key: str) -> str:
    SENT.append(key)
    return f"sent {key}"


@workflow("code-stored-forms", version=1)
def stored_forms(ctx: Context, run_input: dict[str, Any]) -> list[str]:
    loaded = ctx.run("load", lambda: {"bb": 1, "a": (2, 1e16, -0.0), 7: "seven"})
    SEEN_LOADED.append(repr(loaded))
    sent = []
    for key in loaded:
        sent.append(ctx.run("send", send, key))
        ctx.sleep("nap", "1m")
    return sent


def test_a_result_meets_the_code_as_the_database_keeps_it_in_every_turn(
    org: Organisation,
) -> None:
    """The turn right after a step, in the same settle, replays a history carried from the
    turn before; every later one (after the nap) reads it back from the database, whose jsonb
    orders an object's keys its own way and writes 1e16 as an integer. Handed the value as
    made first and as stored later, the loop went over the keys in two orders: it sent "bb"
    twice and never "a", and the run succeeded."""
    SENT.clear()
    SEEN_LOADED.clear()
    t = WorkflowTest(org=org)
    t.start("code-stored-forms", version=1, input={})
    for _ in range(3):
        t.run_until_waiting()
        t.skip_time()
    run = t.run_until_finished()
    assert (run.status, run.output) == ("succeeded", ["sent 7", "sent a", "sent bb"]), run.error
    assert SENT == ["7", "a", "bb"]  # each key once, in the order jsonb keeps them
    assert set(SEEN_LOADED) == {repr({"7": "seven", "a": [2, 10**16, 0.0], "bb": 1})}


# --- ctx.patched() ---------------------------------------------------------------------------

# The code "code-patch" runs: "old", "patched", "unpatched" (the new path alone), then, once
# the old path's runs have ended, "deprecated" (the new path, the patch retired) and
# "removed" (the new path, no call).
PATCH = {"code": "old"}


@workflow("code-patch", version=1)
def patchable(ctx: Context, run_input: dict[str, Any]) -> str:
    code = PATCH["code"]
    if code == "deprecated":
        ctx.deprecate_patch("fix-x")
    if code in ("unpatched", "deprecated", "removed") or (
        code == "patched" and ctx.patched("fix-x")
    ):
        ctx.run("new_way", str, "new")
        path = "new"
    else:
        ctx.run("old_way", str, "old")
        path = "old"
    ctx.sleep("nap", "1s")
    if code in ("patched", "deprecated") and ctx.patched("fix-x"):  # asked again: the same
        return f"{path}+patched"
    return path


def test_a_patch_changes_new_runs_only_and_its_answer_is_recorded(org: Organisation) -> None:
    old_run = start(org, "code-patch", "old")
    drive()
    assert Step.objects.get(run_id=old_run, step_id="nap").status == "waiting"
    PATCH["code"] = "patched"  # the code changed under the waiting run
    try:
        new_run = run_start(org=org, automation_slug="code-patch", run_input={},
                            start_key="new").run_id  # fmt: skip
        drive()
        assert Step.objects.get(run_id=new_run, step_id="nap").status == "waiting"
        fire_timers_of(old_run)
        fire_timers_of(new_run)
        drive()
    finally:
        PATCH["code"] = "old"
    old, new = Run.objects.get(pk=old_run), Run.objects.get(pk=new_run)
    # The old run's history has old_way where the patch is asked: it keeps its path.
    assert (old.status, old.error, old.output) == ("succeeded", "", "old")
    assert [s[0] for s in path_of(old_run)] == ["old_way", "nap"]
    # The new run reached the patch first on the patched code: recorded, and kept.
    assert (new.status, new.error, new.output) == ("succeeded", "", "new+patched")
    assert path_of(new_run) == [
        ("ctx.patched", 1, "code_result", "done"),
        ("new_way", 1, "code_result", "done"),
        ("nap", 1, "wait", "done"),
    ]
    assert Step.objects.get(run_id=new_run, step_id="ctx.patched").output == {"patch": "fix-x"}


def test_the_same_change_without_a_patch_fails_the_old_run_loudly(org: Organisation) -> None:
    """What the patch is for: the new path alone calls new_way where the history has
    old_way."""
    run_id = start(org, "code-patch", "unpatched")
    drive()
    PATCH["code"] = "unpatched"
    try:
        fire_timers_of(run_id)
        drive()
    finally:
        PATCH["code"] = "old"
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and "nondeterministic_workflow" in run.error


def test_a_deprecated_patch_replays_the_runs_that_recorded_it_and_records_nothing_new(
    org: Organisation,
) -> None:
    """Retiring a patch: runs that took it replay past its record; new runs record nothing,
    so once they are the only ones left the call itself can go; a run that took the old
    path fails loudly, as it would on the new path alone."""
    codes = {"took": "patched", "old-path": "old", "fresh": "deprecated"}
    runs = {}
    try:
        for key, code in codes.items():  # each waits at its sleep, started on its code
            PATCH["code"] = code
            runs[key] = start(org, "code-patch", key)
            drive()
            assert Step.objects.get(run_id=runs[key], step_id="nap").status == "waiting", key
        PATCH["code"] = "deprecated"  # the patch retired under the waiting runs
        later = run_start(org=org, automation_slug="code-patch", run_input={},
                          start_key="later").run_id  # fmt: skip
        drive()
        for key in ("took", "old-path", "fresh"):
            fire_timers_of(runs[key])
        drive()
        PATCH["code"] = "removed"  # and then the call: only runs that recorded nothing left
        fire_timers_of(later)
        drive()
    finally:
        PATCH["code"] = "old"
    took, old_path, fresh, after = (
        Run.objects.get(pk=runs["took"]),
        Run.objects.get(pk=runs["old-path"]),
        Run.objects.get(pk=runs["fresh"]),
        Run.objects.get(pk=later),
    )
    # The run that recorded the patch replays past its record, on the new path.
    assert (took.status, took.error, took.output) == ("succeeded", "", "new+patched")
    assert [s[0] for s in path_of(took.id)] == ["ctx.patched", "new_way", "nap"]
    # A run that reached the retired patch with nothing recorded recorded nothing.
    assert (fresh.status, fresh.error, fresh.output) == ("succeeded", "", "new+patched")
    assert [s[0] for s in path_of(fresh.id)] == ["new_way", "nap"]
    # With the call removed, such a run replays as before.
    assert (after.status, after.error, after.output) == ("succeeded", "", "new")
    assert [s[0] for s in path_of(after.id)] == ["new_way", "nap"]
    # The old path's run: the retired patch is the new path alone for it.
    assert old_path.status == "failed", old_path.error
    assert "nondeterministic_workflow" in old_path.error and "old_way" in old_path.error


def test_a_patch_name_that_is_not_a_slug_fails_the_run_with_a_code(org: Organisation) -> None:
    @workflow("code-patch-bad", version=1)
    def bad_patch(ctx: Context, run_input: dict[str, Any]) -> bool:
        return ctx.patched("Fix X")

    run_id = start(org, "code-patch-bad", "bad")
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and "invalid_code_step: patch 'Fix X'" in run.error


# --- step outcomes ---------------------------------------------------------------------------


@workflow("code-outcomes", version=1)
def with_outcomes(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    sent = ctx.step_result("send", "email", connection="mail", to=run_input["to"],
                           subject="Hi", body="Hello")  # fmt: skip
    ctx.run("after", str, "x")  # a later turn: the outcome now comes from the history
    return {"outcome": sent.outcome, "output": sent.output}


def test_an_email_step_s_outcome_comes_back_on_every_replay(
    org: Organisation, smtp_stub: Any
) -> None:
    connect(org, provider="email", name="mail",
            options={"host": smtp_stub.host, "port": smtp_stub.port})  # fmt: skip
    Suppression.objects.create(org=org, channel="email", address="gone@example.com",
                               reason="unsubscribed")  # fmt: skip
    gone = start(org, "code-outcomes", "gone", {"to": "gone@example.com"})
    kept = run_start(org=org, automation_slug="code-outcomes", start_key="kept",
                     run_input={"to": "kept@example.com"}).run_id  # fmt: skip
    drive()
    run = Run.objects.get(pk=gone)
    assert (run.status, run.error) == ("succeeded", "")
    assert run.output == {
        "outcome": "suppressed",
        "output": {"suppressed": True, "to": "gone@example.com", "reason": "unsubscribed"},
    }
    sent = Run.objects.get(pk=kept)
    assert sent.status == "succeeded" and sent.output is not None
    assert sent.output["outcome"] == "ok"
    assert len(smtp_stub.messages) == 1  # the suppressed address was never sent to
    # The step's own row keeps its output only, as a definition's: the turn after it
    # recorded the outcome.
    assert Step.objects.get(run_id=gone, step_id="send").output == run.output["output"]
    turn = Step.objects.get(run_id=gone, step_id="decide", iteration=2)
    assert turn.output is not None
    assert turn.output["ended"] == {"step": "send", "outcome": "suppressed"}


@workflow("code-signal-outcome", version=1)
def signal_outcome(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    fields = {"signal": "paid", "correlation": run_input["order"], "timeout": "1h"}
    waited = ctx.step_result("paid", "wait_signal", **fields)
    ctx.run("after", str, "x")
    again = ctx.wait_signal("paid_again", **fields)
    return {"outcome": waited.outcome, "timed_out_again": again.timed_out}


def test_a_signal_wait_that_times_out_gives_its_outcome_back(org: Organisation) -> None:
    run_id = start(org, "code-signal-outcome", "late", {"order": "o-9"})
    for step_id in ("paid", "paid_again"):
        drive()
        assert Step.objects.get(run_id=run_id, step_id=step_id).status == "waiting"
        Step.objects.filter(run_id=run_id, step_id=step_id).update(wake_at=Now())
        assert sweep_once().deadlines == 1
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("succeeded", "")
    assert run.output == {"outcome": "timed_out", "timed_out_again": True}
