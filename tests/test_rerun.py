"""Re-run from a step, with edited input or vars (issue 30 part 4).

A finished run runs again from the step an operator chooses, its input or vars corrected
(the change in its history); settled effects are taken, not made again, unless the operator
says so (then each is a new call under its new key); the choice is shown before confirming.
Every refusal changes nothing.

Driven in this process (a Worker's code path, tests/effect_setup.drive); the chain an
operator fixes, on the real engine, is in tests/test_rerun_processes.py.
"""

from __future__ import annotations

import time
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from effects.models import Effect
from timers.sweep import fire_due_timers
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim
from workflows.engine.worker import Attempt, Worker
from workflows.errors import (
    InvalidInput,
    PayloadTooLarge,
    RerunStepIsCompensation,
    RerunStepNotTopLevel,
    RunningRunsQuota,
    RunStateConflict,
    UnknownRun,
    UnknownStep,
    WaymarkError,
)
from workflows.models import AuditEntry, Organisation, Run, RunEvent, Step
from workflows.services import quotas
from workflows.services.control import run_act
from workflows.services.rerun import rerun

from .effect_setup import connect, drive, events, start
from .test_timers import make_due

pytestmark = pytest.mark.django_db(transaction=True)


def history(run_id: int) -> list[str]:
    return list(
        RunEvent.objects.filter(run_id=run_id).order_by("id").values_list("kind", flat=True)
    )


# --- in this process ------------------------------------------------------------------------------


def looping(url: str) -> dict[str, Any]:
    """ping (an effect) entered `input.turns` times, then charge, then done."""
    ping = {"method": "POST", "url": f"{url}/items", "body": {"op": "ping"}}
    charge = {"method": "POST", "url": url + "/{{ input.charge_path }}", "body": {"op": "charge"}}
    return {
        "start": "ping",
        "steps": [
            {"id": "ping", "type": "http", "connection": "api", "request": ping, "next": "count"},
            {"id": "count", "type": "set",
             "values": {"turns": "{{ vars.turns | default('') }}x"}, "next": "again"},
            {"id": "again", "type": "branch",
             "when": [{"outcome": "back", "if": "vars.turns | length < input.turns"}],
             "next": {"back": "ping", "default": "charge"}},
            {"id": "charge", "type": "http", "connection": "api", "request": charge,
             "retry": {"max_attempts": 1}, "next": "done"},
            {"id": "done", "type": "end"},
        ],
        "limits": {"max_steps": 40},
    }  # fmt: skip


def pings(stub: Any) -> int:
    return sum(1 for item in stub.created if item["body"] == {"op": "ping"})


def test_a_loop_after_the_re_run_point_reuses_the_kth_effect_for_its_kth_pass(
    org: Organisation, provider_stub: Any
) -> None:
    connect(org, base_url=provider_stub.url, timeout_seconds=5)
    run_id = start(org, looping(provider_stub.url), run_input={"turns": 2, "charge_path": "nope"})
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and pings(provider_stub) == 2

    # Three passes now (the loop's count reset through the vars): the first two take the
    # two pings made, the third is a new call.
    preview = rerun(org=org, run_id=run_id, from_step="ping", actor="test:ops",
                    run_input={"turns": 3, "charge_path": "items"}, variables={})  # fmt: skip
    assert [(e.key, e.action, e.new_key) for e in preview.effects] == [
        (f"{run_id}/ping/1", "reuse", f"{run_id}/ping/3"),
        (f"{run_id}/ping/2", "reuse", f"{run_id}/ping/4"),
    ]  # fmt: skip
    assert preview.vars_changes == [{"key": "turns", "before": "xx"}]
    rerun(org=org, run_id=run_id, from_step="ping", actor="test:ops", dry_run=False,
          run_input={"turns": 3, "charge_path": "items"}, variables={})  # fmt: skip
    drive()
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert pings(provider_stub) == 3
    reused = [((e.detail or {})["key"], (e.detail or {})["reused"])
              for e in events(run_id, "effect.reused")]  # fmt: skip
    assert reused == [(f"{run_id}/ping/3", f"{run_id}/ping/1"),
                      (f"{run_id}/ping/4", f"{run_id}/ping/2")]  # fmt: skip
    made = Effect.objects.filter(run_id=run_id, step_id="ping").order_by("iteration")
    assert [(e.iteration, e.state) for e in made] == [
        (1, "settled"),
        (2, "settled"),
        (5, "settled"),
    ]


def saga(url: str) -> dict[str, Any]:
    """reserve -> ship (its path from the input) -> done; reserve is undone by unreserve."""

    def call(sid: str, path: str, **extra: Any) -> dict[str, Any]:
        request = {"method": "POST", "url": url + path, "body": {"op": sid}}
        return {"id": sid, "type": "http", "connection": "api", "request": request, **extra}

    return {
        "start": "reserve",
        "steps": [
            call("reserve", "/items", next="ship", compensate="unreserve"),
            call("ship", "/{{ input.ship }}", next="done", retry={"max_attempts": 1}),
            {"id": "done", "type": "end"},
            call("unreserve", "/items"),
        ],
    }


def made(stub: Any) -> list[str]:
    return [item["body"]["op"] for item in stub.created]


def test_a_compensated_run_re_run_makes_again_what_its_compensation_undid(
    org: Organisation, provider_stub: Any
) -> None:
    connect(org, base_url=provider_stub.url, timeout_seconds=5)
    run_id = start(org, saga(provider_stub.url), run_input={"ship": "nope"})
    drive()
    assert Run.objects.get(pk=run_id).status == "compensated"
    assert made(provider_stub) == ["reserve", "unreserve"]

    with pytest.raises(RerunStepIsCompensation):
        rerun(org=org, run_id=run_id, from_step="unreserve", actor="ops", dry_run=False)
    preview = rerun(org=org, run_id=run_id, from_step="reserve", actor="ops",
                    run_input={"ship": "items"})  # fmt: skip
    assert [(e.step_id, e.action) for e in preview.effects] == [("reserve", "repeat")]
    assert "compensation undid it" in preview.effects[0].why
    rerun(org=org, run_id=run_id, from_step="reserve", actor="ops", dry_run=False,
          run_input={"ship": "items"})  # fmt: skip
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", run.error
    assert made(provider_stub) == ["reserve", "unreserve", "reserve", "ship"]


def test_a_re_run_that_fails_again_compensates_only_what_it_did(
    org: Organisation, provider_stub: Any
) -> None:
    connect(org, base_url=provider_stub.url, timeout_seconds=5)
    run_id = start(org, saga(provider_stub.url), run_input={"ship": "nope"})
    drive()
    assert Run.objects.get(pk=run_id).status == "compensated"
    # From ship, still refused: the reservation undone before is not undone a second time,
    # and the run ends failed (nothing of this walk to compensate), not stuck compensating.
    rerun(org=org, run_id=run_id, from_step="ship", actor="ops", dry_run=False)
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed" and "step 'ship' failed" in run.error
    assert made(provider_stub) == ["reserve", "unreserve"]
    assert len(events(run_id, "run.compensating")) == 1


def one_call(url: str) -> dict[str, Any]:
    """first (fails when told to) -> second (an effect) -> done."""
    return {
        "start": "first",
        "steps": [
            {"id": "first", "type": "http", "connection": "api", "retry": {"max_attempts": 1},
             "request": {"method": "POST", "url": url + "/{{ input.path }}", "body": {}},
             "next": "second"},
            {"id": "second", "type": "http", "connection": "api",
             "request": {"method": "POST", "url": f"{url}/items", "body": {"op": "second"}},
             "next": "done"},
            {"id": "done", "type": "end"},
        ],
    }  # fmt: skip


def test_a_retry_after_a_re_run_runs_again_only_what_failed_since(
    org: Organisation, provider_stub: Any
) -> None:
    connect(org, base_url=provider_stub.url, timeout_seconds=5)
    run_id = start(org, one_call(provider_stub.url), run_input={"path": "nope"})
    drive()
    assert Run.objects.get(pk=run_id).status == "failed"
    # Past `first` now; `second` is refused this time: the retry runs `second` again, not
    # `first`, which failed in the walk the re-run replaced.
    rerun(org=org, run_id=run_id, from_step="second", actor="ops", dry_run=False)
    provider_stub.fail_next(1, status=400, path_prefix="/items")
    drive()
    assert Run.objects.get(pk=run_id).status == "failed"
    outcome = run_act(org=org, run_id=run_id, action="retry", actor="ops")
    assert outcome.steps == 1
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", run.error
    assert [(s.step_id, s.iteration, s.status) for s in Step.objects.filter(
        run_id=run_id).order_by("id")] == [
        ("first", 1, "failed"), ("second", 1, "done"), ("done", 1, "done")]  # fmt: skip


def test_a_branch_entry_a_failure_cancelled_takes_its_reused_answer_when_retried(
    org: Organisation, provider_stub: Any
) -> None:
    # check is refused, the run fails; re-run from the parallel: pay's new entry is to take
    # its settled answer. check is refused again before pay's entry ran (cancelling it);
    # the retry runs check and enters pay again under another iteration, which takes that
    # answer: nothing is paid twice.
    connect(org, base_url=provider_stub.url, timeout_seconds=5)
    url = provider_stub.url
    run_id = start(org, {
        "start": "split",
        "steps": [
            {"id": "split", "type": "parallel", "branches": ["pay", "hold"], "next": "meet"},
            {"id": "pay", "type": "http", "connection": "api",
             "request": {"method": "POST", "url": f"{url}/items", "body": {"op": "pay"}},
             "next": "meet"},
            {"id": "hold", "type": "wait", "duration": "1h", "next": "check"},
            {"id": "check", "type": "http", "connection": "api", "retry": {"max_attempts": 1},
             "request": {"method": "POST", "url": f"{url}/echo/check", "body": {}},
             "next": "meet"},
            {"id": "meet", "type": "join", "wait_for": ["pay", "hold"], "next": "done"},
            {"id": "done", "type": "end", "output": "{{ steps.pay.output.body.id }}"},
        ],
    })  # fmt: skip
    provider_stub.fail_next(1, status=400, path_prefix="/echo")  # check is refused
    drive()  # pay is made; hold waits
    make_due(run_id=run_id)
    assert fire_due_timers().fired == 1
    drive()
    assert Run.objects.get(pk=run_id).status == "failed"
    assert len(provider_stub.created) == 1  # pay's, settled

    rerun(org=org, run_id=run_id, from_step="split", actor="ops", dry_run=False)
    provider_stub.fail_next(1, status=400, path_prefix="/echo")  # refused again
    make_due(run_id=run_id, fired_at__isnull=True)
    assert fire_due_timers().fired == 1
    worker = Worker(lane_policy("io"), concurrency=1, name="w")
    now = time.monotonic()
    claimed = {s.step_id: s for s in claim(policy=worker.policy, worker=worker.name, limit=10)}
    assert sorted(claimed) == ["check", "pay"]
    # check is refused while pay's entry (claimed here) has not run: the run fails.
    assert worker._execute(Attempt(claimed["check"], deadline=now + 60, extended=now)) is None
    assert Run.objects.get(pk=run_id).status == "failed"
    assert Step.objects.get(run_id=run_id, step_id="pay", iteration=2).status == "cancelled"

    run_act(org=org, run_id=run_id, action="retry", actor="ops")
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", "item_1"), run.error
    assert len(provider_stub.created) == 1  # pay's settled answer, not a second payment
    (reused,) = events(run_id, "effect.reused")
    assert (reused.iteration, (reused.detail or {})["reused"]) == (3, f"{run_id}/pay/1")


# --- refusals change nothing ----------------------------------------------------------------------


def snapshot(run_id: int) -> tuple[Any, ...]:
    run = Run.objects.get(pk=run_id)
    steps = list(Step.objects.filter(run_id=run_id).order_by("id").values_list(
        "step_id", "iteration", "status"))  # fmt: skip
    return (run.status, run.input, run.vars, run.entered, run.error, run.finished_at,
            run.rerun_reuse, run.rerun_floor, steps)  # fmt: skip


FORKED: dict[str, Any] = {
    "start": "split",
    "steps": [
        {"id": "split", "type": "parallel", "branches": ["left", "right"], "next": "meet"},
        {"id": "left", "type": "noop", "next": "meet"},
        {"id": "right", "type": "set", "values": {"r": "1"}, "next": "meet"},
        {"id": "meet", "type": "join", "wait_for": ["left", "right"], "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


def test_bad_requests_are_refused_with_their_codes_and_change_nothing(
    org: Organisation, other_org: Organisation
) -> None:
    run_id = start(org, FORKED, run_input={"n": 1})
    drive()
    assert Run.objects.get(pk=run_id).status == "succeeded"
    before, kinds = snapshot(run_id), history(run_id)

    def refused(error: type[WaymarkError], **given: Any) -> WaymarkError:
        with pytest.raises(error) as caught:
            rerun(org=org, run_id=run_id, actor="ops", dry_run=False,
                  **{"from_step": "split", **given})  # fmt: skip
        assert snapshot(run_id) == before and history(run_id) == kinds
        return caught.value

    assert refused(UnknownStep, from_step="nowhere").as_dict()["code"] == "unknown_step"
    assert refused(RerunStepNotTopLevel, from_step="right").as_dict() == {
        "code": "rerun_step_not_top_level", "step": "right",
        "detail": "Step 'right' runs inside a branch of parallel 'split': re-run from 'split' "
                  "(its branches run again) or from a step after its join."}  # fmt: skip
    assert "must be a JSON object" in str(refused(InvalidInput, run_input=["a", "list"]))
    assert "vars must be a JSON object" in str(refused(InvalidInput, variables="x"))
    refused(PayloadTooLarge, run_input={"big": "x" * 2_000_000})
    with pytest.raises(UnknownRun):
        rerun(org=other_org, run_id=run_id, from_step="split", actor="ops", dry_run=False)
    assert snapshot(run_id) == before

    # From the parallel itself, or from its join (which then passes through): allowed.
    rerun(org=org, run_id=run_id, from_step="meet", actor="ops", dry_run=False)
    assert Run.objects.get(pk=run_id).status == "succeeded"
    rerun(org=org, run_id=run_id, from_step="split", actor="ops", dry_run=False)
    drive()  # (the noop branch runs on a worker)
    assert Run.objects.get(pk=run_id).status == "succeeded"
    assert Run.objects.get(pk=run_id).entered == {
        "split": 2, "left": 2, "right": 2, "meet": 3, "done": 3}  # fmt: skip


WAITING: dict[str, Any] = {
    "start": "hold",
    "steps": [
        {"id": "hold", "type": "wait", "duration": "1h", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


def test_a_run_still_going_is_refused_with_409_and_the_refusal_is_recorded(
    org: Organisation,
) -> None:
    run_id = start(org, WAITING)
    before = snapshot(run_id)
    with pytest.raises(RunStateConflict) as caught:
        rerun(org=org, run_id=run_id, from_step="hold", actor="ops", dry_run=False)
    assert caught.value.status == 409 and caught.value.code == "run_state_conflict"
    assert "only a finished run" in caught.value.detail
    assert snapshot(run_id) == before
    (refusal,) = events(run_id, "run.rerun_refused")
    assert refusal.detail is not None and refusal.detail["code"] == "run_state_conflict"
    run_act(org=org, run_id=run_id, action="pause", actor="ops")
    with pytest.raises(RunStateConflict):  # paused is not finished either
        rerun(org=org, run_id=run_id, from_step="hold", actor="ops")

    # Cancelled, it may run again; the wait is entered anew.
    run_act(org=org, run_id=run_id, action="cancel", actor="ops")
    outcome = rerun(org=org, run_id=run_id, from_step="hold", actor="ops", dry_run=False)
    assert (outcome.was, outcome.status) == ("cancelled", "running")
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error, run.finished_at) == ("running", "", None)
    assert list(Step.objects.filter(run_id=run_id, status="waiting").values_list(
        "step_id", "iteration")) == [("hold", 2)]  # fmt: skip


# --- the API, the admin and the command -----------------------------------------------------------


def failed_run(org: Organisation) -> int:
    definition = {"start": "first", "steps": [
        {"id": "first", "type": "set", "values": {"a": "{{ input.a }}"}, "next": "done"},
        {"id": "done", "type": "end", "status": "failed"}]}  # fmt: skip
    run_id = start(org, definition, run_input={"a": 1})
    assert Run.objects.get(pk=run_id).status == "failed"
    return run_id


def test_the_api_previews_by_default_acts_when_told_and_answers_errors_with_codes(
    org: Organisation, api: Any, other_api: Any
) -> None:
    run_id = failed_run(org)
    url = f"/api/v1/runs/{run_id}/rerun"
    preview = api.post(url, {"from_step": "first", "vars": {"a": 2}}, format="json")
    assert preview.status_code == 200, preview.json()
    assert preview.json() == {
        "id": run_id, "from_step": "first", "was": "failed", "status": "failed",
        "dry_run": True, "iteration": None, "repeat_effects": False, "input_changes": [],
        "vars_changes": [{"key": "a", "before": "1", "after": 2}], "effects": [],
    }  # fmt: skip
    answers = {
        "unknown_step": api.post(url, {"from_step": "zzz"}, format="json"),
        "invalid_input": api.post(url, {"from_step": "first", "input": [1]}, format="json"),
        "unknown_run": other_api.post(url, {"from_step": "first"}, format="json"),
        "missing": api.post(url, {}, format="json"),
        # An iteration chooses among a code run's steps only.
        "iteration": api.post(url, {"from_step": "first", "iteration": 1}, format="json"),
    }
    assert answers["iteration"].status_code == 400
    assert answers["iteration"].json()["code"] == "invalid_input"
    assert answers["unknown_step"].status_code == 400
    assert answers["unknown_step"].json()["code"] == "unknown_step"
    assert answers["invalid_input"].status_code == 400
    assert answers["invalid_input"].json()["code"] == "invalid_input"
    assert answers["unknown_run"].status_code == 404
    assert answers["missing"].status_code == 400
    assert Run.objects.get(pk=run_id).status == "failed"

    acted = api.post(url, {"from_step": "first", "input": {"a": 5}, "dry_run": False},
                     format="json")  # fmt: skip
    assert acted.status_code == 200 and acted.json()["status"] == "failed"  # ends as before
    run = Run.objects.get(pk=run_id)
    assert run.vars == {"a": "5"} and run.input == {"a": 5}
    running = api.post(f"/api/v1/runs/{start(org, WAITING, key='k2')}/rerun",
                       {"from_step": "hold", "dry_run": False}, format="json")  # fmt: skip
    assert running.status_code == 409 and running.json()["code"] == "run_state_conflict"


def test_the_admin_shows_the_choice_and_acts_only_once_confirmed(
    org: Organisation, admin_client: Any
) -> None:
    operator = admin_client
    run_id = failed_run(org)
    page = operator.get(reverse("admin:workflows_run_change", args=[run_id]))
    assert page.status_code == 200
    rerun_url = reverse("admin:workflows_run_rerun", args=[run_id])
    assert rerun_url in page.content.decode()
    form = operator.get(rerun_url)
    assert form.status_code == 200 and 'name="from_step"' in form.content.decode()

    shown = operator.post(rerun_url, {"from_step": "first", "input": '{"a": 9}'})
    text = shown.content.decode()
    assert shown.status_code == 200 and "Confirm" in text and "charge" not in text
    assert "a" in text and 'name="confirmed"' in text
    assert Run.objects.get(pk=run_id).input == {"a": 1}  # nothing yet

    bad = operator.post(rerun_url, {"from_step": "first", "input": "[1"})
    assert bad.status_code == 200 and "not valid JSON" in bad.content.decode()
    unknown = operator.post(rerun_url, {"from_step": "zzz", "input": ""})
    assert "unknown_step" in unknown.content.decode()

    done = operator.post(rerun_url, {"from_step": "first", "input": '{"a": 9}',
                                     "confirmed": "yes"})  # fmt: skip
    assert done.status_code == 302
    run = Run.objects.get(pk=run_id)
    assert run.input == {"a": 9} and run.vars == {"a": "9"}
    (entry,) = AuditEntry.objects.filter(action="run.rerun")
    assert entry.actor_kind == "user" and entry.detail["from_step"] == "first"


def test_the_command_prints_the_preview_and_acts_only_with_yes(
    org: Organisation, tmp_path: Any
) -> None:
    run_id = failed_run(org)
    new_input = tmp_path / "input.json"
    new_input.write_text('{"a": 3}')
    out = StringIO()
    call_command("runs", "rerun", "--org", org.slug, str(run_id), "--from", "first",
                 "--input-file", str(new_input), stdout=out)  # fmt: skip
    text = out.getvalue()
    assert f"Run {run_id} (failed) would be re-run from step 'first'" in text
    assert "input.a: 1 -> 3" in text and "--yes" in text
    assert Run.objects.get(pk=run_id).input == {"a": 1}

    out = StringIO()
    call_command("runs", "rerun", "--org", org.slug, str(run_id), "--from", "first",
                 "--input-file", str(new_input), "--yes", stdout=out)  # fmt: skip
    assert f"Run {run_id} re-run from step 'first'" in out.getvalue()
    assert Run.objects.get(pk=run_id).input == {"a": 3}

    with pytest.raises(CommandError, match="unknown_step"):
        call_command("runs", "rerun", "--org", org.slug, str(run_id), "--from", "zzz", "--yes")
    for refused in ("[1, 2]", '{"a": NaN}', '{"a": Infinity}', "[" * 100_000):
        new_input.write_text(refused)
        with pytest.raises(CommandError, match="invalid_input"):
            call_command("runs", "rerun", "--org", org.slug, str(run_id), "--from", "first",
                         "--input-file", str(new_input), "--yes")  # fmt: skip
    assert Run.objects.get(pk=run_id).input == {"a": 3}


# --- a re-run is a start for the quotas ---------------------------------------------------------


def test_a_re_run_at_the_running_runs_quota_is_refused_everywhere_and_changes_nothing(
    org: Organisation, api: Any, admin_client: Any
) -> None:
    run_id = failed_run(org)
    org.quota_running_runs = 1
    org.save()
    quotas.forget_running_counts()  # count again (the failed run's start counted just now)
    holding = start(org, WAITING, key="k2")  # the one running run the quota allows
    quotas.forget_running_counts()
    before, kinds = snapshot(run_id), history(run_id)

    with pytest.raises(RunningRunsQuota) as caught:
        rerun(org=org, run_id=run_id, from_step="first", actor="ops", dry_run=False)
    assert (caught.value.status, caught.value.code) == (429, "quota_exceeded")
    url = f"/api/v1/runs/{run_id}/rerun"
    refused = api.post(url, {"from_step": "first", "dry_run": False}, format="json")
    assert refused.status_code == 429, refused.json()
    assert refused.json()["code"] == "quota_exceeded" and refused["Retry-After"] == "30"
    assert "1 running runs" in refused.json()["detail"]
    page = admin_client.post(reverse("admin:workflows_run_rerun", args=[run_id]),
                             {"from_step": "first", "input": "", "confirmed": "yes"})  # fmt: skip
    assert page.status_code == 200 and "quota_exceeded" in page.content.decode()
    with pytest.raises(CommandError, match="quota_exceeded"):
        call_command("runs", "rerun", "--org", org.slug, str(run_id), "--from", "first", "--yes")
    assert snapshot(run_id) == before and history(run_id) == kinds
    assert not AuditEntry.objects.filter(action="run.rerun").exists()
    # A preview admits nothing, so it is still shown.
    assert api.post(url, {"from_step": "first"}, format="json").status_code == 200

    run_act(org=org, run_id=holding, action="cancel", actor="ops")  # a slot frees up
    quotas.forget_running_counts()
    acted = api.post(url, {"from_step": "first", "dry_run": False}, format="json")
    assert acted.status_code == 200 and acted.json()["was"] == "failed"
    assert AuditEntry.objects.filter(action="run.rerun").count() == 1
