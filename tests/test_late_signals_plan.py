"""The sweep's late matching (sql.SIGNALS_MATCHED_LATE) reads the signals the waiting steps
match, not every pending signal: rows visited, not milliseconds, so a loaded machine cannot
make it pass or fail (benchmarks/late_signals.py prints the times)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now

from workflows.engine import sql
from workflows.engine.signals import match_late
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
