"""A signal's answer agrees with what happened, while the sweep matches signals late.

Sixty runs each wait on their own signal. Client threads send those signals through the API
while two threads run the sweep's late matching (``match_late``) in a tight loop, as sweepers
do every tick. Whoever consumes a signal, the API's answer must say so: ``consumed``, by the
step that took it, as its row says; and each run moves once. Before the fix the API stored
the signal in one transaction and delivered it in the next, and a sweep between the two
took it: the answer said ``pending`` for a signal the run had consumed. A duplicate sent at
the same moment said ``pending`` too. And a delivery whose wake fails keeps the signal,
pending, and says so (before, the error reached the sender after the signal was stored).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from workflows.engine.signals import deliver, match_late
from workflows.models import Signal, Step

from .concurrency import race
from .test_signals import kinds, run_of, start, waits_for

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 60
CLIENTS = 4
SWEEPERS = 2


def client_with(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def park_runs(org: Any) -> dict[str, int]:
    """A run waiting on ``order.paid`` for each correlation, by correlation."""
    runs = {f"o-{i}": start(org, waits_for(), key=f"r{i}", run_input={"order": f"o-{i}"})
            for i in range(RUNS)}  # fmt: skip
    connection.close()  # the threads open their own
    return runs


@contextmanager
def sweeping_late(threads: int) -> Iterator[None]:
    """``threads`` sweepers matching late signals in a tight loop until the block ends; the
    block begins once each has made a pass, so the sends race them from the first."""
    stop = threading.Event()
    started = [threading.Event() for _ in range(threads)]

    def sweep(index: int) -> None:
        try:
            while not stop.is_set():
                match_late()
                started[index].set()
        finally:
            connection.close()

    sweepers = [threading.Thread(target=sweep, args=(i,), daemon=True) for i in range(threads)]
    for sweeper in sweepers:
        sweeper.start()
    try:
        assert all(each.wait(timeout=60) for each in started), "a sweeper never made a pass"
        yield
    finally:
        stop.set()
        for sweeper in sweepers:
            sweeper.join(timeout=60)
        assert not any(sweeper.is_alive() for sweeper in sweepers), "a sweeper hung"


def send_share(raw_key: str, correlations: list[str], *, copies: int = 1) -> Any:
    """Each client thread sends its share of the signals (``copies`` of each, same id)."""

    def send(index: int) -> list[tuple[str, int, dict[str, Any]]]:
        client = client_with(raw_key)
        answers = []
        for correlation in correlations[index % CLIENTS :: CLIENTS]:
            body = {"name": "order.paid", "correlation": correlation, "id": f"pay-{correlation}",
                    "payload": {"amount": 1}}  # fmt: skip
            answer = client.post("/api/v1/signals", body, format="json")
            answers.append((correlation, answer.status_code, answer.json()))
        return answers

    return race(CLIENTS * copies, send)


def assert_every_answer_agrees(runs: dict[str, int], results: list[Any]) -> int:
    """Every answer names the step that consumed its signal, as the signal's row does; the
    number of answers checked."""
    checked = 0
    for result in results:
        assert not isinstance(result, BaseException), result
        for correlation, code, body in result:
            assert code in (200, 201), body
            signal = Signal.objects.get(pk=body["id"])
            taker = f"{runs[correlation]}/wait/1"
            assert (signal.consumed_at is not None, signal.consumed_by) == (True, taker)
            assert (body["status"], body["consumed_by"]) == ("consumed", taker), (
                f"answered {body} for a signal consumed by {signal.consumed_by}"
            )
            checked += 1
    return checked


def assert_each_run_moved_once(runs: dict[str, int]) -> None:
    for run_id in runs.values():
        assert run_of(run_id).status == "succeeded"
        assert kinds(run_id).count("step.signal") == 1


def test_the_answer_names_the_step_that_took_the_signal_while_sweeps_match_late(
    org, key_and_raw
) -> None:
    runs = park_runs(org)
    with sweeping_late(SWEEPERS):
        results = send_share(key_and_raw[1], list(runs))
    assert assert_every_answer_agrees(runs, results) == RUNS
    assert_each_run_moved_once(runs)
    assert Signal.objects.filter(consumed_at__isnull=True).count() == 0


def test_a_duplicate_sent_at_once_names_the_same_taker_as_the_first(org, key_and_raw) -> None:
    """Each signal sent twice at once with the same id: the first answer (201) and the
    duplicate's (200) both name the step that took it, never ``pending`` for a consumed one."""
    runs = park_runs(org)
    with sweeping_late(SWEEPERS):
        results = send_share(key_and_raw[1], list(runs), copies=2)
    assert assert_every_answer_agrees(runs, results) == 2 * RUNS
    codes = [code for result in results for _, code, _ in result]
    assert (codes.count(201), codes.count(200)) == (RUNS, RUNS)
    assert_each_run_moved_once(runs)


@contextmanager
def run_locked(run_id: int) -> Iterator[None]:
    """Another connection holds the run's lock until the block ends (as a long walk would)."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT id FROM workflows_run WHERE id = %s FOR UPDATE", [run_id])
                locked.set()
                release.wait(timeout=60)
        finally:
            connection.close()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert locked.wait(timeout=30), "the run was never locked"
        yield
    finally:
        release.set()
        holder.join(timeout=60)


def test_a_delivery_that_fails_keeps_the_signal_pending_and_says_so(org) -> None:
    """The step's wake fails (here: its run's lock is not free within lock_timeout): the
    signal is still stored, the answer says pending, as its row does; the sweep delivers it
    once the run is free."""
    run_id = start(org, waits_for())
    with run_locked(run_id):
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '100ms'")
        try:
            sent = deliver(org_id=org.pk, name="order.paid", correlation="o-7", identity="p1",
                           payload={"amount": 4})  # fmt: skip
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        signal = Signal.objects.get(pk=sent.signal_id)
        assert (sent.consumed_by, signal.consumed_at, signal.consumed_by) == ("", None, "")
        assert Step.objects.get(run_id=run_id, step_id="wait").status == "waiting"
    assert match_late() == 1
    signal.refresh_from_db()
    assert signal.consumed_by == f"{run_id}/wait/1"
    assert (run_of(run_id).status, run_of(run_id).output) == ("succeeded", "4")
    assert kinds(run_id).count("step.signal") == 1
