"""Waiting for a run to end (services/run_waits.py, ``run_wait`` in workflows.plugins.runs):
the caller is told by the transaction that ends the run, whatever ends it (a worker's hop, run
control), through the trigger run_ended_notify; runs nobody waits for notify nobody; a wait
that times out, or that is left by a killed caller, leaves no row behind; an ending that no
notification reports is still seen. Real threads and connections: the ending commits in
another transaction while the caller waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from workflows.engine.transport import own_connection
from workflows.errors import UnknownRun
from workflows.models import Organisation, RunWaiter
from workflows.plugins.runs import WaitInTransaction, run_wait
from workflows.services import run_waits
from workflows.services.automations import automation_publish_definition
from workflows.services.control import run_act
from workflows.services.runs import run_start

from .effect_setup import drive
from .factories import IO_DEFINITION, SIGNAL_WAIT_DEFINITION

pytestmark = pytest.mark.django_db(transaction=True)

SOON = 30.0  # the most a test waits for what it waits for (never reached when all is well)


@pytest.fixture
def started(org: Organisation) -> Callable[[str], int]:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    automation_publish_definition(org=org, slug="waits", definition=SIGNAL_WAIT_DEFINITION)
    count = iter(range(1_000))

    def start(slug: str) -> int:
        n = next(count)
        return run_start(org=org, automation_slug=slug, run_input={"order": f"o{n}"},
                         start_key=f"{slug}-{n}").run_id  # fmt: skip

    return start


@pytest.fixture
def no_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the notification can end a wait before its timeout (``told``)."""
    monkeypatch.setattr(run_waits, "RECHECK_SECONDS", SOON * 2)


def told(org: Organisation, run_id: int) -> run_waits.RunOutcome:
    """``run_wait`` with a timeout of SOON, which it must not run to (a wait that times out
    reads the run again, and would answer it ended all the same): with no_recheck, only the
    notification of the run's end brings it back sooner."""
    began = time.monotonic()
    outcome = run_wait(org=org, run_id=run_id, timeout=SOON)
    assert time.monotonic() - began < SOON, "the wait ran to its timeout: nothing told it"
    return outcome


def once_waited_for(run_id: int, then: Callable[[], Any]) -> threading.Thread:
    """A thread that calls ``then`` once a caller is listed as the run's waiter."""

    def act() -> None:
        try:
            deadline = time.monotonic() + SOON
            while not RunWaiter.objects.filter(run_id=run_id).exists():
                assert time.monotonic() < deadline, "no caller waited"
                time.sleep(0.005)
            then()
        finally:
            connection.close()

    thread = threading.Thread(target=act)
    thread.start()
    return thread


@pytest.fixture
def listening() -> Iterator[Any]:
    conn = own_connection()
    yield conn
    conn.close()


def test_a_worker_s_hop_that_ends_the_run_tells_its_waiter(
    org: Organisation, started: Callable[[str], int], no_recheck: None
) -> None:
    run_id = started("io")
    thread = once_waited_for(run_id, drive)
    outcome = told(org, run_id)
    thread.join()
    assert outcome.ended and outcome.status == "succeeded" and outcome.run_id == run_id
    assert not RunWaiter.objects.exists()
    with connection.cursor() as cursor:  # the connection listens to nothing after it
        cursor.execute("SELECT count(*) FROM pg_listening_channels()")
        assert cursor.fetchone()[0] == 0


def test_run_control_that_ends_the_run_tells_its_waiter(
    org: Organisation, started: Callable[[str], int], no_recheck: None
) -> None:
    run_id = started("waits")
    cancel = lambda: run_act(org=org, run_id=run_id, action="cancel", actor="test")  # noqa: E731
    thread = once_waited_for(run_id, cancel)
    outcome = told(org, run_id)
    thread.join()
    assert outcome.ended and outcome.status == "cancelled"
    assert not RunWaiter.objects.exists()


def test_an_ending_no_notification_reports_is_seen_all_the_same(
    org: Organisation, started: Callable[[str], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter's row gone before the run ends (as when the ending's trigger ran just
    before the waiter was listed): nothing notifies, and the wait's look at the run sees the
    end."""
    monkeypatch.setattr(run_waits, "RECHECK_SECONDS", 0.05)
    run_id = started("waits")

    def unlisted_then_cancelled() -> None:
        RunWaiter.objects.filter(run_id=run_id).delete()
        run_act(org=org, run_id=run_id, action="cancel", actor="test")

    thread = once_waited_for(run_id, unlisted_then_cancelled)
    outcome = told(org, run_id)  # by its look at the run: nothing notifies
    thread.join()
    assert outcome.ended and outcome.status == "cancelled"


def test_a_wait_that_times_out_answers_the_run_as_it_is_and_leaves_nothing(
    org: Organisation, started: Callable[[str], int]
) -> None:
    run_id = started("waits")
    outcome = run_wait(org=org, run_id=run_id, timeout=0.3)
    assert not outcome.ended and outcome.status == "running" and outcome.finished_at is None
    assert not RunWaiter.objects.exists()
    assert run_wait(org=org, run_id=run_id, timeout=0).status == "running"  # a look, no wait


def test_a_run_already_ended_is_answered_at_once(
    org: Organisation, started: Callable[[str], int]
) -> None:
    run_id = started("waits")
    run_act(org=org, run_id=run_id, action="cancel", actor="test")
    outcome = run_wait(org=org, run_id=run_id, timeout=SOON)
    assert outcome.ended and outcome.status == "cancelled"
    assert not RunWaiter.objects.exists()


def test_another_organisation_s_run_or_none_is_unknown(
    org: Organisation, other_org: Organisation, started: Callable[[str], int]
) -> None:
    run_id = started("waits")
    with pytest.raises(UnknownRun):
        run_wait(org=other_org, run_id=run_id, timeout=SOON)
    with pytest.raises(UnknownRun):
        run_wait(org=org, run_id=run_id + 1_000_000, timeout=SOON)
    assert not RunWaiter.objects.exists()


def test_waiting_inside_a_transaction_is_refused(
    org: Organisation, started: Callable[[str], int]
) -> None:
    run_id = started("waits")
    with transaction.atomic(), pytest.raises(WaitInTransaction):
        run_wait(org=org, run_id=run_id, timeout=SOON)


def test_only_a_run_someone_waits_for_notifies_and_its_waiters_rows_go(
    org: Organisation, started: Callable[[str], int], listening: Any
) -> None:
    """A run nobody waits for ends without a notification (no notification lock at its
    commit); one with a waiter listed (here a caller killed while it waited: its row stayed)
    notifies that waiter's row id, and the rows go with the run's end."""
    unwatched, watched = started("waits"), started("waits")
    listening.execute(f"LISTEN {run_waits.channel_of(unwatched)}")
    listening.execute(f"LISTEN {run_waits.channel_of(watched)}")
    run_act(org=org, run_id=unwatched, action="cancel", actor="test")
    assert list(listening.notifies(timeout=0.5)) == []
    left = RunWaiter.objects.create(run_id=watched, since="2026-01-01T00:00:00Z")
    run_act(org=org, run_id=watched, action="cancel", actor="test")
    heard = list(listening.notifies(timeout=SOON, stop_after=1))
    assert [(n.channel, n.payload) for n in heard] == [
        (run_waits.channel_of(watched), str(left.pk))
    ]
    assert not RunWaiter.objects.exists()
