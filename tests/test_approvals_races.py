"""Races, with threads on separate database connections released together by a barrier:
two people deciding the same request at once, and a decision racing the deadline (the
sweep firing it and the worker's executor settling the request). Whoever wins, the run
moves on exactly once, and its outcome agrees with the request and the audit."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from approvals.models import ApprovalRequest, DecisionAttempt
from approvals.services import Actor, Outcome, decide
from workflows.engine.waits import fire_due_deadlines
from workflows.models import Run, RunEvent

from .effect_setup import drive
from .processes import wait_for
from .test_approvals_setup import open_request, person

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 6


def together(*work: Callable[[], Any]) -> list[Any]:
    """Run each callable in its own thread (its own connection), released at once."""
    barrier = threading.Barrier(len(work))
    results: list[Any] = [None] * len(work)
    errors: list[BaseException] = []

    def runner(index: int, fn: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[index] = fn()
        except BaseException as exc:  # reported to the test below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=runner, args=(i, fn)) for i, fn in enumerate(work)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


def ask_events(run: Run) -> list[str]:
    return list(
        RunEvent.objects.filter(run=run, step_id="ask")
        .order_by("id")
        .values_list("kind", flat=True)
    )


def endings(run: Run) -> list[str]:
    """How the approval step ended (a decision's wake, or its executor after the deadline),
    and how the run did: each exactly once."""
    step_ends = {"step.approval", "step.succeeded", "step.failed"}
    events = RunEvent.objects.filter(run=run).order_by("id").values_list("kind", "step_id")
    return [
        kind
        for kind, step_id in events
        if (step_id == "ask" and kind in step_ends) or kind in ("run.succeeded", "run.failed")
    ]


def deciding(approval_id: int, user: Any, decision: str) -> Callable[[], Outcome]:
    actor = Actor(via="admin", name=user.username, user=user)
    return lambda: decide(approval_id, decision=decision, actor=actor)


def sweeping_then_working(approval_id: int) -> Callable[[], int]:
    """The sweeper fires the deadline as soon as the database says it is due (unless the
    decision came first); then the worker runs the woken executor, which settles it."""

    def work() -> int:
        fired = 0
        while not fired and ApprovalRequest.objects.get(pk=approval_id).status == "pending":
            fired = fire_due_deadlines()
        return fired + drive(lane="human")

    return work


def test_two_people_deciding_at_once_one_wins_the_other_is_told(org) -> None:
    alice, bob = person(org, "alice"), person(org, "bob")
    for round_no in range(ROUNDS):
        run, approval = open_request(org, key=f"k{round_no}")

        outcomes = together(
            deciding(approval.pk, alice, "approve"), deciding(approval.pk, bob, "reject")
        )

        assert sorted(o.code for o in outcomes) == ["accepted", "already_decided"]
        winner = next(o for o in outcomes if o.accepted)
        loser = next(o for o in outcomes if not o.accepted)
        approval.refresh_from_db()
        run.refresh_from_db()
        assert approval.decided_by in loser.message  # the loser reads back who won
        assert winner.message == f"{approval.status.capitalize()} by {approval.decided_by}."
        expected = (
            "rejected" if approval.status == "rejected" else f"approved by {approval.decided_by}"
        )
        assert (run.status, run.output) == ("succeeded", expected)
        assert endings(run) == ["step.approval", "run.succeeded"]


def test_a_decision_racing_the_deadline_moves_the_run_once(org) -> None:
    alice = person(org, "alice")
    seen: set[str] = set()
    for round_no in range(ROUNDS):
        run, approval = open_request(org, key=f"d{round_no}")
        # The deadline is a moment away, for the request and its step alike.
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE approvals_approvalrequest SET expires_at = now() + "
                "interval '30 milliseconds' WHERE id = %s",
                [approval.pk],
            )
            cursor.execute(
                "UPDATE workflows_step SET wake_at = now() + interval '30 milliseconds' "
                "WHERE id = %s",
                [approval.step_row_id],
            )

        outcome, _ = together(
            deciding(approval.pk, alice, "approve"), sweeping_then_working(approval.pk)
        )
        drive(lane="human")  # whatever the worker thread left (a step it lost the race for)

        approval.refresh_from_db()
        run.refresh_from_db()
        seen.add(approval.status)
        assert endings(run) in (
            ["step.approval", "run.succeeded"],
            ["step.succeeded", "run.succeeded"],
        )
        attempt = DecisionAttempt.objects.get(approval=approval)
        if approval.status == "approved":
            assert outcome.accepted and attempt.accepted
            assert (run.status, run.output) == ("succeeded", "approved by alice")
        else:
            assert approval.status == "expired"
            assert (outcome.code, attempt.reason) == ("expired", "expired")
            assert (run.status, run.output) == ("succeeded", "late")
    assert seen <= {"approved", "expired"}


def lock_waiters() -> int:
    """How many connections of this database wait for a lock now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def lock_waiters_are(count: int) -> Callable[[], bool]:
    return lambda: lock_waiters() == count


def test_a_decision_that_loses_to_a_cancel_is_told_the_run_was_cancelled(org) -> None:
    """The decision checks the run (running), then waits for the run's lock behind a cancel,
    which commits first: the decision is refused ``run_cancelled`` (who won), not a vague
    ``step_closed``, and changes nothing. The order is made, not hoped for: a third
    connection holds the run's lock until the cancel, then the decision, wait in line."""
    from workflows.services.control import run_act

    alice = person(org, "alice")
    run, approval = open_request(org)
    holding, release = threading.Event(), threading.Event()
    answers: dict[str, Any] = {}

    def hold() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT id FROM workflows_run WHERE id = %s FOR UPDATE", [run.pk])
            holding.set()
            release.wait(timeout=60)

    def cancel() -> None:
        answers["cancel"] = run_act(org=org, run_id=run.pk, action="cancel", actor="op")

    def decision() -> None:
        answers["decision"] = deciding(approval.pk, alice, "approve")()

    threads = []
    for index, (work, waiters) in enumerate(((hold, 0), (cancel, 1), (decision, 2))):
        threads.append(in_thread(work))
        if index == 0:
            assert holding.wait(timeout=30), "the run was never locked"
        else:
            wait_for(lock_waiters_are(waiters),
                     what=f"{waiters} connection(s) waiting for the run's lock")  # fmt: skip
    release.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)

    assert answers["cancel"].status == "cancelled"
    outcome = answers["decision"]
    assert (outcome.accepted, outcome.code) == (False, "run_cancelled"), outcome
    approval.refresh_from_db()
    assert approval.status == "pending"  # the decision changed nothing (the sweep closes it)
    attempt = DecisionAttempt.objects.get(approval=approval)
    assert (attempt.accepted, attempt.reason) == (False, "run_cancelled")
    assert "step.approval" not in ask_events(run)


def in_thread(work: Callable[[], None]) -> threading.Thread:
    def body() -> None:
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread
