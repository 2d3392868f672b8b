"""Hops (workflows/engine/hops.py): a successful step's settle and its walk written by one
statement, from the run's row as the worker last saw it, checked against the row as it is.

A hop must write exactly what the slow settle writes, and write nothing when the run's row
changed since the walk's view of it or the attempt was fenced out.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.db import DataError, connection
from django.db.models import F
from django.utils import timezone

from workflows.engine.executors import StepResult
from workflows.engine.group_settle import GroupSettler, _Member
from workflows.engine.hops import hop, plan_hop
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import ClaimedStep, Settled, claim, claim_suspect, settle_and_take_next
from workflows.engine.transport import own_connection
from workflows.engine.walk import TakeNext
from workflows.models import Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .processes import kill_tree, spawn_worker, stop, wait_for

# An io step, quick steps walked inline (a set reading its output, a branch), an io step, end.
HOPPING: dict[str, Any] = {
    "start": "a",
    "steps": [
        {"id": "a", "type": "noop", "next": "note"},
        {"id": "note", "type": "set", "values": {"seen": "{{ steps.a.output.n }}"},
         "next": "route"},
        {"id": "route", "type": "branch",
         "when": [{"outcome": "big", "if": "steps.a.output.n > 3"}],
         "next": {"big": "b", "default": "done"}},
        {"id": "b", "type": "noop", "next": "done"},
        {"id": "done", "type": "end", "output": {"seen": "{{ vars.seen }}"}},
    ],
}  # fmt: skip
TAKE = TakeNext(worker="w", lane="io", lease_seconds=30)
IO = lane_policy("io")


def start(org: Any, key: str) -> Run:
    automation_publish_definition(org=org, slug="hopping", definition=HOPPING)
    run = Run.objects.get(pk=run_start(org=org, automation_slug="hopping", run_input={},
                                       start_key=key).run_id)  # fmt: skip
    # Every start in a test's one transaction is ready at the same now(), and the claim takes
    # equals in the index's order, not the runs'. Ready a moment earlier the earlier the run,
    # so claim_of(run) claims the runs in the order they started.
    earlier = timedelta(microseconds=10**9 - run.pk)
    Step.objects.filter(run=run, status="ready").update(lease_until=F("lease_until") - earlier)
    return run


def claim_of(run: Run, worker: str = "w") -> ClaimedStep:
    (step,) = claim(policy=IO, worker=worker, limit=1)
    assert step.run_id == run.pk
    return step


def hops_so_far(function: str = "waymark_settle_hop_v1") -> int:
    """Calls of the hop's function (or another) in this transaction (a test's django_db
    transaction)."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL track_functions = 'pl'")
        cursor.execute(
            "SELECT coalesce(pg_stat_get_xact_function_calls(%s::regproc), 0)", [function]
        )
        return int(cursor.fetchone()[0])


GROUP_FUNCTION = "waymark_settle_hops_v3"


def history(run: Run) -> list[tuple]:
    return list(
        RunEvent.objects.filter(run=run).order_by("id")
        .values_list("kind", "step_id", "iteration", "attempt", "worker", "detail")
    )  # fmt: skip


def step_rows(run: Run) -> list[tuple]:
    return [
        (s.step_id, s.iteration, s.type, s.lane, s.status, s.owner, s.attempt, s.max_attempts,
         s.output, s.error, s.lease_until is None, s.finished_at is None, s.wait_kind)
        for s in Step.objects.filter(run=run).order_by("id")
    ]  # fmt: skip


def run_row(run: Run) -> tuple:
    run.refresh_from_db()
    return (run.status, run.vars, run.outputs, run.entered, run.steps_executed, run.output,
            run.error, run.finished_at is None)  # fmt: skip


def settle_all(run: Run, *, hop: bool) -> list[Settled]:
    """Settle the run's io steps one after the other, each taking the next; ``hop=False``
    hides the run's row version from each settle, so it goes the slow way."""
    step: ClaimedStep | None = claim_of(run)
    settled = []
    outputs = iter([{"n": 5}, "b's"])
    while step is not None:
        if not hop:
            step = replace(step, run_seen=None)
        result = StepResult(output=next(outputs), vars={"from_" + step.step_id: True})
        settled.append(settle_and_take_next(step, result, worker="w", take=TAKE))
        step = settled[-1].next_step
    return settled


@pytest.mark.django_db
def test_a_hop_writes_what_the_slow_settle_writes(org) -> None:
    hopped_run, slow_run = start(org, "hop"), start(org, "slow")
    before = hops_so_far()

    hopped = settle_all(hopped_run, hop=True)
    assert hops_so_far() - before == 2  # both settles were hops
    slow = settle_all(slow_run, hop=False)
    assert hops_so_far() - before == 2  # none of these

    assert [s.ok for s in hopped] == [s.ok for s in slow] == [True, True]
    assert hopped[0].next_step is not None and hopped[0].next_step.run_seen is not None
    assert slow[0].next_step is not None and slow[0].next_step.run_seen is None
    assert run_row(hopped_run) == run_row(slow_run)
    assert run_row(hopped_run)[0] == "succeeded" and hopped_run.output == {"seen": "5"}
    assert step_rows(hopped_run) == step_rows(slow_run)
    assert history(hopped_run) == history(slow_run)
    assert [kind for kind, *_ in history(hopped_run)] == [
        "run.started", "step.ready", "step.claimed", "step.succeeded",  # a
        "step.succeeded", "step.succeeded", "step.ready", "step.claimed",  # note, route; b
        "step.succeeded", "step.succeeded", "run.succeeded",  # b, done
    ]  # fmt: skip


@pytest.mark.django_db(transaction=True)  # each settle commits or fails alone, as a worker's
def test_a_result_json_cannot_carry_is_refused_alike_by_a_hop_and_the_slow_settle(org) -> None:
    """NaN: Python's json writes it and PostgreSQL refuses it, so the slow settle's statement
    fails and writes nothing. A hop's document must not store something else in its place (an
    encoder that writes NaN as null, as orjson does, would store null where the slow settle
    fails): both ways fail the same and leave the run as it was."""
    for hops in (True, False):
        run = start(org, f"nan-{hops}")
        step = claim_of(run)
        if not hops:
            step = replace(step, run_seen=None)
        before = (run_row(run), step_rows(run), history(run))
        result = StepResult(output={"x": float("nan")})
        with pytest.raises(DataError, match="json"):
            settle_and_take_next(step, result, worker="w", take=TAKE)
        assert (run_row(run), step_rows(run), history(run)) == before


@pytest.mark.django_db
def test_a_fenced_out_attempt_hops_in_vain_and_writes_nothing(org) -> None:
    run = start(org, "k")
    first = claim_of(run)
    # Its lease lapses (a paused worker, say) and another worker takes the step over.
    Step.objects.filter(pk=first.id).update(lease_until=timezone.now() - timedelta(seconds=1))
    second = claim_suspect(policy=IO, worker="w2")
    assert second is not None and second.attempt == first.attempt + 1
    before = (hops_so_far(), history(run), step_rows(run), run_row(run))

    late = settle_and_take_next(first, StepResult(output={"n": 1}), worker="w", take=TAKE)

    assert not late.ok and late.next_step is None
    assert hops_so_far() == before[0] + 1
    assert (history(run), step_rows(run), run_row(run)) == before[1:]
    newest = settle_and_take_next(second, StepResult(output={"n": 1}), worker="w2", take=TAKE)
    assert newest.ok and run_row(run)[0] == "succeeded"  # n=1: straight to done


@pytest.mark.django_db(transaction=True)
def test_a_run_changed_under_a_hop_is_settled_from_its_row_as_it_is_now(org) -> None:
    """Another transaction holds the run's lock and changes its row while a hop waits for
    the lock: the hop finds a newer version and writes nothing; the slow settle then walks
    from the row as it is now (its change kept), once."""
    run = start(org, "k")
    step = claim_of(run)
    locker = own_connection(autocommit=False)
    locker.execute("SELECT 1 FROM workflows_run WHERE id = %s FOR NO KEY UPDATE", [run.pk])
    answer: list[Settled] = []

    def settle() -> None:
        try:
            answer.append(settle_and_take_next(step, StepResult(output={"n": 9}), worker="w",
                                               take=TAKE))  # fmt: skip
        finally:
            connection.close()

    settling = threading.Thread(target=settle)
    settling.start()
    try:
        wait_for(lambda: waiting_hops() == 1, what="the hop waiting for the run's lock")
        locker.execute(
            "UPDATE workflows_run SET vars = vars || '{\"meanwhile\": 1}' WHERE id = %s", [run.pk]
        )
        locker.commit()
        settling.join(timeout=60)
    finally:
        locker.close()

    (settled,) = answer
    assert settled.ok and settled.next_step is not None
    assert settled.next_step.step_id == "b" and settled.next_step.run_seen is None  # slow way
    run.refresh_from_db()
    assert run.vars == {"meanwhile": 1, "seen": "9"}
    kinds = [(kind, step_id) for kind, step_id, *_ in history(run)]
    assert kinds.count(("step.succeeded", "a")) == 1
    assert kinds.count(("step.claimed", "b")) == 1


def waiting_hops() -> int:
    """Backends waiting for a lock inside the hop's statement (pg_stat_activity, read on a
    connection of its own: a transaction sees one snapshot of it)."""
    with own_connection() as watcher:
        row = watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE %s AND datname = current_database()",
            ["%waymark_settle_hop_v1%"],
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.django_db
def test_a_runs_last_hop_claims_the_lanes_next_step_with_it_or_not_at_all(org) -> None:
    claiming = replace(TAKE, claim_lane=True)
    ending, waiting = start(org, "ending"), start(org, "waiting")
    step = claim_of(ending)
    before = hops_so_far()

    settled = settle_and_take_next(step, StepResult(output={"n": 1}), worker="w", take=claiming)

    assert hops_so_far() == before + 1
    assert settled.ok and settled.from_lane and settled.next_step is not None
    assert (settled.next_step.run_id, settled.next_step.step_id) == (waiting.pk, "a")
    assert run_row(ending)[0] == "succeeded"
    assert Step.objects.get(pk=settled.next_step.id).owner == "w"

    # The run changed since its claim: the hop writes nothing and its claim is undone with
    # it; the slow settle then claims the same step, once.
    changed, next_up = start(org, "changed"), start(org, "next")
    step = claim_of(changed)
    Run.objects.filter(pk=changed.pk).update(vars={"meanwhile": 1})
    settled = settle_and_take_next(step, StepResult(output={"n": 1}), worker="w", take=claiming)

    assert hops_so_far() == before + 2  # tried, and undone
    assert settled.ok and settled.next_step is not None
    assert (settled.next_step.run_id, settled.next_step.attempt) == (next_up.pk, 1)
    claims = RunEvent.objects.filter(run=next_up, kind="step.claimed")
    assert claims.count() == 1
    assert run_row(changed)[:2] == ("succeeded", {"meanwhile": 1, "seen": "1"})


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_as_it_hops_wrote_nothing_and_another_finishes_the_run(org) -> None:
    """A real worker process dies at the hop (WAYMARK_CRASH_AT, just before its statement is
    sent): the step is as claimed, nothing of its settle exists, and a second worker takes it
    over once its lease lapses, settles it and hops on to the end, each step once."""
    automation_publish_definition(org=org, slug="two", definition={
        "start": "a",
        "steps": [{"id": "a", "type": "noop", "next": "b"},
                  {"id": "b", "type": "noop", "next": "done"},
                  {"id": "done", "type": "end"}],
    })  # fmt: skip
    run_id = run_start(org=org, automation_slug="two", run_input={}, start_key="k").run_id
    doomed = spawn_worker(concurrency=1, WAYMARK_CRASH_AT="settle.after_step_update",
                          WAYMARK_IO_LEASE_SECONDS="1")  # fmt: skip
    try:
        assert doomed.wait(timeout=60) == 137
    finally:
        kill_tree(doomed)
    a = Step.objects.get(run_id=run_id, step_id="a")
    assert (a.status, a.attempt) == ("running", 1)
    assert not RunEvent.objects.filter(run_id=run_id, kind="step.succeeded").exists()
    assert Run.objects.get(pk=run_id).entered == {"a": 1}

    rescuer = spawn_worker(WAYMARK_IO_LEASE_SECONDS="1")
    try:
        wait_for(lambda: Run.objects.get(pk=run_id).status == "succeeded", timeout=60,
                 what="the second worker to finish the run")  # fmt: skip
    finally:
        stop(rescuer)
        kill_tree(rescuer)
    assert Step.objects.get(run_id=run_id, step_id="a").attempt == 2
    succeeded = RunEvent.objects.filter(run_id=run_id, kind="step.succeeded")
    assert sorted(succeeded.values_list("step_id", flat=True)) == ["a", "b", "done"]


# --- hops settled together (group_settle.py, hops.hops_together) ---------------------------


def settle_together(
    steps: list[ClaimedStep],
    outputs: list[Any],
    *,
    handed_back: int | None = None,
    take: TakeNext = TAKE,
) -> list[Settled]:
    """The steps' successful results settled as one group, as a worker's leading step thread
    settles what is waiting; a member the group hands back is settled alone, as its own
    thread would (``handed_back``: how many the group must hand back, when given)."""
    settler = GroupSettler("w")
    results = [
        StepResult(output=output, vars={"from_" + step.step_id: True})
        for step, output in zip(steps, outputs, strict=True)
    ]
    members = []
    for step, result in zip(steps, results, strict=True):
        planned = plan_hop(step, result, worker="w", take=take)
        assert planned is not None
        members.append(_Member(step, planned, take))
    settler._settle(members)
    assert settler.groups == 1
    if handed_back is not None:
        assert sum(member.outcome is None for member in members) == handed_back
    return [
        member.outcome or settle_and_take_next(member.step, result, worker="w", take=take)
        for member, result in zip(members, results, strict=True)
    ]


def event_transactions(runs: list[Run], kind: str, step_id: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT xmin::text) FROM workflows_runevent"
            " WHERE run_id = ANY(%s) AND kind = %s AND step_id = %s",
            [[run.pk for run in runs], kind, step_id],
        )
        return int(cursor.fetchone()[0])


@pytest.mark.django_db
def test_hops_settled_together_write_what_each_writes_alone(org) -> None:
    alone = [start(org, f"alone{n}") for n in range(3)]
    together = [start(org, f"together{n}") for n in range(3)]
    for run in alone:  # each of its two io steps hops alone, taking the next
        settled = settle_and_take_next(claim_of(run), StepResult(output={"n": 5},
                                       vars={"from_a": True}), worker="w", take=TAKE)  # fmt: skip
        assert settled.next_step is not None
        settle_and_take_next(settled.next_step, StepResult(output="b's", vars={"from_b": True}),
                             worker="w", take=TAKE)  # fmt: skip
    before, groups_before = hops_so_far(), hops_so_far(GROUP_FUNCTION)

    firsts = settle_together([claim_of(run) for run in together], [{"n": 5}] * 3, handed_back=0)
    seconds = [s.next_step for s in firsts]
    assert all(s is not None and s.step_id == "b" and s.run_seen for s in seconds)
    ended = settle_together([s for s in seconds if s is not None], ["b's"] * 3, handed_back=0)

    # Each group was one call of the group's function, and no member was settled alone.
    assert hops_so_far(GROUP_FUNCTION) - groups_before == 2
    assert hops_so_far() == before
    assert [s.ok for s in firsts + ended] == [True] * 6
    assert event_transactions(together, "step.succeeded", "a") == 1  # one statement each time
    assert event_transactions(together, "step.succeeded", "b") == 1
    for one, other in zip(alone, together, strict=True):
        assert run_row(one) == run_row(other)
        assert run_row(other)[0] == "succeeded"
        assert step_rows(one) == step_rows(other)
        assert history(one) == history(other)


@pytest.mark.django_db(transaction=True)  # each write its own transaction: a row's xmin moves
def test_in_a_group_a_fenced_hop_writes_nothing_and_a_changed_run_goes_the_slow_way(org) -> None:
    fenced_run, changed_run, plain_run = (start(org, key) for key in ("f", "c", "p"))
    stale = claim_of(fenced_run)
    changed, plain = claim_of(changed_run), claim_of(plain_run)
    # The first step's lease lapses and another worker takes it over; the second run's row
    # changes after its claim (an operator's edit, say).
    Step.objects.filter(pk=stale.id).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert claim_suspect(policy=IO, worker="w2") is not None
    Run.objects.filter(pk=changed_run.pk).update(vars={"meanwhile": 1})
    fenced_before = (history(fenced_run), step_rows(fenced_run), run_row(fenced_run))

    late, slow, hopped = settle_together([stale, changed, plain], [{"n": 5}] * 3)

    assert not late.ok and late.next_step is None
    assert (history(fenced_run), step_rows(fenced_run), run_row(fenced_run)) == fenced_before
    assert slow.ok and slow.next_step is not None and slow.next_step.run_seen is None  # slow way
    changed_run.refresh_from_db()
    assert changed_run.vars == {"meanwhile": 1, "seen": "5", "from_a": True}
    assert hopped.ok and hopped.next_step is not None and hopped.next_step.run_seen is not None


def claimed_in(runs: list[Run]) -> list[Step]:
    return list(Step.objects.filter(run__in=runs, status="running", owner="w"))


@pytest.mark.django_db(transaction=True)  # the engine's own transactions, as in a worker
def test_a_group_claims_for_the_runs_it_ended_only_in_its_own_round_trip(org) -> None:
    """The group's claim goes with its statement, before their answers (sql.CLAIM_AFTER_HOPS,
    rows.transaction_pipelined): it claims one step for each run's last hop that wrote, none
    for one that was fenced out, and commits with the group, in one transaction."""
    ending = [start(org, f"ending{n}") for n in range(3)]
    last_steps = [claim_of(run) for run in ending]
    waiting = [start(org, f"waiting{n}") for n in range(4)]
    # The third run's step is taken over by another worker (its lease lapsed): fenced.
    Step.objects.filter(pk=last_steps[2].id).update(lease_until=timezone.now())
    assert claim_suspect(policy=IO, worker="w2") is not None

    settled = settle_together(last_steps, [{"n": 1}] * 3, handed_back=0,
                              take=replace(TAKE, claim_lane=True))  # fmt: skip

    assert [s.ok for s in settled] == [True, True, False]
    assert settled[2].next_step is None
    nexts = [s.next_step for s in settled[:2]]
    assert all(n is not None and n.step_id == "a" for n in nexts)
    claimed = claimed_in(waiting)
    assert sorted(step.pk for step in claimed) == sorted(n.id for n in nexts if n is not None)
    assert Step.objects.filter(run__in=waiting, status="ready").count() == 2  # two, no more
    assert [run_row(run)[0] for run in ending] == ["succeeded", "succeeded", "running"]
    with connection.cursor() as cursor:  # the runs' ends and the claims: one transaction
        cursor.execute(
            "SELECT count(DISTINCT xmin::text) FROM workflows_runevent"
            " WHERE (run_id = ANY(%s) AND kind = 'run.succeeded')"
            " OR (run_id = ANY(%s) AND kind = 'step.claimed')",
            [[run.pk for run in ending], [run.pk for run in waiting]],
        )
        assert cursor.fetchone()[0] == 1


@pytest.mark.django_db(transaction=True)
def test_a_runs_last_hop_alone_claims_only_when_it_wrote(org) -> None:
    """Alone, a run's last hop and its claim go in one round trip too: when the run changed
    since the walk's view of it, the hop writes nothing and the claim takes nothing."""
    claiming = replace(TAKE, claim_lane=True)
    changed, ending = start(org, "changed"), start(org, "ending")
    waiting = [start(org, f"waiting{n}") for n in range(2)]
    stale, step = claim_of(changed), claim_of(ending)
    Run.objects.filter(pk=changed.pk).update(vars={"meanwhile": 1})

    assert hop(stale, StepResult(output={"n": 1}), worker="w", take=claiming) is None
    assert claimed_in(waiting) == []
    assert not RunEvent.objects.filter(run__in=waiting, kind="step.claimed").exists()

    hopped = hop(step, StepResult(output={"n": 1}), worker="w", take=claiming)
    assert hopped is not None and hopped.ok and hopped.claimed is not None
    assert [s.pk for s in claimed_in(waiting)] == [hopped.claimed["id"]]
    assert run_row(ending)[0] == "succeeded"


def waiting_step(run: Run) -> Step:
    """A step of another path of the run, waiting (a timer, say): live when the run ends."""
    return Step.objects.create(
        org_id=run.org_id, run=run, step_id="elsewhere", type="wait", lane="inline",
        status="waiting", max_attempts=1, wait_kind="timer",
        wake_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip


@pytest.mark.django_db
def test_a_group_that_ends_runs_cancels_their_live_steps_as_each_hop_alone_does(org) -> None:
    alone = [start(org, f"alone{n}") for n in range(2)]
    together = [start(org, f"together{n}") for n in range(2)]
    for run in alone + together:
        waiting_step(run)
    for run in alone:
        settle_all(run, hop=True)
    groups_before = hops_so_far(GROUP_FUNCTION)

    firsts = settle_together([claim_of(run) for run in together], [{"n": 5}] * 2, handed_back=0)
    seconds = [s.next_step for s in firsts if s.next_step is not None]
    settle_together(seconds, ["b's"] * 2, handed_back=0)

    assert hops_so_far(GROUP_FUNCTION) - groups_before == 2
    for one, other in zip(alone, together, strict=True):
        assert run_row(other)[0] == "succeeded"
        assert Step.objects.get(run=other, step_id="elsewhere").status == "cancelled"
        assert step_rows(one) == step_rows(other)
        assert history(one) == history(other)  # the cancellation before the run's end
        assert ("step.cancelled", "elsewhere") in [(k, s) for k, s, *_ in history(other)]


@pytest.mark.django_db
def test_two_hops_of_one_run_in_a_group_settle_once_each_way(org) -> None:
    """The group settles a run's first member only; another member of the same run (a
    duplicate result here) is handed back and settled alone, from the run as it is now."""
    run, other = start(org, "one"), start(org, "other")
    step, other_step = claim_of(run), claim_of(other)

    first, again, neighbour = settle_together([step, step, other_step], [{"n": 5}] * 3,
                                              handed_back=1)  # fmt: skip

    assert first.ok and first.next_step is not None and first.next_step.run_seen is not None
    assert neighbour.ok and neighbour.next_step is not None
    assert not again.ok and again.next_step is None  # alone: its attempt is settled already
    kinds = [(kind, step_id) for kind, step_id, *_ in history(run)]
    assert kinds.count(("step.succeeded", "a")) == 1
    assert kinds.count(("step.claimed", "b")) == 1


@pytest.mark.django_db
def test_a_group_that_ends_runs_claims_a_step_of_the_lane_for_each_in_its_transaction(org) -> None:
    """As a run's last hop alone does (TakeNext.claim_lane): each member whose run the group
    ends gets a ready step of the lane as its next step, claimed in the group's transaction,
    and no more steps are claimed than such members."""
    ending = [start(org, f"ending{n}") for n in range(2)]
    last_steps = [claim_of(run) for run in ending]
    waiting = [start(org, f"waiting{n}") for n in range(3)]
    claiming = replace(TAKE, claim_lane=True)
    groups_before = hops_so_far(GROUP_FUNCTION)

    # n = 1: the walk goes from a straight to the end (HOPPING's branch).
    settled = settle_together(last_steps, [{"n": 1}] * 2, handed_back=0, take=claiming)

    assert hops_so_far(GROUP_FUNCTION) - groups_before == 1
    assert [run_row(run)[0] for run in ending] == ["succeeded", "succeeded"]
    nexts = [s.next_step for s in settled]
    assert all(s.ok and s.from_lane for s in settled)
    assert all(n is not None and n.step_id == "a" for n in nexts)
    claimed_runs = {n.run_id for n in nexts if n is not None}
    assert len(claimed_runs) == 2 and claimed_runs < {run.pk for run in waiting}
    claimed = Step.objects.filter(run__in=waiting, status="running", owner="w")
    assert sorted(claimed.values_list("run_id", flat=True)) == sorted(claimed_runs)
    ready = Step.objects.filter(run__in=waiting, status="ready")
    assert ready.count() == 1  # one step per ended run, no more
    # One transaction: the runs' ends and the claims committed together.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT xmin::text) FROM workflows_runevent"
            " WHERE (run_id = ANY(%s) AND kind = 'run.succeeded')"
            " OR (run_id = ANY(%s) AND kind = 'step.claimed')",
            [[run.pk for run in ending], list(claimed_runs)],
        )
        assert cursor.fetchone()[0] == 1
