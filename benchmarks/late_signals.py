"""The sweep's late signal matching against signals nobody waits for.

    .venv/bin/python benchmarks/late_signals.py [--signals 300000] [--waits 5] [--more-waits 1000]

In its own database (waymark_late_signals): one organisation with ``--waits`` runs waiting
for a signal, then ``--signals`` pending signals of that organisation that no step waits for
(as a flood of them leaves: same name, other correlations), then ``--more-waits`` more waiting
runs. After each, EXPLAIN (ANALYZE, BUFFERS) of the late-matching statement as it was (every
pending signal, oldest first, each probed against the waits) and as it is
(sql.SIGNALS_MATCHED_LATE: from the waits, one index probe each): execution time, buffers
touched and rows read from workflows_signal; a statement still running after a minute is
cancelled and says so. Prints; asserts nothing
(tests/test_late_signals_plan.py asserts the rows read).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from common import empty_run_tables, setup

setup("waymark_late_signals", WAYMARK_QUOTA_PENDING_SIGNALS="0", WAYMARK_QUOTA_RUNNING_RUNS="0",
      WAYMARK_QUOTA_STARTS_PER_MINUTE="0")  # fmt: skip

from django.db import OperationalError, connection, transaction  # noqa: E402

from tests.factories import SIGNAL_WAIT_DEFINITION  # noqa: E402
from workflows.engine import sql  # noqa: E402
from workflows.models import Organisation  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402
from workflows.services.runs import run_start  # noqa: E402

# The statement before issue 27 (item 7): from the pending signals, each probed against the
# waiting steps. Its cost grew with every pending signal of every organisation.
BEFORE = """
SELECT g.id, g.org_id, g.name, g.correlation, g.correlations, g.run_id, g.identity,
       g.payload::json AS payload
  FROM workflows_signal g
 WHERE g.consumed_at IS NULL AND g.dropped_at IS NULL
   AND EXISTS (
       SELECT 1 FROM workflows_step s
        WHERE s.status = 'waiting' AND s.wait_kind = 'external' AND s.org_id = g.org_id
          AND s.wait_detail->>'signal' = g.name
          AND ((g.run_id IS NULL
                AND (s.wait_detail->>'correlation' = g.correlation
                     OR s.wait_detail->>'correlation' = ANY(g.correlations)))
               OR s.run_id = g.run_id))
 ORDER BY g.id
 LIMIT %(n)s
"""

TIMEOUT_S = 60  # one measured statement at most


def explain(statement: str) -> dict[str, Any] | None:
    """The plan of the last of three runs (caches warm); None past TIMEOUT_S."""
    plan: dict[str, Any] | None = None
    for _ in range(3):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL statement_timeout = '{TIMEOUT_S}s'")
                cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", {"n": 200})
                raw = cursor.fetchone()[0]
        except OperationalError:  # the timeout
            return None
        plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]
    return plan


def signal_rows(node: dict[str, Any]) -> int:
    own = 0
    if node.get("Relation Name") == "workflows_signal":
        own = int((node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0))
                  * node.get("Actual Loops", 1))  # fmt: skip
    return own + sum(signal_rows(child) for child in node.get("Plans", []))


def figures(label: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE workflows_signal")  # as autovacuum would have
        cursor.execute("VACUUM ANALYZE workflows_step")
    for name, statement in (("before", BEFORE), ("now", sql.SIGNALS_MATCHED_LATE)):
        plan = explain(statement)
        if plan is None:
            print(f"{label:<44} {name:<6} more than {TIMEOUT_S} s (cancelled)")
            continue
        root = plan["Plan"]
        touched = root.get("Shared Hit Blocks", 0) + root.get("Shared Read Blocks", 0)
        print(
            f"{label:<44} {name:<6} {plan['Execution Time']:9.2f} ms   buffers {touched:>6}   "
            f"signal rows read {signal_rows(root):>7}",
            flush=True,
        )


def wait(org: Organisation, first: int, count: int) -> None:
    for n in range(first, first + count):
        run_start(org=org, automation_slug="waits", run_input={"order": f"o-{n}"},
                  start_key=f"w-{n}")  # fmt: skip


def flood(org: Organisation, count: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO workflows_signal (org_id, name, correlation, correlations, identity,
                                          source, received_at, consumed_by)
            SELECT %(org)s, 'order.paid', 'nobody-' || g, ARRAY['nobody-' || g],
                   'nobody-' || g, 'api', now(), ''
              FROM generate_series(1, %(n)s) g
            """,
            {"org": org.pk, "n": count},
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--signals", type=int, default=300_000)
    parser.add_argument("--waits", type=int, default=5)
    parser.add_argument("--more-waits", type=int, default=1_000)
    args = parser.parse_args()
    empty_run_tables()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workflows_signal")
    org, _ = Organisation.objects.get_or_create(slug="late", defaults={"name": "Late"})
    automation_publish_definition(org=org, slug="waits", definition=SIGNAL_WAIT_DEFINITION)
    wait(org, 0, args.waits)
    figures(f"{args.waits} waits, no pending signals")
    flood(org, args.signals)
    figures(f"{args.waits} waits, {args.signals:,} pending signals")
    wait(org, args.waits, args.more_waits)
    figures(f"{args.waits + args.more_waits:,} waits, {args.signals:,} pending signals")


if __name__ == "__main__":
    main()
