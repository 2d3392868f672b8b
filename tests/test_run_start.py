"""A start as the automation's version the process last saw (services/runs.py::_LastSeen):
one round trip for the lookup and the insert, never a run of a version no longer current."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection
from psycopg.pq import TransactionStatus

from workflows.errors import StartKeyConflict
from workflows.models import Run, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import _LAST_SEEN, run_start

from .factories import IO_DEFINITION

pytestmark = pytest.mark.django_db


def ends_with(output: str) -> dict:
    return {"start": "done", "steps": [{"id": "done", "type": "end", "output": output}]}


def test_a_start_after_a_publish_runs_the_new_version(org) -> None:
    first = automation_publish_definition(org=org, slug="a", definition=ends_with("one"))
    one = run_start(org=org, automation_slug="a", run_input={}, start_key="k1")
    seen = _LAST_SEEN.get(org.pk, "a")
    assert seen is not None and seen.version_id == first.pk  # the next start tries it
    second = automation_publish_definition(org=org, slug="a", definition=ends_with("two"))
    two = run_start(org=org, automation_slug="a", run_input={}, start_key="k2")
    runs = {run.pk: run for run in Run.objects.filter(pk__in=[one.run_id, two.run_id])}
    assert (runs[one.run_id].version_id, runs[one.run_id].output) == (first.pk, "one")
    assert (runs[two.run_id].version_id, runs[two.run_id].output) == (second.pk, "two")
    seen = _LAST_SEEN.get(org.pk, "a")
    assert seen is not None and seen.version_id == second.pk
    three = run_start(org=org, automation_slug="a", run_input={}, start_key="k3")
    assert Run.objects.get(pk=three.run_id).version_id == second.pk


def test_start_keys_hold_on_the_last_seen_path(org) -> None:
    automation_publish_definition(org=org, slug="a", definition=ends_with("one"))
    run_start(org=org, automation_slug="a", run_input={}, start_key="warm")
    assert _LAST_SEEN.get(org.pk, "a") is not None
    first = run_start(org=org, automation_slug="a", run_input={"n": 1}, start_key="k")
    again = run_start(org=org, automation_slug="a", run_input={"n": 1}, start_key="k")
    assert (again.run_id, again.created, first.created) == (first.run_id, False, True)
    with pytest.raises(StartKeyConflict):
        run_start(org=org, automation_slug="a", run_input={"n": 2}, start_key="k")
    derived = run_start(org=org, automation_slug="a", run_input={"n": 3})
    assert run_start(org=org, automation_slug="a", run_input={"n": 3}).run_id == derived.run_id
    assert Run.objects.filter(org=org).count() == 3


def test_a_guess_for_another_automation_of_the_same_slug_is_not_used(org, other_org) -> None:
    """The guess is keyed by organisation: the same slug elsewhere is another automation."""
    automation_publish_definition(org=org, slug="a", definition=ends_with("mine"))
    automation_publish_definition(org=other_org, slug="a", definition=ends_with("theirs"))
    mine = run_start(org=org, automation_slug="a", run_input={}, start_key="k")
    theirs = run_start(org=other_org, automation_slug="a", run_input={}, start_key="k")
    assert Run.objects.get(pk=mine.run_id).output == "mine"
    assert Run.objects.get(pk=theirs.run_id).output == "theirs"


@pytest.mark.django_db(transaction=True)
def test_a_start_commits_with_its_last_writes_or_not_at_all(org) -> None:
    """Outside any other transaction a start's COMMIT is sent with its walk's writes (one
    round trip). A write of that batch that fails stops the batch before the COMMIT: the
    start raises and leaves nothing, not a run without its first step."""
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    kept = run_start(org=org, automation_slug="io", run_input={}, start_key="kept")
    assert not connection.in_atomic_block
    assert connection.connection.info.transaction_status == TransactionStatus.IDLE
    assert Step.objects.filter(run_id=kept.run_id).exists()
    with connection.cursor() as cursor:  # the wake-up is the batch's last write
        cursor.execute(REFUSE_WAKES)
    try:
        with pytest.raises(DatabaseError, match="no wake-ups"):
            run_start(org=org, automation_slug="io", run_input={}, start_key="refused")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_wakes ON workflows_outbox")
    assert not Run.objects.filter(start_key="refused").exists()
    assert not Step.objects.exclude(run_id=kept.run_id).exists()
    again = run_start(org=org, automation_slug="io", run_input={}, start_key="refused")
    assert again.created and Step.objects.filter(run_id=again.run_id).exists()


REFUSE_WAKES = """
CREATE OR REPLACE FUNCTION pg_temp.refuse_wakes() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'no wake-ups'; END $$;
CREATE TRIGGER refuse_wakes BEFORE INSERT ON workflows_outbox
   FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_wakes();
"""
