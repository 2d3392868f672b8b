"""A start as the automation's version the process last saw (services/runs.py::_LastSeen):
one round trip for the lookup and the insert, never a run of a version no longer current."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection
from psycopg.pq import TransactionStatus

from workflows.engine.starts import start_in_one_trip
from workflows.errors import StartKeyConflict
from workflows.models import Outbox, Run, RunEvent, Step
from workflows.services import runs
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import _LAST_SEEN, run_start

from .factories import IO_DEFINITION, linear_definition

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


# An inline step first: its walk cannot be computed before the run exists (engine/starts.py).
SET_THEN_IO: dict = {
    "start": "first",
    "steps": [
        {"id": "first", "type": "set", "values": {"x": 1}, "next": "work"},
        {"id": "work", "type": "noop", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("definition", [IO_DEFINITION, SET_THEN_IO], ids=["one_trip", "ordinary"])
def test_a_start_commits_with_its_last_writes_or_not_at_all(org, definition) -> None:
    """Outside any other transaction a start's COMMIT is sent with its walk's writes (one
    round trip; or the start is one statement). A write that fails stops the batch before
    the COMMIT: the start raises and leaves nothing, not a run without its first step."""
    automation_publish_definition(org=org, slug="io", definition=definition)
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


def one_trip_answers(monkeypatch) -> list:
    """What each start's one-statement attempt answered (None: it was not one)."""
    answers: list = []

    def spy(*args, **kwargs):
        answers.append(start_in_one_trip(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(runs, "start_in_one_trip", spy)
    return answers


def written(run_id: int) -> dict:
    """Everything a start wrote for a run, without ids and times."""
    run = Run.objects.filter(pk=run_id).values(
        "status", "input", "vars", "outputs", "entered", "steps_executed", "max_steps",
        "output", "error", "start_key_derived", "input_digest", "version_id",
    ).get()  # fmt: skip
    steps = list(Step.objects.filter(run_id=run_id).order_by("id").values(
        "org_id", "step_id", "iteration", "type", "lane", "status", "owner", "attempt",
        "release_count", "series_offset", "max_attempts", "lease_until", "wait_kind",
        "wake_at", "wait_detail", "output", "error", "finished_at", "fork_join_id", "branch",
    ))  # fmt: skip
    events = list(RunEvent.objects.filter(run_id=run_id).order_by("id").values_list(
        "org_id", "kind", "step_id", "iteration", "attempt", "worker", "detail"
    ))  # fmt: skip
    wakes = list(
        Outbox.objects.filter(payload__run=run_id).values_list("org_id", "topic", "payload")
    )
    created = Run.objects.values_list("created_at", "deadline_at").get(pk=run_id)
    assert created[1] is not None and created[1] > created[0]  # the max age, from now()
    return {
        "run": run,
        "steps": steps,
        "events": events,
        "wakes": [(org, topic, {**payload, "run": "the run"}) for org, topic, payload in wakes],
    }


@pytest.mark.parametrize(
    "definition, one_trip",
    [(IO_DEFINITION, True), (SET_THEN_IO, False), (linear_definition("a", "b"), False)],
    ids=["io_first", "inline_first", "all_inline"],
)
def test_a_start_in_one_statement_writes_what_the_ordinary_start_writes(
    org, monkeypatch, definition, one_trip
) -> None:
    """The same start, as the ordinary start (no version seen yet) and then as one
    statement where its walk allows: the same run row, steps, events and wake-ups."""
    automation_publish_definition(org=org, slug="a", definition=definition)
    answers = one_trip_answers(monkeypatch)
    ordinary = run_start(org=org, automation_slug="a", run_input={"n": 1}, start_key="first")
    assert answers == []  # no version seen yet: the ordinary start
    second = run_start(org=org, automation_slug="a", run_input={"n": 1}, start_key="second")
    assert (answers[-1] is not None) == one_trip
    assert second.created and second.status == ordinary.status
    assert written(second.run_id) == written(ordinary.run_id)
    # The same key again: the run it started, from either path.
    again = run_start(org=org, automation_slug="a", run_input={"n": 1}, start_key="second")
    assert (again.run_id, again.created) == (second.run_id, False)
    with pytest.raises(StartKeyConflict):
        run_start(org=org, automation_slug="a", run_input={"n": 2}, start_key="second")
    assert Run.objects.filter(org=org).count() == 2


def test_a_start_in_one_statement_after_a_publish_runs_the_new_version(org, monkeypatch) -> None:
    first = automation_publish_definition(org=org, slug="a", definition=IO_DEFINITION)
    run_start(org=org, automation_slug="a", run_input={}, start_key="warm")
    answers = one_trip_answers(monkeypatch)
    other_io = {"start": "w", "steps": [{"id": "w", "type": "noop"}]}
    second = automation_publish_definition(org=org, slug="a", definition=other_io)
    assert second.pk != first.pk
    started = run_start(org=org, automation_slug="a", run_input={}, start_key="after")
    assert answers[0] is not None  # tried as the version seen, which is no longer current
    assert Run.objects.get(pk=started.run_id).version_id == second.pk
    assert (
        Run.objects.filter(org=org).count() == 2
        and Step.objects.filter(run_id=started.run_id).count() == 1
    )
