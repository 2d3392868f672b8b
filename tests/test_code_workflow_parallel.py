"""ctx.parallel (docs/reference/code-workflows-at-run-time.md, "Parallel branches"): a code
workflow's branches run on the engine's own fork and join (engine/forks.py), each decided by a
decider of its own against its branch's history, on the real engine and database."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest
from django.test import Client

from workflows.models import Organisation, Run, RunEvent, Step
from workflows.plugins.code import Context, StepFailed, publish_code_workflow, workflow
from workflows.plugins.testing import WorkflowTest
from workflows.services.runs import run_start

from . import code_parallel_workflows  # noqa: F401 (registers the workflows shared with processes)
from .effect_setup import connect
from .processes import running, spawn_relay, spawn_worker, wait_for
from .stubs import ProviderStub

pytestmark = pytest.mark.django_db(transaction=True)


FLIPPED = {"branch": False}  # what the next replay of "code-par-flip"'s branch calls first


@workflow("code-par-flip", version=1)
def flip(ctx: Context, run_input: dict[str, Any]) -> list[Any]:
    def changing(c: Context) -> str:
        first = "b" if FLIPPED["branch"] else "a"
        c.run(first, str, first)
        c.sleep("nap", "1m")
        return "done"

    def steady(c: Context) -> str:
        return str(c.run("same", str, "same"))

    return ctx.parallel("pair", changing, steady)


COMPLETE: dict[str, Any] = {"value": "all"}  # what the next replay of "code-par-complete" waits for


@workflow("code-par-complete", version=1)
def complete_changes(ctx: Context, run_input: dict[str, Any]) -> list[Any]:
    def short(c: Context) -> str:
        c.sleep("nap", "1m")
        return "short"

    def long(c: Context) -> str:
        c.sleep("rest", "1h")
        return "long"

    return ctx.parallel("pair", short, long, complete=COMPLETE["value"])


@workflow("code-par-raises", version=1)
def raises(ctx: Context, run_input: dict[str, Any]) -> Any:
    def broken(c: Context) -> None:
        c.wait_signal("trigger", signal="trigger", correlation="raises")
        raise ValueError("boom")

    def waiting(c: Context) -> Any:
        return c.wait_signal("go", signal="go", correlation="raises").payload

    try:
        return ctx.parallel("pair", broken, waiting)
    except Exception:  # the workflow's own handler cannot keep the branch's failure
        return "swallowed"


@workflow("code-par-too-deep", version=1)
def too_deep(ctx: Context, run_input: dict[str, Any]) -> Any:
    """Four parallels deep, the innermost's id as long as a parallel's may be: its branches'
    ids (which name the branches around it) would pass a step id's 63 characters."""

    def level(c: Context, depth: int) -> Any:
        if depth == 4:
            return c.parallel("x" * 56, lambda d: 1)
        return c.parallel(f"level{depth}", lambda d: level(d, depth + 1))

    return level(ctx, 1)


@workflow("code-par-too-many", version=1)
def too_many(ctx: Context, run_input: dict[str, Any]) -> Any:
    return ctx.parallel("pair", lambda c: 1, lambda c: 2, complete=3)


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
    met = RunEvent.objects.filter(run_id=run.id, kind="step.succeeded", step_id="pair.join")
    assert met.count() == 1


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


def test_a_branch_that_calls_another_step_than_its_history_fails_the_run(
    org: Organisation,
) -> None:
    FLIPPED["branch"] = False
    t = WorkflowTest(org=org)
    t.start("code-par-flip", version=1, input={}, start_key="n1")
    run = t.run_until_waiting()
    assert sorted(s.step_id for s in run.waiting) == ["nap", "pair.join"]
    FLIPPED["branch"] = True  # a deploy that changed the branch's code under the run
    try:
        t.skip_time()
        run = t.run_until_waiting()
    finally:
        FLIPPED["branch"] = False
    assert run.status == "failed"
    # Checked against the branch's own history (its call 1), not the top level's.
    assert run.error.startswith(
        "step 'pair.0' failed: nondeterministic_workflow: the history "
        "has step 'a' (code_result) at call 1, but the code called 'b'"
    )


@pytest.mark.parametrize(
    ("before", "after", "words"),
    [("all", "first", "all its branches"), ("first", 2, "its first branch"),
     (1, "first", "1 of its branches")],
)  # fmt: skip
def test_a_parallel_called_with_another_complete_than_its_history_fails_the_run(
    org: Organisation, before: Any, after: Any, words: str
) -> None:
    """The join waits for what the fork was called with: code that now says otherwise would
    read its branches' results as the join did not wait for them (a branch's None taken for
    a cancelled one, or the reverse), so the run fails, never silently."""
    COMPLETE["value"] = before
    t = WorkflowTest(org=org)
    t.start("code-par-complete", version=1, input={}, start_key=f"c-{before}")
    run = t.run_until_waiting()
    assert sorted(s.step_id for s in run.waiting) == ["nap", "pair.join", "rest"]
    COMPLETE["value"] = after  # a deploy that changed the call under the run
    try:
        t.skip_time()
        run = t.run_until_finished()
    finally:
        COMPLETE["value"] = "all"
    assert run.status == "failed"
    assert run.error == (
        f"step 'pair.0' failed: nondeterministic_workflow: ctx.parallel 'pair' waits for "
        f"{words} in the history, but the code called it with complete={after!r}"
    )


def test_a_parallel_called_as_its_history_says_returns_what_its_join_waited_for(
    org: Organisation,
) -> None:
    COMPLETE["value"] = "first"
    t = WorkflowTest(org=org)
    t.start("code-par-complete", version=1, input={}, start_key="c-same")
    t.run_until_waiting()
    t.skip_time()
    run = t.run_until_finished()
    assert (run.status, run.output) == ("succeeded", ["short", None])
    fork = Step.objects.get(run_id=run.id, step_id="pair")
    assert (fork.output or {})["complete"] == "first"


def test_a_branch_that_raises_fails_the_run_and_ends_the_other_branch(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("code-par-raises", version=1, input={}, start_key="r1")
    run = t.run_until_waiting()
    assert sorted(s.step_id for s in run.waiting) == ["go", "pair.join", "trigger"]
    t.signal("trigger", correlation="raises")
    run = t.run_until_waiting()
    assert run.status == "failed"
    assert run.error == "step 'pair.0' failed: workflow_failed: ValueError: boom"
    assert Step.objects.get(run_id=run.id, step_id="go").status == "cancelled"
    assert run.output is None  # the top level's except did not get to return


def refuse(what: str) -> None:
    raise LookupError(f"no {what}")


@workflow("code-par-step-fails", version=1)
def step_fails(ctx: Context, run_input: dict[str, Any]) -> Any:
    def charge(c: Context) -> Any:
        return c.run("charge", refuse, "card")

    def nested(c: Context) -> Any:
        return c.parallel("inner", charge, lambda d: d.run("note", str, "n"))

    branch = nested if run_input["nested"] else charge
    try:
        return ctx.parallel("pair", branch, lambda c: c.run("other", str, "o"))
    except StepFailed:  # the top level's handler cannot keep the branch's failure either
        return "swallowed"


@pytest.mark.parametrize(
    ("nested", "error"),
    [
        (False, "step 'pair.0' failed: step 'charge' failed: LookupError: no card (attempt 1 "
         "of 1)"),
        (True, "step 'inner.0.0' failed: step 'charge' failed: LookupError: no card (attempt "
         "1 of 1)"),
    ],
)  # fmt: skip
def test_a_branch_s_step_failed_for_good_fails_the_run_with_the_step_s_error(
    org: Organisation, nested: bool, error: str
) -> None:
    """Not caught by the branch, its StepFailed fails the branch's decider with the step's
    own error, as at the top level: not ``workflow_failed: StepFailed: ...``, which says
    the workflow's code raised."""
    t = WorkflowTest(org=org)
    t.start("code-par-step-fails", version=1, input={"nested": nested})
    run = t.run_until_finished()
    assert (run.status, run.error, run.output) == ("failed", error, None)


@workflow("code-par-wrong-context", version=1)
def wrong_context(ctx: Context, run_input: dict[str, Any]) -> Any:
    def charge(c: Context) -> Any:
        if run_input["call"] == "now":
            return str(ctx.now())  # the context around it, not c
        return ctx.run("charge", str, "card")

    def nested(c: Context) -> Any:
        return c.parallel("inner", lambda d: c.run("charge", str, "card"), lambda d: "n")

    branch = nested if run_input["call"] == "nested" else charge
    return ctx.parallel("pair", branch, lambda c: c.run("other", str, "o"))


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ("run", "step 'pair.0' failed: invalid_code_step: 'charge' is called on the context "
         "around ctx.parallel 'pair' from inside its branch"),
        ("now", "step 'pair.0' failed: invalid_code_step: 'ctx.now' is called on the context "
         "around ctx.parallel 'pair' from inside its branch"),
        ("nested", "step 'inner.0.0' failed: invalid_code_step: 'charge' is called on the "
         "context around ctx.parallel 'inner' from inside its branch"),
    ],
)  # fmt: skip
def test_a_branch_that_calls_a_step_on_the_context_around_it_is_told_so(
    org: Organisation, call: str, error: str
) -> None:
    """A closure over ``ctx`` in a branch: it read nondeterministic_workflow, "the code called
    'charge' before reaching ctx.parallel 'pair'", though it was called after, and no path
    changed."""
    t = WorkflowTest(org=org)
    t.start("code-par-wrong-context", version=1, input={"call": call})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert run.error.startswith(error), run.error


def test_parallels_nest_and_each_branch_is_decided_in_its_own_place(org: Organisation) -> None:
    """Both outer branches fork a parallel of the same id; each inner branch waits (a signal,
    a sleep) at once; a third branch goes two levels deeper. Every branch's steps are entered
    once, in their own place, and the joins meet inside out."""
    t = WorkflowTest(org=org)
    t.start("code-par-nested", version=1, input={"order": "o-1"}, start_key="n1")
    run = t.run_until_waiting()
    assert sorted(s.step_id for s in run.waiting) == [
        "go", "go", "inner.join", "inner.join", "nap", "nap", "outer.join",
    ]  # fmt: skip
    t.signal("go", correlation="o-1-left", payload="L")
    t.signal("go", correlation="o-1-right", payload="R")
    run = t.run_until_waiting()
    assert sorted(s.step_id for s in run.waiting) == [
        "inner.join", "inner.join", "nap", "nap", "outer.join"]  # fmt: skip
    assert t.skip_time() == 2
    run = t.run_until_finished()
    assert (run.status, run.error) == ("succeeded", "")
    assert run.output == {
        "met": ["left: L/left rested", "right: R/right rested", [["a", "b"], "c"]],
        "after": "after",
    }
    steps = Step.objects.filter(run_id=run.id)
    # Each inner parallel's branches have deciders of their own, named by where they are.
    deciders = sorted({s.step_id for s in steps if s.type == "code"})
    assert deciders == [
        "core.2.0.0", "core.2.0.1", "decide", "inner.0.0", "inner.0.1", "inner.1.0",
        "inner.1.1", "mid.2.0", "mid.2.1", "outer.0", "outer.1", "outer.2",
    ]  # fmt: skip
    assert all(s.status == "done" for s in steps), rows(run.id)
    # A step of each inner branch is in that branch's place: a branch of its inner join row,
    # which itself sits in a branch of the outer one.
    outer_join = steps.get(step_id="outer.join")
    for side, number in (("left", 0), ("right", 1)):
        inner_join = steps.get(step_id="inner.join", branch=number)
        assert (inner_join.fork_join_id, inner_join.status) == (outer_join.id, "done")
        go = steps.get(step_id="go", fork_join_id=inner_join.id)
        nap = steps.get(step_id="nap", fork_join_id=inner_join.id)
        assert (go.branch, nap.branch) == (0, 1)
        tally = steps.get(step_id="tally", fork_join_id=outer_join.id, branch=number)
        assert tally.output == f"{side}: {'LR'[number]}/{side} rested"
    core_join = steps.get(step_id="core.join")
    leaves = steps.filter(fork_join_id=core_join.id, type="code_result")
    assert sorted(str(s.output) for s in leaves) == ["a", "b"]
    # The top level went on once, after every join met: one turn asked for "after".
    assert steps.filter(step_id="after").count() == 1
    met = RunEvent.objects.filter(run_id=run.id, kind="step.succeeded", step_id__endswith=".join")
    assert sorted(met.values_list("step_id", flat=True)) == [
        "core.join", "inner.join", "inner.join", "mid.join", "outer.join"]  # fmt: skip


def test_complete_first_cancels_a_losing_branch_with_the_parallel_inside_it(
    org: Organisation,
) -> None:
    t = WorkflowTest(org=org)
    t.start("code-par-nested-first", version=1, input={}, start_key="nf1")
    run = t.run_until_waiting()
    assert sorted(s.step_id for s in run.waiting) == [
        "go", "inner.join", "nap", "never", "race.join"]  # fmt: skip
    t.signal("go", correlation="nested-first")
    run = t.run_until_finished()
    assert (run.status, run.error) == ("succeeded", "")
    assert run.output == {"met": ["quick", None], "after": "after"}
    steps = Step.objects.filter(run_id=run.id)
    for step_id in ("never", "nap", "inner.join"):
        assert steps.get(step_id=step_id).status == "cancelled", rows(run.id)
    assert t.skip_time() == 0  # the cancelled sleep's timer went with it
    assert not steps.filter(step_id="woke").exists()
    assert steps.filter(step_id="after").count() == 1


def test_a_parallel_nested_past_the_step_id_length_and_a_complete_past_the_branches_are_refused(
    org: Organisation,
) -> None:
    t = WorkflowTest(org=org)
    t.start("code-par-too-deep", version=1, input={}, start_key="x1")
    run = t.run_until_waiting()
    assert run.status == "failed"
    refused = f"invalid_code_step: ctx.parallel '{'x' * 56}': nested too deep for its branches'"
    assert refused in run.error, run.error
    assert Step.objects.filter(run_id=run.id, type="parallel").count() == 3
    t = WorkflowTest(org=org)
    t.start("code-par-too-many", version=1, input={}, start_key="x2")
    run = t.run_until_waiting()
    assert run.status == "failed"
    assert run.error.endswith("invalid_code_step: ctx.parallel 'pair': complete is more than "
                              "its 2 branches")  # fmt: skip
    assert not Step.objects.filter(run_id=run.id, type="parallel").exists()


def run_page_waiting(
    org: Organisation, admin_client: Client, name: str, order: str
) -> tuple[str, dict[str, str]]:
    """A run of ``name`` taken until it waits, then its run page: the HTML and each step's
    state as the page marks it."""
    t = WorkflowTest(org=org)
    t.start(name, version=1, input={"order": order}, start_key=order)
    t.run_until_waiting()
    html = admin_client.get(f"/admin/workflows/run/{t.run().id}/change/").content.decode()
    return html, dict(re.findall(r'data-step="([^"]+)" data-state="([^"]+)"', html))


def test_the_run_page_draws_the_fork_from_the_parallel_step_to_its_join(
    org: Organisation, admin_client: Client
) -> None:
    html, states = run_page_waiting(org, admin_client, "code-par-waits", "o-8")
    assert states == {"both": "done", "nap": "waiting", "go": "waiting", "both.join": "waiting"}
    assert "both.0" not in html.split("<svg")[1].split("</svg>")[0]  # deciders left out


RACE_RUNS = 40
PARALLEL_MODULES = "tests.probe_steps,tests.code_parallel_workflows"


def test_two_workers_settling_both_branches_at_once_decide_each_turn_once(org, procs) -> None:
    """Two worker processes take the two branches' steps of each run at the same time; the
    settles meet under the run's lock. Every run must end with each branch's steps entered
    once, each decider turn taken once, and the top level going on past the join once."""
    run_ids = run_on_two_workers(org, "code-par-race", RACE_RUNS)
    runs = Run.objects.filter(pk__in=run_ids)
    assert {(r.status, r.error) for r in runs} == {("succeeded", "")}
    assert {str(r.output) for r in runs} == {str({"met": ["a", "b"], "after": 1})}
    for run_id in run_ids:
        entered = [(s.step_id, s.branch, s.status) for s in
                   Step.objects.filter(run_id=run_id).exclude(step_id__startswith="~")]  # fmt: skip
        counts: dict[tuple[str, int | None], int] = {}
        for step_id, branch, status in entered:
            assert status == "done", (run_id, step_id, status)
            counts[(step_id, branch)] = counts.get((step_id, branch), 0) + 1
        assert counts == {
            ("decide", None): 3, ("fan", None): 1, ("fan.join", None): 1, ("after", None): 1,
            ("fan.0", 0): 3, ("first", 0): 1, ("second", 0): 1,
            ("fan.1", 1): 3, ("first", 1): 1, ("second", 1): 1,
        }, run_id  # fmt: skip
    events = RunEvent.objects.filter(run__in=runs)
    assert events.filter(kind="step.succeeded", step_id="fan.join").count() == RACE_RUNS
    assert events.filter(kind="run.succeeded").count() == RACE_RUNS
    assert_raced(events)


def run_on_two_workers(org: Organisation, name: str, count: int) -> list[int]:
    """``count`` runs of ``name`` started, then taken to their end by two worker processes
    (and a relay) at once."""
    publish_code_workflow(org=org, name=name, version=1)
    run_ids = [
        run_start(org=org, automation_slug=name, run_input={}, start_key=f"{name}-{i}").run_id
        for i in range(count)
    ]
    workers = [spawn_worker(concurrency=4, WAYMARK_EXTRA_STEP_MODULES=PARALLEL_MODULES)
               for _ in range(2)]  # fmt: skip
    with running(spawn_relay(), *workers):
        wait_for(lambda: not Run.objects.filter(pk__in=run_ids, status="running").exists(),
                 timeout=300, what="every run to finish")  # fmt: skip
    return run_ids


def assert_raced(events: Any) -> None:
    """Both workers took part, and in some run two branches' first steps ran on the two."""
    claimed = set(events.filter(kind="step.claimed").values_list("worker", flat=True))
    assert len(claimed) == 2, "both workers must have taken part"
    firsts = events.filter(kind="step.claimed", step_id="first").values_list("run_id", "worker")
    by_run: dict[int, set[str]] = {}
    for run_id, worker in firsts:
        by_run.setdefault(run_id, set()).add(worker)
    assert any(len(workers) == 2 for workers in by_run.values())


def test_the_run_page_draws_nested_forks_without_their_deciders(
    org: Organisation, admin_client: Client
) -> None:
    html, states = run_page_waiting(org, admin_client, "code-par-nested", "o-9")
    graph = html.split("<svg")[1].split("</svg>")[0]
    assert {"outer", "inner", "inner.join", "outer.join", "go", "nap"} <= set(states), states
    assert (states["outer"], states["go"], states["outer.join"]) == ("done", "waiting", "waiting")
    assert not any(step in graph for step in ("inner.0.0", "inner.1.1", "outer.0")), states


NESTED_RACE_RUNS = 20


def test_two_workers_settling_nested_branches_at_once_decide_each_turn_once(org, procs) -> None:
    """The race above, one parallel deeper: four inner branches' steps settle on two worker
    processes at once, under the run's lock. Every run ends with each branch's steps entered
    once, each decider's turns taken once, and each join met once."""
    run_ids = run_on_two_workers(org, "code-par-nested-race", NESTED_RACE_RUNS)
    runs = Run.objects.filter(pk__in=run_ids)
    assert {(r.status, r.error) for r in runs} == {("succeeded", "")}
    assert {str(r.output) for r in runs} == {str({"met": [["xa", "xb"], ["ya", "yb"]],
                                                  "after": 1})}  # fmt: skip
    for run_id in run_ids:
        steps = Step.objects.filter(run_id=run_id).exclude(step_id__startswith="~")
        assert {s.status for s in steps} == {"done"}, run_id
        counts = Counter(s.step_id for s in steps)
        assert counts == {
            # The run's decider: fork, then "after", then the end.
            "decide": 3, "fan": 1, "fan.join": 1, "after": 1,
            # Each outer branch's decider: its inner fork, then its end.
            "fan.0": 2, "fan.1": 2, "inner": 2, "inner.join": 2,
            # Each inner branch's decider: two steps, then its end.
            "inner.0.0": 3, "inner.0.1": 3, "inner.1.0": 3, "inner.1.1": 3,
            "first": 4, "second": 4,
        }, run_id  # fmt: skip
        joins = steps.filter(step_id="inner.join")
        # Each inner parallel's branches on its own join row, which is on its outer branch.
        assert sorted(-1 if j.branch is None else j.branch for j in joins) == [0, 1]
        for join in joins:
            assert steps.filter(fork_join_id=join.id, step_id="first").count() == 2
    events = RunEvent.objects.filter(run__in=runs)
    assert events.filter(kind="step.succeeded", step_id="inner.join").count() == 2 * len(run_ids)
    assert events.filter(kind="run.succeeded").count() == NESTED_RACE_RUNS
    assert_raced(events)
