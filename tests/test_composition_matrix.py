"""Every step type followed by every other, on the real engine (`runengine --no-web` as
processes), started through the API, with effects against the local stubs and signals,
approvals and tasks answered through the API: each run ends as its definition says (status,
output, the steps it entered), each effect reaches its stub once per pass, no `engine_error`
in any step or run, no traceback or `engine_error` in the engine's log (issue 26).

An io step followed by `wait` or `wait_until` failed its run after the effect went out
(the speculative walk of a settle entered the wait outside the walk's transaction); this is
the end-to-end proof that every pair composes. With that fix (d09e2e9) reverted, the matrix
fails 12 pairs: noop, http, email, slack_message, model and crm_upsert, each followed by
wait or wait_until. tests/composition.py builds the definitions.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest
from django.db.models.functions import Now

from timers.models import Timer
from workflows.models import Run, RunEvent, Signal

from .composition import (
    DONE,
    KINDS,
    Plan,
    chain,
    finish_plans,
    fork,
    fragment,
    loop,
    pair,
    problems,
    run_input,
    run_plans,
    start_plans,
)
from .engine_harness import Harness

pytestmark = [pytest.mark.long_running, pytest.mark.django_db(transaction=True)]

FIRST = [kind for kind in KINDS if kind != "end"]  # nothing follows an end


def report(found: dict[str, list[str]]) -> str:
    lines = [f"{len(found)} composition(s) did not do what their definition says:"]
    lines += [f"  {name}: {'; '.join(wrong)}" for name, wrong in sorted(found.items())]
    return "\n".join(lines)


def test_every_step_type_followed_by_every_other(harness: Harness) -> None:
    plans: list[Plan] = [pair(a, b) for a in FIRST for b in KINDS]
    assert len(plans) == 16 * 17  # wait_signal twice: answered, and left to time out

    found = run_plans(harness, plans)

    assert not found, report(found)


def test_every_step_type_in_a_loop_entered_twice(harness: Harness) -> None:
    """A loop's second pass is a new iteration: a new effect key, a new request, a new
    timer, a new fork."""
    found = run_plans(harness, [loop(kind) for kind in FIRST])

    assert not found, report(found)


def test_an_early_signal_a_resolved_effect_and_a_failure_path_next_to_every_step_type(
    harness: Harness,
) -> None:
    """More ways a run moves: a signal sent at the start, kept until the run reaches its
    step (after every type, and before every type); an http call whose answer was lost,
    parked for review and resolved through the API, which wakes it; a call refused for good
    that goes on along its `failed` outcome or its `on_failure` (before every type)."""
    plans = [pair(a, "wait_signal_early") for a in FIRST]
    plans += [pair("wait_signal_early", b) for b in KINDS]
    plans += [pair(a, b) for a in ("http_review", "http_failed", "http_on_failure") for b in KINDS]

    found = run_plans(harness, plans)

    assert not found, report(found)
    resolved = RunEvent.objects.filter(run__org=harness.org, kind="effect.resolved").count()
    assert resolved == len(KINDS)
    kept = [s.consumed_at - s.received_at for s in Signal.objects.filter(org=harness.org)
            if s.consumed_at is not None]  # fmt: skip
    # Kept ahead at least behind a wait and a wait_signal's timeout (a second each).
    assert sum(1 for held in kept if held > dt.timedelta(seconds=0.5)) >= 2, kept


# --- the shapes issue 26 names -------------------------------------------------------------------

# The issue's reproduction, as it was filed: every run of it failed with "a wait is entered
# in the walk's transaction".
NOOP_WAIT_END = {
    "start": "a",
    "steps": [
        {"id": "a", "type": "noop", "next": "w"},
        {"id": "w", "type": "wait", "duration": "1s", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


def test_the_issues_reproduction_succeeds_every_time(harness: Harness) -> None:
    slug = harness.publish(NOOP_WAIT_END)
    runs = [harness.start(slug, {"n": n}) for n in range(3)]

    finished = harness.wait_finished(runs)

    for run_id in runs:
        assert (finished[run_id].status, finished[run_id].error) == ("succeeded", "")
        assert harness.path(run_id) == [("a", 1, "done"), ("w", 1, "done"), ("done", 1, "done")]


@pytest.mark.parametrize(
    "kinds",
    [
        ("http", "wait", "branch"),
        ("email", "wait_signal_timeout", "email"),
        ("approval", "http", "wait"),
    ],
    ids=" -> ".join,
)
def test_a_named_chain_runs_as_its_definition_says(
    harness: Harness, kinds: tuple[str, ...]
) -> None:
    found = run_plans(harness, [chain(*kinds)])

    assert not found, report(found)


def test_a_fork_of_an_effect_and_a_wait_joins_then_sends(harness: Harness) -> None:
    """parallel(http, wait) → join → email."""
    found = run_plans(harness, [fork(("http", "wait"), then=("email",))])

    assert not found, report(found)


def test_a_loop_through_an_effect_and_a_wait_makes_one_effect_per_pass(harness: Harness) -> None:
    """http → wait → branch back, twice: each pass's effect reaches the stub under its own
    iteration's key, once."""
    plan = loop("http", "wait")
    found = run_plans(harness, [plan])

    assert not found, report(found)
    (run_id,) = Run.objects.filter(org=harness.org).values_list("pk", flat=True)
    assert harness.stub_hits(f"{run_id}/s1/1") == harness.stub_hits(f"{run_id}/s1/2") == 1
    assert harness.stub_hits(f"{run_id}/s1/3") == 0


def test_the_checks_see_a_run_that_took_the_wrong_turn(harness: Harness) -> None:
    """The matrix's check is not vacuous: with ``go`` 0 the branch takes its default, to the
    failing end, and the check names the status, the path and the output."""
    plan = pair("http", "branch")
    slug = harness.publish(plan.definition)
    run_id = harness.start(slug, {**run_input(harness), "go": 0})

    run = harness.wait_finished([run_id])[run_id]

    found = problems(harness, run, plan)
    assert run.status == "failed"
    assert [p.split(" ")[0] for p in found] == ["run", "path"]
    assert harness.stub_hits(f"{run_id}/a/1") == 1  # the effect before the branch went out


def test_a_pause_and_a_resume_anywhere_in_a_pair_change_nothing(harness: Harness) -> None:
    """Paused at once after its start (before, at or after its first step), quiet (what a
    step leads to waits), then resumed: each run still does what its definition says."""
    started = start_plans(
        harness, [pair(a, b) for a in ("noop", "wait", "approval") for b in KINDS]
    )
    for run_id in started:  # 409: the run had already ended (a → end, both quick)
        harness.call("POST", f"/api/v1/runs/{run_id}/pause", expect=(200, 409))
    harness.wait_quiet(started)
    paused = Run.objects.filter(pk__in=started, status="paused").values_list("pk", flat=True)
    assert len(paused) > len(started) // 2
    for run_id in paused:
        harness.call("POST", f"/api/v1/runs/{run_id}/resume", expect=200)

    found = finish_plans(harness, started)

    assert not found, report(found)


# --- a run migrated mid-way (issue 30) -----------------------------------------------------------


def test_a_run_between_an_effect_and_a_wait_is_migrated_and_finishes_on_the_new_version(
    harness: Harness,
) -> None:
    """http → wait, migrated while it waits to a version that calls the wait `hold` and sends
    an email after it: the wait's timer is carried over, the effect already made is not made
    again, and the new version's email goes out once."""
    sent = fragment("http", "s1", "pause")
    pause = {"id": "pause", "type": "wait", "duration": "1h", "next": DONE}
    done = {"id": DONE, "type": "end", "output": {"ended": DONE}}
    slug = harness.publish({"start": "s1", "steps": [*sent.steps, pause, done]})
    run_id = harness.start(slug, run_input(harness))
    harness.wait_quiet([run_id])
    assert harness.path(run_id) == [("s1", 1, "done"), ("pause", 1, "waiting")]
    email = fragment("email", "s3", DONE)
    hold = {**pause, "id": "hold", "next": "s3"}
    then = {**sent.steps[0], "next": "hold"}
    assert harness.publish_version(slug, {"start": "s1", "steps": [then, hold, *email.steps,
                                                                   done]}) == 2  # fmt: skip

    migrated = harness.call("POST", f"/api/v1/automations/{slug}/migrations", {
        "from_version": 1, "to_version": 2, "map": {"pause": "hold"}, "dry_run": False,
    }, expect=200)  # fmt: skip
    assert (migrated["status"], migrated["moved"]) == ("finished", 1)
    assert Timer.objects.filter(run_id=run_id, step_id="hold").update(due_at=Now()) == 1

    run = harness.wait_finished([run_id])[run_id]
    assert (run.status, run.output, run.version.number) == ("succeeded", {"ended": DONE}, 2)
    assert harness.path(run_id) == [
        ("s1", 1, "done"), ("hold", 1, "done"), ("s3", 1, "done"), (DONE, 1, "done"),
    ]  # fmt: skip
    assert harness.effect_keys(run_id) == {f"{run_id}/s1/1": 1, f"{run_id}/s3/1": 1}


# Every step type that makes an outside effect (tests/composition.py's keyed and model ones).
EFFECT_KINDS = ("http", "email", "slack_message", "model", "crm_upsert")


def test_a_re_run_after_a_wait_that_follows_each_effect_sends_nothing_again(
    harness: Harness,
) -> None:
    """effect → wait → end, for each effect type, finished, then re-run from the effect
    (issue 30 part 4): the effect is taken, not made again (one call at its stub in all, an
    `effect.reused` naming its first key), the wait waits again (a new timer), and the run
    ends as its definition says. Then, with repeat_effects, each is made once more under
    its new key."""
    started = start_plans(harness, [pair(kind, "wait") for kind in EFFECT_KINDS])
    found = finish_plans(harness, started)
    assert not found, report(found)

    for run_id, plan in started.items():
        harness.call("POST", f"/api/v1/runs/{run_id}/rerun",
                     {"from_step": "a", "dry_run": False}, expect=200)  # fmt: skip
        plan.path = entered(plan, 2)  # every step twice; the effect at its stub still once
    found = finish_plans(harness, started)
    assert not found, report(found)
    for run_id in started:
        reused = RunEvent.objects.filter(run_id=run_id, kind="effect.reused")
        assert [(e.step_id, e.iteration, (e.detail or {})["reused"]) for e in reused] == [
            ("a", 2, f"{run_id}/a/1")]  # fmt: skip

    for run_id, plan in started.items():
        harness.call("POST", f"/api/v1/runs/{run_id}/rerun",
                     {"from_step": "a", "repeat_effects": True, "dry_run": False},
                     expect=200)  # fmt: skip
        plan.path = entered(plan, 3)
        plan.keyed = {(sid, it) for sid, _ in plan.keyed for it in (1, 3)}
        plan.prompts = Counter({sid: 2 for sid in plan.prompts})
    found = finish_plans(harness, started)
    assert not found, report(found)


def entered(plan: Plan, times: int) -> Counter[tuple[str, int]]:
    """The plan's path (one pass) entered ``times`` times: iterations 1 to ``times``."""
    return Counter({(sid, it): 1 for sid, _ in plan.path for it in range(1, times + 1)})
