"""Is a drain's cost flat in backlog? The drained rate and the claim's plan, without and with a
backlog that no claim should pay for.

    .venv/bin/python benchmarks/backlog.py [--runs 1000] [--backlog 200000] [--orgs 1000]

In its own database (waymark_backlog), twice: start ``--runs`` runs of the side-by-side shape
(three no-op io steps) with no engine, print EXPLAIN (ANALYZE, BUFFERS) figures of one claim of
16, then start the relay and the io workers (as runengine would) and measure the drained rate:
io steps/s from the first claim to the last finish (database clock), as
../shared/bench/waymark_bench.py does. Between the two passes it adds the backlog: half of it
not-yet-due retries of the same organisation (waiting out a backoff a day long), half steps of
``--orgs`` other organisations parked on outside events (waiting, deadline a day away).

Prints figures and the ratios; asserts nothing, but exits non-zero when a run did not succeed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from common import ROOT, THREE_IO, claim_params, empty_run_tables, setup, start_runs

setup("waymark_backlog")

from django.db import connection, transaction  # noqa: E402

from workflows.engine import sql  # noqa: E402
from workflows.engine.lanes import lane_policy  # noqa: E402
from workflows.models import Organisation  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402

CLAIM = claim_params()

# One run per organisation, then `per_run` waiting steps in each: retries for the bench
# organisation, outside-event waits for the others.
BACKLOG_SQL = """
WITH runs AS (
    INSERT INTO workflows_run (org_id, automation_id, version_id, start_key, start_key_derived,
        input, input_digest, status, vars, outputs, entered, error, steps_executed, max_steps,
        deadline_at, created_at)
    SELECT o.id, %(automation)s, %(version)s, 'backlog-' || o.id, false, '{}', '', 'running',
           '{}', '{}', '{}', '', 0, 1000000, now() + interval '2 days', now()
      FROM workflows_organisation o WHERE o.id = ANY(%(orgs)s)
    RETURNING id, org_id
)
INSERT INTO workflows_step (org_id, run_id, step_id, iteration, type, lane, status, attempt,
    release_count, series_offset, max_attempts, wait_kind, wake_at, error, created_at)
SELECT r.org_id, r.id, 'waiting', g, 'noop', 'io', 'waiting', 1, 0, 0, 5, %(kind)s,
       now() + interval '1 day', '', now()
  FROM runs r, generate_series(1, %(per_run)s) g
"""


def reset() -> None:
    empty_run_tables()


def claim_figures() -> tuple[int, float]:
    """Buffers touched and execution time of one claim of 16 (rolled back), caches warm."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workflows_step")
    plan: dict = {}
    for _ in range(2):
        with transaction.atomic(), connection.cursor() as cursor:
            savepoint = transaction.savepoint()
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql.CLAIM}", CLAIM)
            raw = cursor.fetchone()[0]
            transaction.savepoint_rollback(savepoint)
        plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]
    root = plan["Plan"]
    buffers = root.get("Shared Hit Blocks", 0) + root.get("Shared Read Blocks", 0)
    return int(buffers), float(plan["Execution Time"])


def drain(org: Organisation, runs: int, tag: str) -> dict[str, float]:
    start_runs(org, "three", runs, tag, threads=8)
    buffers, claim_ms = claim_figures()
    roles = [["relay"]] + [["worker", "--lane", "io"]] * lane_policy("io").processes
    processes = [
        subprocess.Popen([sys.executable, "manage.py", *role], cwd=ROOT)  # noqa: S603
        for role in roles
    ]
    try:
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM workflows_run WHERE start_key LIKE %s"
                    " AND status = 'running'",
                    [f"{tag}-%"],
                )
                if cursor.fetchone()[0] == 0:
                    break
            time.sleep(0.05)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FILTER (WHERE r.status <> 'succeeded') AS failed,
                   extract(epoch FROM max(r.finished_at) - min(e.at)) AS span
              FROM workflows_run r
              JOIN workflows_runevent e ON e.run_id = r.id AND e.kind = 'step.claimed'
             WHERE r.start_key LIKE %s
            """,
            [f"{tag}-%"],
        )
        failed, span = cursor.fetchone()
    if failed:
        raise SystemExit(f"{failed} run(s) did not succeed")
    return {"io_steps_per_s": 3 * runs / float(span), "claim_buffers": buffers,
            "claim_ms": claim_ms}  # fmt: skip


def add_backlog(org: Organisation, automation_id: int, version_id: int, args) -> None:
    others = Organisation.objects.bulk_create(
        Organisation(slug=f"backlog-{i}", name=f"Backlog {i}") for i in range(args.orgs)
    )
    half = args.backlog // 2
    with connection.cursor() as cursor:
        for orgs, kind, per_run in (
            ([org.pk], "retry", half),
            ([o.pk for o in others], "external", half // args.orgs),
        ):
            params = {"automation": automation_id, "version": version_id, "orgs": orgs,
                      "kind": kind, "per_run": per_run}  # fmt: skip
            cursor.execute(BACKLOG_SQL, params)
        cursor.execute("SELECT count(*) FROM workflows_step WHERE status = 'waiting'")
        waiting = cursor.fetchone()[0]
    print(f"backlog: {waiting:,} waiting steps ({half:,} not-yet-due retries, "
          f"the rest parked in {args.orgs} organisations)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--backlog", type=int, default=200_000)
    parser.add_argument("--orgs", type=int, default=1000)
    args = parser.parse_args()
    reset()
    Organisation.objects.filter(slug__startswith="backlog-").delete()
    org, _ = Organisation.objects.get_or_create(slug="bench", defaults={"name": "bench"})
    version = automation_publish_definition(org=org, slug="three", definition=THREE_IO)
    tag = f"b{int(time.time())}"
    empty = drain(org, args.runs, f"{tag}-empty")
    add_backlog(org, version.automation_id, version.pk, args)
    full = drain(org, args.runs, f"{tag}-full")
    for label, figures in (("empty", empty), ("with backlog", full)):
        print(f"{label:<13} drained {figures['io_steps_per_s']:7.1f} io steps/s   claim of 16: "
              f"{figures['claim_buffers']:>4} buffers, {figures['claim_ms']:.2f} ms")  # fmt: skip
    rate = full["io_steps_per_s"] / empty["io_steps_per_s"]
    buffers = full["claim_buffers"] / max(1, empty["claim_buffers"])
    print(f"ratio (backlog / empty): rate {rate:.2f}, claim buffers {buffers:.2f}")


if __name__ == "__main__":
    main()
