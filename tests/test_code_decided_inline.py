"""A code run's decide turns run inline in a worker's settle (engine/walk.py
Walk._decided_inline, docs/explanation/architecture.md "Runs decided as they go"): the step the
function asks for next is entered in the settle's transaction, without another queue hop. Held here:
the rows are those of a run whose every turn waits for a worker (the ordinary way), a run reads its
history once per resume, never in a web request, a ``ctx.run`` function never under the run's lock,
and a turn that runs too long is interrupted with a clear code."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import LazySettings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from timers.sweep import fire_due_timers
from workflows.code.history import RUN_HISTORY
from workflows.engine import group_settle, hops, metrics
from workflows.engine.walk import Walk
from workflows.models import Organisation, Run, RunEvent, Step
from workflows.plugins.code import Context, publish_code_workflow, workflow
from workflows.services.runs import run_start
from workflows.services.signals import signal_send

from .effect_setup import drive, settle_slowly
from .test_timers import make_due

pytestmark = pytest.mark.django_db(transaction=True)


def nothing(n: int) -> int:
    return n


@workflow("inline-hundred", version=1)
def hundred(ctx: Context, run_input: dict[str, Any]) -> int:
    return sum(ctx.run(f"s{n}", nothing, n) for n in range(100))


@workflow("inline-steps", version=1)
def three_steps(ctx: Context, run_input: dict[str, Any]) -> str:
    for n in (1, 2, 3):
        ctx.step(f"s{n}", "noop")
    return "done"


@workflow("inline-mixed", version=1)
def mixed(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    """Every kind of call: values recorded inline, a function, worker steps, a timer, a
    signal's outcome, a patch, a loop of one id."""
    started = ctx.now().isoformat()
    first = ctx.run("price", nothing, 7)
    ctx.step("check", "noop", output="{{ input.k }}")
    token = str(ctx.uuid())
    ctx.sleep("nap", "1s")
    got = ctx.wait_signal("paid", signal="paid", correlation=run_input["k"], timeout="1h")
    seen = ctx.step_result("again", "noop")
    if ctx.patched("fix-x"):
        ctx.run("fixed", nothing, 1)
    for n in range(3):
        ctx.step("loop", "noop", output=n)
    return {"started": started, "first": first, "token": token, "paid": got.payload,
            "outcome": seen.outcome}  # fmt: skip


def made() -> dict[str, list[int]]:
    return {"list": [1]}


@workflow("inline-mutates", version=1)
def mutates(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    """Changes what it is handed, as careless code does, on every turn: each turn must still
    be handed the run's values as recorded, whether it runs inline from what the turn before
    knew or on a worker."""
    run_input["items"].append("mine")
    got = ctx.run("made", made)
    got["list"].append(2)
    for n in (1, 2, 3):
        ctx.step(f"s{n}", "noop")
    return {"items": run_input["items"], "made": got}


SPIN = {"count": 0}


@workflow("inline-spins", version=1)
def spins(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.step("a", "noop")
    SPIN["count"] += 1
    while True:  # the workflow's own code never returns
        pass


# --- one read of the history per resume ----------------------------------------------------


def io_counts() -> tuple[float, float]:
    """This process's io steps claimed, and settled as succeeded (engine/metrics.py)."""
    return (metrics.STEPS_CLAIMED.labels(lane="io")._value.get(),
            metrics.STEPS_SETTLED.labels(lane="io", result="succeeded")._value.get())  # fmt: skip


def history_reads(queries: CaptureQueriesContext) -> int:
    """How many times history.RUN_HISTORY was sent."""
    statement = RUN_HISTORY.split("%(org)s")[0]
    return sum(
        1 for q in queries.captured_queries if q["sql"].strip().startswith(statement.strip())
    )


@pytest.mark.parametrize("settles", ["hops", "slow"])
def test_a_run_of_100_steps_resumed_100_times_reads_its_history_at_most_100_times(
    org: Organisation, monkeypatch: pytest.MonkeyPatch, settles: str
) -> None:
    if settles == "slow":  # its walk reading the history
        settle_slowly(monkeypatch)
    publish_code_workflow(org=org, name="inline-hundred", version=1)
    run_id = run_start(org=org, automation_slug="inline-hundred", run_input={},
                       start_key="h").run_id  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        drive(rounds=300)
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", sum(range(100))), run.error
    # Each ctx.run function runs in a worker's turn (100 resumes); the turn that returns
    # runs inline in the last one's settle, from what it knew.
    resumed = RunEvent.objects.filter(run_id=run_id, kind="step.claimed", step_id="decide")
    assert resumed.count() == 100
    # Each worker's turn hands what it knew to its settle; the settle's inline turn runs
    # from it and, meeting the next function, hands it on to the worker's turn it gives
    # the function to (taken by the same worker), hop or not: no read at all. A turn claimed
    # afresh (after a signal, a timer, a restart) reads the history once, in one statement.
    assert history_reads(queries) == 0
    decided = Step.objects.filter(run_id=run_id, step_id="decide")
    assert decided.count() == 101
    assert decided.filter(lane="inline").count() == 1


def test_the_decider_runs_inline_in_a_workers_settle_and_queues_no_turn(
    org: Organisation, monkeypatch: pytest.MonkeyPatch
) -> None:
    hopped: list[str] = []  # the steps whose settle was planned as a hop (engine/hops.py)
    real = hops.plan_hop

    def spied(step: Any, *args: Any, **kwargs: Any) -> Any:
        planned = real(step, *args, **kwargs)
        if planned is not None:
            hopped.append(step.step_id)
        return planned

    for module in (hops, group_settle):
        monkeypatch.setattr(module, "plan_hop", spied)
    publish_code_workflow(org=org, name="inline-steps", version=1)
    run_id = run_start(org=org, automation_slug="inline-steps", run_input={},
                       start_key="s").run_id  # fmt: skip
    first = Step.objects.get(run_id=run_id, step_id="decide")
    assert (first.status, first.lane) == ("ready", "io")  # the start ran no workflow code
    claims_before, settles_before = io_counts()
    with CaptureQueriesContext(connection) as queries:
        drive()
    # Four io steps done (the first turn, s1 with it, s2, s3), each settled once; claimed:
    # s1 with the turn, s2 and s3 by their settles (the first turn's claim is the test's,
    # run_due_steps', not the worker's claim loop, which counts its own).
    assert io_counts() == (claims_before + 3, settles_before + 4)
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", "done"), run.error
    path = [(s.step_id, s.iteration, s.lane) for s in Step.objects.filter(run_id=run_id)
            .order_by("id")]  # fmt: skip
    assert path == [
        ("decide", 1, "io"), ("s1", 1, "io"), ("decide", 2, "inline"), ("s2", 1, "io"),
        ("decide", 3, "inline"), ("s3", 1, "io"), ("decide", 4, "inline"),
    ]  # fmt: skip
    # Only the first turn was claimed; each later one ran in its step's settle, a hop (one
    # statement) whose walk replayed from what the turn before knew; the first turn, of a
    # run that had entered nothing else, had nothing to read: the history was never read.
    claimed = RunEvent.objects.filter(run_id=run_id, kind="step.claimed", step_id="decide")
    assert claimed.count() == 1
    assert history_reads(queries) == 0
    # s1, a noop (a pure type) of the io lane the first turn ran on, ran in that turn's
    # settle: a code run pays no settle that the same work as a definition does not.
    assert hopped == ["decide", "s2", "s3"]
    s1 = Step.objects.get(run_id=run_id, step_id="s1")
    assert (s1.status, s1.attempt, s1.owner) == ("done", 1, None)
    kinds = list(RunEvent.objects.filter(run_id=run_id, step_id="s1").order_by("id")
                 .values_list("kind", flat=True))  # fmt: skip
    assert kinds == ["step.ready", "step.claimed", "step.succeeded"]


def test_a_change_the_code_makes_to_what_it_is_handed_reaches_no_later_turn(
    org: Organisation,
) -> None:
    publish_code_workflow(org=org, name="inline-mutates", version=1)
    run_id = run_start(org=org, automation_slug="inline-mutates", run_input={"items": ["a"]},
                       start_key="m").run_id  # fmt: skip
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", run.error
    # Four turns after the function's, three of them inline from the turn before: each saw
    # the input and the result as recorded, so each changed them once, as the last did.
    assert run.output == {"items": ["a", "mine"], "made": {"list": [1, 2]}}
    assert run.input == {"items": ["a"]}
    assert Step.objects.get(run_id=run_id, step_id="made").output == {"list": [1]}
    assert Step.objects.filter(run_id=run_id, step_id="decide", lane="inline").count() >= 3


def test_a_settle_that_cannot_hop_runs_the_turn_under_the_run_lock_from_the_history(
    org: Organisation, monkeypatch: pytest.MonkeyPatch
) -> None:
    settle_slowly(monkeypatch)
    publish_code_workflow(org=org, name="inline-steps", version=1)
    run_id = run_start(org=org, automation_slug="inline-steps", run_input={},
                       start_key="slow").run_id  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", "done"), run.error
    lanes = [s.lane for s in Step.objects.filter(run_id=run_id, step_id="decide").order_by("id")]
    assert lanes == ["io", "inline", "inline", "inline"]
    # One read per settle of s2 and s3, in its transaction. The first turn had none to read;
    # s1 (a noop of the turn's lane) ran in the first turn's settle, and the second turn
    # with it, from what the first knew.
    assert history_reads(queries) == 2


# --- never in a web request, never a function under the run's lock -------------------------


@workflow("inline-signal", version=1)
def after_a_signal(ctx: Context, run_input: dict[str, Any]) -> Any:
    got = ctx.wait_signal("paid", signal="paid", correlation=run_input["k"], timeout="1h")
    CALLED.append("after")
    return ctx.run("after", nothing, got.payload)


CALLED: list[str] = []


def test_a_signal_through_the_api_queues_the_turn_and_a_function_runs_on_a_worker(
    org: Organisation, api: APIClient
) -> None:
    publish_code_workflow(org=org, name="inline-signal", version=1)
    response = api.post("/api/v1/runs", {"automation": "inline-signal", "input": {"k": "o-1"},
                                         "start_key": "w"}, format="json")  # fmt: skip
    run_id = response.json()["id"]
    drive()
    CALLED.clear()
    sent = api.post("/api/v1/signals", {"name": "paid", "correlation": "o-1", "payload": 5},
                    format="json")  # fmt: skip
    assert sent.status_code in (200, 201, 202), sent.json()
    assert CALLED == []  # the request ran no workflow code
    turn = Step.objects.filter(run_id=run_id, step_id="decide").order_by("-id").first()
    assert turn is not None and (turn.status, turn.lane) == ("ready", "io")
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", 5), run.error
    # The function was called by a worker's turn (claimed), not by a turn inline in a settle.
    after = Step.objects.get(run_id=run_id, step_id="after")
    turns = list(Step.objects.filter(run_id=run_id, step_id="decide").order_by("id"))
    asked = [t for t in turns if isinstance(t.output, dict) and t.output["call"]["id"] == "after"]
    assert len(asked) == 1 and asked[0].lane == "io" and after.output == 5


# --- the budget of a turn --------------------------------------------------------------------


@pytest.fixture
def short_turns(settings: LazySettings) -> Iterator[None]:
    settings.WAYMARK = {**settings.WAYMARK, "CODE_TURN_MS": 200.0}
    yield


def test_a_turn_that_never_returns_is_interrupted_and_fails_the_run_with_its_code(
    org: Organisation, short_turns: None
) -> None:
    publish_code_workflow(org=org, name="inline-spins", version=1)
    run_id = run_start(org=org, automation_slug="inline-spins", run_input={},
                       start_key="x").run_id  # fmt: skip
    SPIN["count"] = 0
    drive()  # returns: no worker thread is left spinning
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"
    assert "code_turn_budget_exceeded" in run.error
    # Interrupted inline in a's settle first, then on a worker, attempt after attempt.
    failed = Step.objects.get(run_id=run_id, step_id="decide", iteration=2)
    assert (failed.lane, failed.status) == ("io", "failed")
    assert "code_turn_budget_exceeded" in failed.error
    assert SPIN["count"] == 1 + failed.attempt


# --- the same rows as a run whose every turn waits for a worker ---------------------------


def rows_of(run_id: int) -> dict[str, Any]:
    """What a run wrote, but for how its turns were run (the decide rows' lane, attempt,
    owner and claim events) and what differs between two runs (ids, times, the values
    ctx.now() and ctx.uuid() made)."""
    run = Run.objects.get(pk=run_id)
    steps = [
        (s.step_id, s.iteration, s.type, s.status, s.error,
         None if s.step_id in ("ctx.now", "ctx.uuid") else _plain(s.output))
        for s in Step.objects.filter(run_id=run_id).order_by("id")
    ]  # fmt: skip
    events = [
        (e.kind, e.step_id, e.iteration)
        for e in RunEvent.objects.filter(run_id=run_id).order_by("id")
        if e.step_id != "decide" and e.kind not in ("step.ready", "step.claimed")
    ]
    output = dict(run.output or {})
    for made in ("started", "token"):
        output.pop(made, None)
    return {"status": run.status, "error": run.error, "output": output, "steps": steps,
            "events": events, "entered": run.entered}  # fmt: skip


def _plain(value: Any) -> Any:
    if isinstance(value, dict) and isinstance(value.get("call"), dict):
        call = value["call"]
        if call.get("id") in ("ctx.now", "ctx.uuid"):
            return {**value, "call": {**call, "output": "<made>"}}
    return value


def _timeless(text: str) -> str:
    """A wait's due time, a signal's identity and the uuid made (each run's own) set aside."""
    return re.sub(r"\d{4}-\d\d-\d\dT[\d:.+]+|sha256:[0-9a-f]+|[0-9a-f]{8}-[0-9a-f-]{27}",
                  "<own>", text)  # fmt: skip


def run_mixed(org: Organisation, key: str) -> int:
    run_id = run_start(org=org, automation_slug="inline-mixed", run_input={"k": key},
                       start_key=key).run_id  # fmt: skip
    drive()
    make_due(run_id=run_id)
    assert fire_due_timers().fired == 1
    drive()
    signal_send(org=org, name="paid", correlation=key, payload={"amount": 3})
    drive()
    return run_id


def test_deciding_inline_writes_what_deciding_on_a_worker_writes(
    org: Organisation, settings: LazySettings
) -> None:
    publish_code_workflow(org=org, name="inline-mixed", version=1)
    settings.WAYMARK = {**settings.WAYMARK, "CODE_DECIDE_INLINE": False}
    ordinary = run_mixed(org, "k")
    settings.WAYMARK = {**settings.WAYMARK, "CODE_DECIDE_INLINE": True}
    inline = run_mixed(org, "k2")
    assert_same_rows(rows_of(inline), rows_of(ordinary))
    # The fast path was taken: turns ran inline, and fewer waited for a worker.
    lanes = Step.objects.filter(run_id=inline, step_id="decide", lane="inline").count()
    assert lanes > 0
    assert not Step.objects.filter(run_id=ordinary, step_id="decide", lane="inline").exists()


def assert_same_rows(rows: dict[str, Any], reference: dict[str, Any]) -> None:
    """The run_mixed run with input key k2 wrote what the one with key k wrote."""
    assert reference["status"] == "succeeded", reference["error"]
    assert reference["output"] == {"first": 7, "paid": {"amount": 3}, "outcome": "ok"}
    for name in reference:
        if name == "steps":
            continue
        assert rows[name] == reference[name], name
    # Step by step, with the correlation key of each run's input set aside.
    assert [r[:5] for r in rows["steps"]] == [r[:5] for r in reference["steps"]]
    mine = [_timeless(str(r[5]).replace("k2", "k")) for r in rows["steps"]]
    assert mine == [_timeless(str(r[5])) for r in reference["steps"]]


# --- a pure step asked by a worker's turn runs in that turn's settle ------------------------


@pytest.mark.parametrize("decide_inline", [True, False], ids=["turns inline", "turns on workers"])
def test_a_pure_step_run_with_the_turn_that_asked_it_writes_what_its_own_attempt_writes(
    org: Organisation, settings: LazySettings, monkeypatch: pytest.MonkeyPatch,
    decide_inline: bool,
) -> None:  # fmt: skip
    """The fast path (Walk._ran_with_turn) against the ordinary one: the same steps, outputs,
    events and run, whether a noop a turn on a worker asked ran in that turn's settle or as
    an attempt of its own. With every turn on a worker, every noop the run asks takes it."""
    ran_with_turn: list[str] = []
    real = Walk._ran_with_turn

    def spied(walk: Walk, entry: Any, *args: Any) -> bool:
        ran = real(walk, entry, *args)
        if ran:
            ran_with_turn.append(entry.step_id)
        return ran

    monkeypatch.setattr(Walk, "_ran_with_turn", spied)
    publish_code_workflow(org=org, name="inline-mixed", version=1)
    waymark = {**settings.WAYMARK, "CODE_DECIDE_INLINE": decide_inline}
    settings.WAYMARK = {**waymark, "CODE_RUN_ASKED_PURE_STEP": False}
    ordinary = run_mixed(org, "k")
    assert ran_with_turn == []
    settings.WAYMARK = {**waymark, "CODE_RUN_ASKED_PURE_STEP": True}
    fused = run_mixed(org, "k2")
    assert_same_rows(rows_of(fused), rows_of(ordinary))
    # The fast path was taken (a hop's walk that a group hands back walks again: a step may
    # be named twice), and only for noops.
    assert set(ran_with_turn) <= {"check", "again", "loop"}
    assert ("again" in ran_with_turn) and (decide_inline or {"check", "loop"} <= set(ran_with_turn))


# --- a failure's text is kept the same, inline or on a worker ------------------------------


@workflow("inline-fails-long", version=1)
def fails_long(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.run("first", nothing, 1)
    ctx.fail("out of stock: " + "x" * 100_000)


def test_a_long_failure_is_kept_to_the_same_length_inline_as_on_a_worker(
    org: Organisation, settings: LazySettings
) -> None:
    """A worker's settle keeps a step's error to 2000 characters; a turn failing inline kept
    all of it, in the decider's row, its step.failed event and the run's error."""
    publish_code_workflow(org=org, name="inline-fails-long", version=1)
    kept = {}
    for inline in (False, True):
        settings.WAYMARK = {**settings.WAYMARK, "CODE_DECIDE_INLINE": inline}
        run_id = run_start(org=org, automation_slug="inline-fails-long", run_input={},
                           start_key=f"long-{inline}").run_id  # fmt: skip
        drive()
        run = Run.objects.get(pk=run_id)
        failed = Step.objects.get(run_id=run_id, step_id="decide", status="failed")
        event = RunEvent.objects.get(run_id=run_id, kind="step.failed", step_id="decide")
        assert event.detail is not None
        kept[inline] = (run.status, len(run.error), len(failed.error), len(event.detail["error"]))
        assert failed.lane == ("inline" if inline else "io")
    assert kept[True] == kept[False] == ("failed", 2000, 2000, 2000)
