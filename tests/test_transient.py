"""Which database errors are transient (retried, never recorded as anything's result): real
errors from the real PostgreSQL, raised by the server with their SQLSTATE."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest
from django.db import DatabaseError, OperationalError, connection, transaction

from workflows.engine.transient import is_transient, log_failure, lost_connection

pytestmark = pytest.mark.django_db(transaction=True)


def raised_by_server(sqlstate: str) -> DatabaseError:
    """The error Django raises for a server error with this SQLSTATE."""
    statement = (
        f"DO $$ BEGIN RAISE EXCEPTION 'as the server would' USING ERRCODE = '{sqlstate}'; END $$"
    )
    with (
        pytest.raises(DatabaseError) as caught,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)
    return caught.value


@pytest.mark.parametrize(
    "sqlstate",
    ["40001", "40P01", "55P03", "57014"],
    ids=["serialization", "deadlock", "lock-timeout", "statement-timeout"],
)
def test_retry_and_lock_errors_are_transient(sqlstate: str) -> None:
    error = raised_by_server(sqlstate)
    assert is_transient(error) and not lost_connection(error)


@pytest.mark.parametrize("sqlstate", ["08006", "57P01"], ids=["connection", "admin-shutdown"])
def test_a_lost_connection_is_transient_and_says_so(sqlstate: str) -> None:
    error = raised_by_server(sqlstate)
    assert is_transient(error) and lost_connection(error)


@pytest.mark.parametrize(
    "sqlstate", ["22012", "23505", "P0001", "42P01"], ids=["zero", "unique", "raise", "table"]
)
def test_an_error_of_the_work_itself_is_not(sqlstate: str) -> None:
    assert not is_transient(raised_by_server(sqlstate))


def test_a_wrapper_raised_from_a_transient_error_is_transient_too() -> None:
    class Wrapped(Exception):
        pass

    deadlock = raised_by_server("40P01")
    try:
        raise Wrapped("a walk that met it") from deadlock
    except Wrapped as exc:
        assert is_transient(exc)
    try:
        try:
            raise deadlock
        except DatabaseError:
            raise Wrapped("its own error, raised while handling it")  # noqa: B904
    except Wrapped as exc:
        assert exc.__context__ is deadlock and not is_transient(exc)


def test_an_item_failing_on_a_transient_error_is_one_warning_line_and_a_bug_is_traced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A terminated backend or a restart under a loop's item (a deadline, a late signal) is a
    warning without a traceback (it is tried again); anything else keeps its traceback."""
    log = logging.getLogger("tests.items")
    caplog.set_level(logging.WARNING, logger="tests.items")
    try:
        raise OperationalError("terminated") from psycopg.errors.AdminShutdown("terminating")
    except OperationalError as exc:
        log_failure(log, exc, "firing the deadline of step %s failed", 7)
    try:
        raise KeyError("a bug")
    except KeyError as exc:
        log_failure(log, exc, "firing the deadline of step %s failed", 8)
    transient, bug = caplog.records
    assert transient.levelno == logging.WARNING and transient.exc_info is None
    assert transient.getMessage() == (
        "firing the deadline of step 7 failed (AdminShutdown: terminating); tried again later"
    )
    assert bug.levelno == logging.ERROR and bug.exc_info is not None
    assert bug.getMessage() == "firing the deadline of step 8 failed"


def test_a_slot_that_lost_its_connection_renews_every_other_slots_before_its_next_attempt() -> None:
    """A restart ends every connection of a worker's slots at once. The slot that finds its
    own lost says so (one outage), and each other slot opens a new connection before its
    next attempt instead of meeting the dead one in it (a deferral, and the outage said
    again, once per slot); a slot that saw no loss keeps its connection."""
    from workflows.engine.lanes import lane_policy
    from workflows.engine.worker import Worker

    worker = Worker(lane_policy("io"), concurrency=2, name="slots")
    pids: dict[str, int] = {}
    answers: dict[str, object] = {}
    lost, go = threading.Event(), threading.Event()

    def backend() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return int(cursor.fetchone()[0])

    def other_slot() -> None:
        pids["other"] = backend()
        worker._renew_a_lost_connection()  # nothing lost yet: the same connection
        answers["kept"] = backend() == pids["other"]
        lost.set()
        go.wait(30)
        try:
            worker._renew_a_lost_connection()
            answers["after"] = backend()
        except Exception as exc:  # the dead connection met in the attempt
            answers["after"] = exc
        finally:
            connection.close()

    slot = threading.Thread(target=other_slot)
    slot.start()
    assert lost.wait(30)
    own = backend()
    with connection.cursor() as cursor:  # as a restart would: every slot's backend ends
        cursor.execute("SELECT pg_terminate_backend(p) FROM unnest(%s::int[]) p",
                       [[pids["other"]]])  # fmt: skip
    # This slot's own ends too, and it finds out.
    with pytest.raises(OperationalError), connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    connection.close()  # as the slot that finds its connection lost does
    worker._count_a_lost_connection()
    assert backend() != own  # this slot goes on with a new connection
    go.set()
    slot.join(30)
    assert answers["kept"] is True
    assert isinstance(answers["after"], int) and answers["after"] != pids["other"], answers


def test_a_settle_on_a_connection_a_restart_ended_says_no_outage_when_a_new_one_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A restart ends every slot's connection; a slot that settles after the database is
    back finds its own dead only then. It settles on a new connection, and says nothing of
    an outage: saying it (and then that it is over) was a second pair of warnings for one
    outage, once per slot (tests/test_database_faults.py's idle-engine test saw "settles"
    answer again twice)."""
    from types import SimpleNamespace
    from typing import Any, cast

    from workflows.engine.lanes import lane_policy
    from workflows.engine.worker import Worker

    worker = Worker(lane_policy("io"), concurrency=1, name="stale")

    def backend() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return int(cursor.fetchone()[0])

    own = backend()
    other = connection.get_new_connection(connection.get_connection_params())
    try:  # as a restart does, from outside the slot
        other.execute("SELECT pg_terminate_backend(%s)", [own])
    finally:
        other.close()
    with caplog.at_level(logging.INFO, logger="workflows.engine.worker"):
        answered = worker._settle(cast(Any, SimpleNamespace(id=1, attempt=1)), backend)
    assert isinstance(answered, int) and answered != own  # settled, on a new connection
    assert worker.connections_lost == 1  # the other slots renew theirs
    assert "unavailable" not in caplog.text and "answers again" not in caplog.text, caplog.text
    connection.close()
