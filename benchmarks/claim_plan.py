"""The claim's plan and cost with and without a backlog it must not pay for.

    .venv/bin/python benchmarks/claim_plan.py [--finished 1000000] [--not-due 200000]

In its own database (waymark_claim_plan): one ready io step, then (1) the given number of
finished steps (history), (2) as many not-yet-due steps (retries waiting out a backoff) of
the same organisation. After each, it prints EXPLAIN (ANALYZE, BUFFERS) of the claim and of
the retry promotion: buffers touched, planning and execution time. Prints; asserts nothing
(tests/test_claim_plans.py asserts the buffers).
"""

from __future__ import annotations

import argparse
import json
import os

from common import claim_params, empty_run_tables, setup

setup("waymark_claim_plan")

from django.db import connection, transaction  # noqa: E402

from workflows.engine import sql  # noqa: E402
from workflows.models import Organisation, Run  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402
from workflows.services.runs import run_start  # noqa: E402

IO = {"start": "w", "steps": [{"id": "w", "type": "noop", "next": "e"}, {"id": "e", "type": "end"}]}
CLAIM = claim_params()
PROMOTE = {"lane": "io", "n": 500, "worker": "bench"}


def explain(statement: str, params: dict, *, text: bool = False) -> dict | str:
    fmt = "TEXT" if text else "JSON"
    result: dict | str = {}
    for _ in range(2):  # the second run, caches warm
        with transaction.atomic(), connection.cursor() as cursor:
            sid = transaction.savepoint()
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT {fmt}) {statement}", params)
            rows = cursor.fetchall()
            transaction.savepoint_rollback(sid)
        if text:
            result = "\n".join(row[0] for row in rows)
        else:
            plan = rows[0][0]
            result = (json.loads(plan) if isinstance(plan, str) else plan)[0]
    return result


def figures(label: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workflows_step")
    for name, statement, params in (("claim", sql.CLAIM, CLAIM),
                                     ("promotion", sql.PROMOTE_DUE_RETRIES, PROMOTE)):  # fmt: skip
        plan = explain(statement, params)
        assert isinstance(plan, dict)
        root = plan["Plan"]
        touched = root.get("Shared Hit Blocks", 0) + root.get("Shared Read Blocks", 0)
        print(
            f"{label:<34} {name:<10} buffers {touched:>4}   planning "
            f"{plan['Planning Time']:6.2f} ms   execution {plan['Execution Time']:6.2f} ms"
        )


def add_steps(run: Run, count: int, *, status: str, kind: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO workflows_step
                (org_id, run_id, step_id, iteration, type, lane, status, attempt, release_count,
                 series_offset, max_attempts, wait_kind, wake_at, error, created_at, finished_at)
            SELECT %(org)s, %(run)s, %(sid)s, g, 'noop', 'io', %(status)s, 1, 0, 0, 5, %(kind)s,
                   CASE WHEN %(kind)s = '' THEN NULL ELSE now() + interval '1 hour' END, '',
                   now(), CASE WHEN %(kind)s = '' THEN now() END
              FROM generate_series(1, %(n)s) g
            """,
            {"org": run.org_id, "run": run.pk, "n": count, "status": status, "kind": kind,
             "sid": f"{status}{kind}"},
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--not-due", type=int, default=200_000)
    parser.add_argument("--plan", action="store_true", help="print the claim's plan too")
    args = parser.parse_args()
    empty_run_tables()
    org, _ = Organisation.objects.get_or_create(slug="bench", defaults={"name": "bench"})
    automation_publish_definition(org=org, slug="io", definition=IO)
    run = Run.objects.get(pk=run_start(org=org, automation_slug="io", run_input={},
                                       start_key=f"k{os.getpid()}").run_id)  # fmt: skip
    figures("one ready step")
    add_steps(run, args.finished, status="done", kind="")
    figures(f"+ {args.finished:,} finished steps")
    add_steps(run, args.not_due, status="waiting", kind="retry")
    figures(f"+ {args.not_due:,} not-yet-due steps")
    if args.plan:
        print(explain(sql.CLAIM, CLAIM, text=True))


if __name__ == "__main__":
    main()
