"""The sweep's late matching (sql.SIGNALS_MATCHED_LATE) reads the signals the waiting steps
match, not every pending signal: rows visited, not milliseconds, so a loaded machine cannot
make it pass or fail (benchmarks/late_signals.py prints the times)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now

from workflows.engine import sql
from workflows.engine.signals import LateMatching, match_late
from workflows.engine.transport import own_connection
from workflows.models import Run, Signal
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .factories import SIGNAL_WAIT_DEFINITION, OrganisationFactory

pytestmark = pytest.mark.django_db(transaction=True)

NOBODY_WAITS = 20_000
WAITS = 30


def pending_signals(org_id: int, count: int, prefix: str) -> None:
    """``count`` pending signals of the waits' name that no step waits for (as a flood of
    them would leave), stored as deliver stores them."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO workflows_signal (org_id, name, correlation, correlations, identity,
                                          source, received_at, consumed_by)
            SELECT %(org)s, 'order.paid', %(prefix)s || g, ARRAY[%(prefix)s || g],
                   %(prefix)s || g, 'api', now(), ''
              FROM generate_series(1, %(n)s) g
            """,
            {"org": org_id, "n": count, "prefix": prefix},
        )


def signal_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    own = [node] if node.get("Relation Name") == "workflows_signal" else []
    return own + [n for child in node.get("Plans", []) for n in signal_nodes(child)]


def visited(node: dict[str, Any]) -> int:
    """Rows a scan produced or read and threw away, over all its loops."""
    per_loop = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
    per_loop += node.get("Rows Removed by Index Recheck", 0)
    return int(per_loop * node.get("Actual Loops", 1))


def test_signals_nobody_waits_for_are_not_read_by_the_late_matching(org) -> None:
    automation_publish_definition(org=org, slug="waits", definition=SIGNAL_WAIT_DEFINITION)
    runs = [run_start(org=org, automation_slug="waits", run_input={"order": f"o-{n}"}).run_id
            for n in range(3)]  # fmt: skip
    pending_signals(org.pk, NOBODY_WAITS, "nobody-")
    pending_signals(OrganisationFactory.create().pk, 1_000, "o-")  # another's, same keys
    # A signal and the wait of runs[0] that committed together and missed each other.
    pending_signals(org.pk, 1, "o-")
    Signal.objects.filter(org=org, correlation="o-1").update(correlation="o-0",
                                                             correlations=["o-0"])  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workflows_signal")
        cursor.execute("ANALYZE workflows_step")
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql.SIGNALS_MATCHED_LATE}", {"n": 200})
        plan = cursor.fetchone()[0]
    root = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    nodes = signal_nodes(root)
    assert nodes and all(n["Node Type"] != "Seq Scan" for n in nodes), nodes
    # Three waits, each one probe; the late pair's signal read back: a handful of rows,
    # however many signals nobody waits for.
    assert sum(visited(n) for n in nodes) <= 10, [(n["Node Type"], visited(n)) for n in nodes]
    assert match_late() == 1
    assert Run.objects.get(pk=runs[0]).status == "succeeded"
    assert Run.objects.filter(pk__in=runs[1:], status="running").count() == 2


def test_with_no_signal_pending_the_late_matching_reads_no_wait(org) -> None:
    """The usual case: runs waiting for signals, none pending. The waits are not read (one
    probe each, every sweep tick: 100,000 waits cost a tick 2.9 s in benchmarks/scale.py)."""
    automation_publish_definition(org=org, slug="waits", definition=SIGNAL_WAIT_DEFINITION)
    for n in range(WAITS):
        run_start(org=org, automation_slug="waits", run_input={"order": f"o-{n}"})
    pending_signals(org.pk, 1, "consumed-")
    Signal.objects.filter(org=org).update(consumed_at=Now())  # a signal that was, is not
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workflows_step")
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql.SIGNALS_MATCHED_LATE}", {"n": 200})
        plan = cursor.fetchone()[0]
    root = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    steps = step_nodes(root)
    assert steps, root
    assert sum(visited(n) for n in steps) == 0, [(n["Node Type"], visited(n)) for n in steps]
    assert match_late() == 0
    pending_signals(org.pk, 1, "o-")  # one pending again: the waits are read, o-1 matched
    assert match_late() == 1
    assert Run.objects.filter(org=org, status="running").count() == WAITS - 1


def step_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    own = [node] if node.get("Relation Name") == "workflows_step" else []
    return own + [n for child in node.get("Plans", []) for n in step_nodes(child)]


def test_a_signal_sent_to_a_run_is_matched_late_by_its_run(org) -> None:
    """Signal-with-start's signals carry the run, not a correlation: the other probe."""
    automation_publish_definition(org=org, slug="waits", definition=SIGNAL_WAIT_DEFINITION)
    run_id = run_start(org=org, automation_slug="waits", run_input={"order": "o-0"}).run_id
    pending_signals(org.pk, 1, "unrelated-")
    Signal.objects.filter(org=org).update(run_id=run_id)
    assert match_late() == 1
    assert Run.objects.get(pk=run_id).status == "succeeded"


def test_a_wait_looks_up_only_the_signals_of_its_own_key() -> None:
    """A step entering a wait takes a signal that came first (sql.PENDING_SIGNAL_FOR): with
    20,000 pending signals of the same name nobody waits for, it reads its own few rows."""
    org = OrganisationFactory.create()
    pending_signals(org.pk, NOBODY_WAITS, "nobody-")
    pending_signals(org.pk, 1, "o-")  # the one this wait is for: correlation "o-1"
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workflows_signal")
        params: dict[str, Any] = {
            "org_id": org.pk,
            "name": "order.paid",
            "correlation": "o-1",
            "run_id": -1,
        }
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.PENDING_SIGNAL_FOR, params)
        (plan,) = cursor.fetchone()
        cursor.execute(sql.PENDING_SIGNAL_FOR, params)
        (found,) = cursor.fetchall()
    tree = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    scans = signal_nodes(tree)
    assert all(node["Node Type"] != "Seq Scan" for node in scans), scans
    assert sum(visited(node) for node in scans) <= 10, scans
    assert Signal.objects.get(pk=found[0]).correlation == "o-1"

    automation_publish_definition(org=org, slug="waits", definition=SIGNAL_WAIT_DEFINITION)
    run_id = run_start(org=org, automation_slug="waits", run_input={"order": "o-1"},
                       start_key="late").run_id  # fmt: skip
    assert Run.objects.get(pk=run_id).status == "succeeded"  # it took the one sent first


def test_a_wait_locks_only_the_signal_it_takes(org) -> None:
    """A wait with a signal sent to its run and one for its key both pending takes the older
    and leaves the other unlocked: another wait for that key, entering while the first's
    transaction is open, takes it. (Both locked, the second wait skipped it and parked, and
    only the sweep's full pass, up to ten minutes on, matched the two.)"""
    automation_publish_definition(org=org, slug="waits", definition=SIGNAL_WAIT_DEFINITION)
    run_id = run_start(org=org, automation_slug="waits", run_input={"order": "o-9"}).run_id
    pending_signals(org.pk, 1, "o-")  # for the key "o-1"; the older of the two below
    Signal.objects.filter(org=org, correlation="o-1").update(
        run_id=run_id, correlation="r", correlations=["r"], identity="to-the-run"
    )
    pending_signals(org.pk, 1, "o-")  # for the key "o-1", sent after
    sent_to_run = Signal.objects.get(org=org, run_id=run_id).pk
    for_key = Signal.objects.get(org=org, run__isnull=True, correlation="o-1").pk
    entering = {"org_id": org.pk, "name": "order.paid", "correlation": "o-1"}
    with own_connection() as first:
        first.execute("BEGIN")
        taken = first.execute(sql.PENDING_SIGNAL_FOR, {**entering, "run_id": run_id}).fetchone()
        assert taken is not None and taken[0] == sent_to_run  # the older
        with connection.cursor() as cursor:  # another run's wait for the key, meanwhile
            cursor.execute(sql.PENDING_SIGNAL_FOR, {**entering, "run_id": -1})
            assert [row[0] for row in cursor.fetchall()] == [for_key]
        first.execute("ROLLBACK")


def explain_since(since: Any) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workflows_step")
        cursor.execute("ANALYZE workflows_signal")
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql.SIGNALS_MATCHED_SINCE}",
                       {"n": 200, "since": since})  # fmt: skip
        plan = cursor.fetchone()[0]
    root: dict[str, Any] = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return root


def test_between_full_passes_a_tick_reads_the_recent_signals_not_every_wait(org) -> None:
    """Runs waiting for signals while old signals nobody waits for stay pending (the usual
    state of a deployment that keeps unmatched signals for days): after the sweeper's first,
    full pass, a tick reads the signals received since, not the waits (one probe per wait
    each tick: 100,000 waits cost a tick 2.9 s in benchmarks/scale.py)."""
    automation_publish_definition(org=org, slug="waits", definition=SIGNAL_WAIT_DEFINITION)
    runs = [run_start(org=org, automation_slug="waits", run_input={"order": f"o-{n}"}).run_id
            for n in range(WAITS)]  # fmt: skip
    pending_signals(org.pk, NOBODY_WAITS // 4, "nobody-")
    Signal.objects.filter(org=org).update(received_at=Now() - timedelta(hours=6))

    late = LateMatching()
    assert late.run() == 0  # the first pass is full: it reads every wait, matches none
    assert late.since is not None

    root = explain_since(late.since)
    steps, signals = step_nodes(root), signal_nodes(root)
    assert signals and all(n["Node Type"] != "Seq Scan" for n in signals), signals
    assert sum(visited(n) for n in steps) == 0, [(n["Node Type"], visited(n)) for n in steps]
    assert sum(visited(n) for n in signals) <= 2, [(n["Node Type"], visited(n)) for n in signals]

    # A signal and the wait of runs[3] that committed together and missed each other.
    pending_signals(org.pk, 1, "o-")
    Signal.objects.filter(org=org, correlation="o-1").update(correlation="o-3",
                                                             correlations=["o-3"])  # fmt: skip
    assert late.run() == 1
    assert Run.objects.get(pk=runs[3]).status == "succeeded"
    assert Run.objects.filter(pk__in=runs, status="running").count() == WAITS - 1


def test_a_pair_older_than_the_window_is_matched_by_the_next_full_pass(org) -> None:
    """A pair that missed each other while no sweeper ran for longer than the margin: the
    ticks' window does not reach its signal; a sweeper's first pass, and the full pass every
    FULL_PASS_SECONDS, do."""
    automation_publish_definition(org=org, slug="waits", definition=SIGNAL_WAIT_DEFINITION)
    run_id = run_start(org=org, automation_slug="waits", run_input={"order": "o-1"}).run_id
    late = LateMatching()
    assert late.run() == 0  # full pass, nothing pending
    pending_signals(org.pk, 1, "o-")  # o-1: the run's
    Signal.objects.filter(org=org).update(received_at=Now() - timedelta(hours=1))

    assert late.run() == 0  # a tick: the signal is older than the window
    assert Run.objects.get(pk=run_id).status == "running"
    late.next_full = 0.0  # FULL_PASS_SECONDS later
    assert late.run() == 1
    assert Run.objects.get(pk=run_id).status == "succeeded"
    assert LateMatching().run() == 0  # and a new sweeper's first pass finds nothing more


def test_a_tick_matches_a_recent_signal_sent_to_a_run(org) -> None:
    automation_publish_definition(org=org, slug="waits", definition=SIGNAL_WAIT_DEFINITION)
    run_id = run_start(org=org, automation_slug="waits", run_input={"order": "o-0"}).run_id
    late = LateMatching()
    assert late.run() == 0
    pending_signals(org.pk, 1, "unrelated-")
    Signal.objects.filter(org=org).update(run_id=run_id)
    assert late.run() == 1
    assert Run.objects.get(pk=run_id).status == "succeeded"


def test_a_full_batch_leaves_the_mark_where_it_was(org) -> None:
    """More late pairs than one batch: the mark stays, so the next tick reads them again."""
    automation_publish_definition(org=org, slug="waits", definition=SIGNAL_WAIT_DEFINITION)
    for n in range(1, 4):
        run_start(org=org, automation_slug="waits", run_input={"order": f"o-{n}"})
    late = LateMatching()
    assert late.run() == 0
    mark = late.since
    pending_signals(org.pk, 3, "o-")
    assert late.run(limit=2) == 2
    assert late.since == mark
    assert late.run(limit=2) == 1
    assert late.since != mark
    assert Run.objects.filter(org=org, status="running").count() == 0
