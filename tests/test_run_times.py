"""A run's times come from one clock, the database's, and a run never finishes before it was
created: ``finished_at >= created_at`` whichever transaction ends it.

A run's ``created_at`` is its creating transaction's ``now()`` (its start). A transaction
that ends the run reads ``now()`` too, its own start: one that began before the run was
created (a person's erasure that finds the run after it began, a caller's transaction that
cancels it with ``run_cancel_locked``) would otherwise stamp it finished earlier than it
was created."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction

from workflows.engine.walk import lock_run
from workflows.models import Organisation, Run
from workflows.services.automations import automation_publish_definition
from workflows.services.control import run_act, run_cancel_locked
from workflows.services.runs import run_start

pytestmark = pytest.mark.django_db(transaction=True)

HOLD = {"start": "hold", "steps": [{"id": "hold", "type": "wait", "duration": "1h"}]}


def started_elsewhere(org: Organisation, key: str) -> int:
    """A run started and committed by another connection, as another process would."""
    started: dict[str, Any] = {}

    def start() -> None:
        try:
            started["id"] = run_start(org=org, automation_slug="hold", run_input={},
                                      start_key=key).run_id  # fmt: skip
        finally:
            connections.close_all()

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    return int(started["id"])


def transaction_start() -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_a_run_ended_by_a_transaction_older_than_it_never_finishes_before_it_was_created(
    org: Organisation,
) -> None:
    automation_publish_definition(org=org, slug="hold", definition=HOLD)
    with transaction.atomic(), connection.cursor() as cursor:
        began = transaction_start()  # this transaction's now(), fixed from here on
        run_id = started_elsewhere(org, "late")
        created = Run.objects.get(pk=run_id).created_at
        assert created > began, "the run must be created after this transaction began"
        run_cancel_locked(cursor, lock_run(cursor, run_id), "test")

    run = Run.objects.get(pk=run_id)
    assert run.status == "cancelled"
    assert run.finished_at is not None and run.finished_at >= run.created_at, (
        run.created_at, run.finished_at,
    )  # fmt: skip


def test_a_run_ended_in_its_own_time_finishes_at_its_transactions_now(
    org: Organisation,
) -> None:
    automation_publish_definition(org=org, slug="hold", definition=HOLD)
    run_id = run_start(org=org, automation_slug="hold", run_input={}, start_key="k").run_id
    run_act(org=org, run_id=run_id, action="cancel", actor="test")
    run = Run.objects.get(pk=run_id)
    assert run.finished_at is not None and run.finished_at > run.created_at
