"""`parallel` and `join`, in process: branches know their fork, a join continues once.

Workers are played by claim and settle in the test; the racing proofs with real worker
processes are in test_parallel_races.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from workflows.engine.executors import StepFailure, StepResult
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import ClaimedStep, claim, settle_failure, settle_success
from workflows.models import Organisation, Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.control import run_act
from workflows.services.runs import run_start

pytestmark = pytest.mark.django_db


def fork(complete: Any = "all", branches: int = 2, **extra: Any) -> dict[str, Any]:
    names = [f"b{i}" for i in range(branches)]
    join: dict[str, Any] = {"id": "meet", "type": "join", "wait_for": names, "next": "after"}
    if complete != "all":
        join["complete"] = complete
    return {
        "start": "fan",
        **extra,
        "steps": [
            {"id": "fan", "type": "parallel", "branches": names, "next": "meet"},
            *[{"id": n, "type": "noop", "output": {"from": n}, "next": "meet"} for n in names],
            join,
            {"id": "after", "type": "set", "values": {"joined": True}, "next": "done"},
            {"id": "done", "type": "end", "output": "{{ steps.meet.output.arrived | join(',') }}"},
        ],
    }


def start(org: Organisation, definition: dict[str, Any], key: str = "k") -> Run:
    automation_publish_definition(org=org, slug="fork", definition=definition)
    return Run.objects.get(pk=run_start(org=org, automation_slug="fork", run_input={},
                                        start_key=key).run_id)  # fmt: skip


def claim_io() -> dict[str, ClaimedStep]:
    return {s.step_id: s for s in claim(policy=lane_policy("io"), worker="w", limit=20)}


def settle(step: ClaimedStep) -> bool:
    return settle_success(step, StepResult(output={"from": step.step_id}), worker="w")


def kinds(run: Run, kind: str) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run=run, kind=kind).order_by("id"))


def test_a_parallel_starts_each_branch_under_one_waiting_join(org) -> None:
    run = start(org, fork())

    join = Step.objects.get(run=run, step_id="meet")
    assert (join.status, join.wait_kind) == ("waiting", "join")
    assert join.wait_detail == {"need": 2, "branches": 2, "arrived": [], "fork": "fan"}
    rows = {s.step_id: s for s in Step.objects.filter(run=run, step_id__in=["b0", "b1"])}
    assert {(s.status, s.fork_join_id, s.branch) for s in rows.values()} == {
        ("ready", join.pk, 0), ("ready", join.pk, 1),
    }  # fmt: skip
    claimed = claim_io()
    assert {s.place.fork_join for s in claimed.values()} == {join.pk}


def test_the_join_continues_once_when_every_branch_has_arrived(org) -> None:
    run = start(org, fork())
    claimed = claim_io()

    assert settle(claimed["b1"])
    join = Step.objects.get(run=run, step_id="meet")
    assert join.wait_detail is not None
    assert (join.status, join.wait_detail["arrived"]) == ("waiting", [1])
    assert not Step.objects.filter(run=run, step_id="after").exists()

    assert settle(claimed["b0"])
    run.refresh_from_db()
    join.refresh_from_db()
    assert join.status == "done"
    assert (run.status, run.output) == ("succeeded", "1,0")
    assert Step.objects.filter(run=run, step_id="after").count() == 1
    assert run.vars == {"joined": True}
    assert run.outputs["b0"] == {"from": "b0"} and run.outputs["b1"] == {"from": "b1"}


def test_first_completes_the_join_and_cancels_the_other_branch(org) -> None:
    run = start(org, fork("first"))
    claimed = claim_io()

    assert settle(claimed["b0"])

    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "0")
    assert Step.objects.get(run=run, step_id="b1").status == "cancelled"
    assert settle(claimed["b1"]) is False  # its late settle changes nothing
    assert len(kinds(run, "run.succeeded")) == 1


def test_a_number_of_branches_completes_the_join(org) -> None:
    run = start(org, fork(2, branches=3))
    claimed = claim_io()

    assert settle(claimed["b2"])
    assert settle(claimed["b0"])

    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "2,0")
    assert Step.objects.get(run=run, step_id="b1").status == "cancelled"


def test_a_failing_branch_fails_the_run_and_ends_its_sibling(org) -> None:
    run = start(org, fork())
    claimed = claim_io()

    failure = StepFailure("no", retryable=False)
    assert settle_failure(claimed["b0"], failure, worker="w", policy=lane_policy("io"))

    run.refresh_from_db()
    assert run.status == "failed"
    statuses = dict(Step.objects.filter(run=run).values_list("step_id", "status"))
    assert statuses["b1"] == "cancelled" and statuses["meet"] == "cancelled"
    assert settle(claimed["b1"]) is False
    assert claim_io() == {}


def failed_then_retried(org: Any, run: Run, step: Any) -> None:
    """``step`` (claimed) fails for good, which fails the run; an operator retries it."""
    failure = StepFailure("no", retryable=False)
    assert settle_failure(step, failure, worker="w", policy=lane_policy("io"))
    run.refresh_from_db()
    assert run.status == "failed"
    run_act(org=org, run_id=run.pk, action="retry", actor="ops")


def test_a_retry_of_a_run_a_branch_failed_runs_it_and_its_sibling_again_and_joins_once(
    org,
) -> None:
    run = start(org, fork())
    failed_then_retried(org, run, claim_io()["b0"])
    # The failed step, a new series of its row; the sibling the failure cancelled, entered
    # again where it was; the join waits again for both.
    again = claim_io()
    assert sorted((s.step_id, s.iteration) for s in again.values()) == [("b0", 1), ("b1", 2)]
    assert settle(again["b1"]) and settle(again["b0"])
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "1,0")
    assert Step.objects.filter(run=run, step_id="after").count() == 1  # joined once
    assert claim_io() == {}


def test_a_retry_goes_on_inside_the_nested_parallel_a_sibling_branch_was_in(org) -> None:
    # b1 fails while the other branch is inside a parallel of its own (i0, i1 not run yet):
    # the retry continues the inner join too and enters i0 and i1 again, so both joins meet.
    noop = {"type": "noop"}
    run = start(org, {
        "start": "fan",
        "steps": [
            {"id": "fan", "type": "parallel", "branches": ["inner", "b1"], "next": "meet"},
            {"id": "inner", "type": "parallel", "branches": ["i0", "i1"], "next": "imeet"},
            {"id": "i0", **noop, "next": "imeet"},
            {"id": "i1", **noop, "next": "imeet"},
            {"id": "imeet", "type": "join", "wait_for": ["i0", "i1"], "next": "meet"},
            {"id": "b1", **noop, "next": "meet"},
            {"id": "meet", "type": "join", "wait_for": ["inner", "b1"], "next": "done"},
            {"id": "done", "type": "end", "output": "{{ steps.meet.output.arrived | join(',') }}"},
        ],
    })  # fmt: skip
    failed_then_retried(org, run, claim_io()["b1"])
    again = claim_io()
    assert sorted((s.step_id, s.iteration) for s in again.values()) == [
        ("b1", 1), ("i0", 2), ("i1", 2),
    ]  # fmt: skip
    assert settle(again["i0"]) and settle(again["b1"]) and settle(again["i1"])
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "1,0")
    assert Step.objects.filter(run=run, step_id="imeet", status="done").count() == 1
    assert claim_io() == {}


def test_a_branch_that_ends_the_run_ends_the_other_branch(org) -> None:
    definition = fork()
    definition["steps"][1] = {"id": "b0", "type": "end", "output": "b0 ended it"}
    run = start(org, definition)

    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "b0 ended it")
    # b0 ended the run in the walk that forked: b1 was never entered, nothing is claimable.
    assert set(Step.objects.filter(run=run).values_list("status", flat=True)) == {
        "done",
        "cancelled",
    }
    assert claim_io() == {}


def test_quick_branches_meet_in_the_same_walk(org) -> None:
    definition = fork()
    definition["steps"][1] = {"id": "b0", "type": "set", "values": {"left": 1}, "next": "meet"}
    definition["steps"][2] = {"id": "b1", "type": "set", "values": {"right": 2}, "next": "meet"}

    run = start(org, definition)

    assert run.status == "succeeded"
    assert run.vars == {"left": 1, "right": 2, "joined": True}  # neither overwrote the other


def test_a_loop_forks_anew_and_each_join_counts_its_own_pass(org) -> None:
    definition = fork(limits={"max_steps": 50})
    definition["steps"][-2] = {
        "id": "after", "type": "branch",
        "when": [{"outcome": "again", "if": "steps.fan.output is defined and "
                  "(vars.turns | default(0)) < 1"}],
        "next": {"again": "count", "default": "done"},
    }  # fmt: skip
    definition["steps"].append(
        {"id": "count", "type": "set", "values": {"turns": 1}, "next": "fan"}
    )
    run = start(org, definition)

    first = claim_io()
    assert settle(first["b0"]) and settle(first["b1"])  # first pass joins, loops once
    second = claim_io()
    assert {s.iteration for s in second.values()} == {2}
    joins = list(Step.objects.filter(run=run, step_id="meet").order_by("iteration"))
    assert [(j.iteration, j.status) for j in joins] == [(1, "done"), (2, "waiting")]
    assert {s.place.fork_join for s in second.values()} == {joins[1].pk}
    assert settle(second["b0"]) and settle(second["b1"])
    run.refresh_from_db()
    assert run.status == "succeeded", run.error


def test_a_join_reached_outside_its_fork_passes_through(org) -> None:
    run = start(org, {
        "start": "meet",
        "steps": [
            {"id": "meet", "type": "join", "wait_for": ["meet"], "next": "done"},
            {"id": "done", "type": "end", "output": "through"},
        ],
    })  # fmt: skip
    assert (run.status, run.output) == ("succeeded", "through")


def test_a_parallel_whose_next_is_not_a_join_is_refused() -> None:
    from workflows.definitions.validator import validate_definition

    issues = validate_definition({
        "start": "fan",
        "steps": [
            {"id": "fan", "type": "parallel", "branches": ["a", "b"], "next": "a_end"},
            {"id": "a", "type": "noop"},
            {"id": "b", "type": "noop"},
            {"id": "a_end", "type": "end"},
        ],
    })  # fmt: skip
    assert [(i.code, i.step, i.field) for i in issues] == [("invalid_field", "fan", "next")]


def test_a_branch_that_splits_into_paths_of_its_own_counts_once_at_the_join(org) -> None:
    """A join-less parallel inside a branch: its two paths each reach (or end at) the join's
    fork, but the branch arrives once; the join still waits for the other branch."""
    run = start(org, {
        "start": "fan",
        "steps": [
            {"id": "fan", "type": "parallel", "branches": ["a", "split"], "next": "meet"},
            {"id": "a", "type": "noop", "next": "meet"},
            {"id": "split", "type": "parallel", "branches": ["c", "d"]},
            {"id": "c", "type": "noop", "next": "meet"},
            {"id": "d", "type": "noop"},
            {"id": "meet", "type": "join", "wait_for": ["a", "c"], "next": "done"},
            {"id": "done", "type": "end"},
        ],
    })  # fmt: skip
    steps = claim_io()
    assert settle(steps["c"]) and settle(steps["d"])  # the second branch arrives, twice over
    run.refresh_from_db()
    assert run.status == "running"  # the join still waits for branch a
    assert Step.objects.get(run=run, step_id="a").status == "running"
    assert settle(steps["a"])
    run.refresh_from_db()
    assert run.status == "succeeded"
    arrived = kinds(run, "join.arrived")
    assert [(e.detail or {}).get("branch") for e in arrived] == [1, 0]


@pytest.mark.parametrize(
    ("shape", "code", "step", "message_names"),
    [
        (
            {"start": "p1", "steps": [
                {"id": "p1", "type": "parallel", "branches": ["a", "p2"], "next": "j"},
                {"id": "a", "type": "noop", "next": "j"},
                {"id": "p2", "type": "parallel", "branches": ["c", "d"], "next": "j"},
                {"id": "c", "type": "noop", "next": "j"},
                {"id": "d", "type": "noop", "next": "j"},
                {"id": "j", "type": "join", "wait_for": ["a", "c", "d"], "next": "done"},
                {"id": "done", "type": "end"}]},
            "join_shared", "p2", ('"p1"', '"p2"', '"j"'),
        ),
        (
            {"start": "p", "steps": [
                {"id": "p", "type": "parallel", "branches": ["a", "b"], "next": "j"},
                {"id": "a", "type": "noop", "next": "after"},
                {"id": "b", "type": "noop", "next": "j"},
                {"id": "j", "type": "join", "wait_for": ["a", "b"], "next": "after"},
                {"id": "after", "type": "email", "connection": "mail", "to": "a@example.com",
                 "subject": "s", "body": "b", "next": "done"},
                {"id": "done", "type": "end"}]},
            "branch_leaves_fork", "p", ('"p"', '"after"', '"j"'),
        ),
    ],
)  # fmt: skip
def test_parallel_shapes_the_engine_cannot_run_as_written_are_refused_naming_both_steps(
    shape: dict[str, Any], code: str, step: str, message_names: tuple[str, ...]
) -> None:
    from workflows.definitions.validator import validate_definition

    (issue,) = validate_definition(shape)
    assert (issue.code, issue.step) == (code, step)
    assert all(name in issue.message for name in message_names), issue.message


def test_branches_sharing_an_end_step_and_a_loop_around_the_fork_are_not_refused() -> None:
    from workflows.definitions.validator import validate_definition

    assert validate_definition({"start": "p", "limits": {"max_steps": 50}, "steps": [
        {"id": "p", "type": "parallel", "branches": ["a", "b"], "next": "j"},
        {"id": "a", "type": "noop", "next": "j", "on_failure": "stop"},
        {"id": "b", "type": "noop", "next": "j"},
        {"id": "j", "type": "join", "wait_for": ["a", "b"], "next": "again"},
        {"id": "again", "type": "branch", "when": [{"outcome": "yes", "if": "input.loop"}],
         "next": {"yes": "p", "default": "stop"}},
        {"id": "stop", "type": "end"},
    ]}) == []  # fmt: skip


# --- forking and joining are declared by the step types, not named ------------------------


@pytest.fixture
def renamed_fork_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """`parallel` and `join` as two other types that declare `forks` and `joins`, registered
    for this test only (the registry is restored after it)."""
    from workflows.definitions.registry import StepType, registry
    from workflows.steptypes import JOIN, PARALLEL

    monkeypatch.setattr(registry, "_types", dict(registry._types))
    for declared, name in ((PARALLEL, "tests_fan"), (JOIN, "tests_meet")):
        copy = StepType(
            name=name, lane=declared.lane, validate=declared.validate, execute=declared.execute,
            built=True, app="tests", forks=declared.forks, joins=declared.joins,
            references=declared.references,
        )  # fmt: skip
        registry.register(copy)


def renamed(definition: dict[str, Any]) -> dict[str, Any]:
    names = {"parallel": "tests_fan", "join": "tests_meet"}
    steps = [{**s, "type": names.get(s["type"], s["type"])} for s in definition["steps"]]
    return {**definition, "steps": steps}


@pytest.mark.usefixtures("renamed_fork_types")
def test_the_walk_forks_and_joins_by_the_types_declarations_not_their_names(org) -> None:
    run = start(org, renamed(fork("first")))
    join = Step.objects.get(run=run, step_id="meet")
    assert (join.type, join.status, join.wait_kind) == ("tests_meet", "waiting", "join")
    assert Step.objects.get(run=run, step_id="fan").type == "tests_fan"
    claimed = claim_io()
    assert {s.place.fork_join for s in claimed.values()} == {join.pk}

    assert settle(claimed["b0"])  # `first`: completes the join, the other branch ends

    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "0")
    assert Step.objects.get(run=run, step_id="b1").status == "cancelled"


@pytest.mark.usefixtures("renamed_fork_types")
def test_the_fork_shapes_and_the_join_check_ask_the_declarations() -> None:
    from workflows.definitions.validator import validate_definition

    shared = renamed({"start": "p1", "steps": [
        {"id": "p1", "type": "parallel", "branches": ["a", "p2"], "next": "j"},
        {"id": "a", "type": "noop", "next": "j"},
        {"id": "p2", "type": "parallel", "branches": ["c", "d"], "next": "j"},
        {"id": "c", "type": "noop", "next": "j"},
        {"id": "d", "type": "noop", "next": "j"},
        {"id": "j", "type": "join", "wait_for": ["a", "c", "d"], "next": "done"},
        {"id": "done", "type": "end"}]})  # fmt: skip
    assert [(i.code, i.step) for i in validate_definition(shared)] == [("join_shared", "p2")]
    not_a_join = renamed({"start": "fan", "steps": [
        {"id": "fan", "type": "parallel", "branches": ["a", "b"], "next": "a_end"},
        {"id": "a", "type": "noop"}, {"id": "b", "type": "noop"},
        {"id": "a_end", "type": "end"}]})  # fmt: skip
    (issue,) = validate_definition(not_a_join)
    assert (issue.code, issue.step, issue.field) == ("invalid_field", "fan", "next")
    assert '"join" or "tests_meet"' in issue.message
