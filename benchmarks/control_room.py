"""What the admin's control room (its first screen) costs on a large installation.

    .venv/bin/python benchmarks/control_room.py [--runs 1000000] [--orgs 20] [--burst 20000]

In its own database (waymark_control_room): ``--runs`` runs over ``--orgs`` organisations,
created over the last 30 days (nine in ten succeeded, one in twenty failed, the rest
running), and a burst of ``--burst`` more in the last hour in the first organisation (past
the counts' cap). All written with SQL, then VACUUM ANALYZE. Then the page's statements
with EXPLAIN (ANALYZE, BUFFERS), for a superuser (every organisation) and for a member of
one; the runs' counts once more without the index run_org_status_created (dropped inside a
transaction that is rolled back), to show what it buys; and the whole panel set
(workflows.admin.control_room.control_room) timed. Prints; asserts nothing
(tests/test_admin_control_room.py checks the page's statements stay the same as runs grow).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

from common import empty_run_tables, setup

setup("waymark_control_room")

from django.contrib.auth.models import User  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import RequestFactory  # noqa: E402

from workflows.admin.control_room import COUNT_CAP, FAILED_SHOWN, control_room  # noqa: E402
from workflows.engine.sql import control_room as sql  # noqa: E402
from workflows.models import Organisation  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402
from workflows.states import RunStatus  # noqa: E402

DEFINITION = {"start": "done", "steps": [{"id": "done", "type": "end"}]}

RUNS = """
INSERT INTO workflows_run (org_id, automation_id, version_id, start_key, start_key_derived,
                           input, input_digest, status, vars, outputs, entered, error,
                           steps_executed, max_steps, deadline_at, created_at, finished_at)
SELECT o.id, %(automation)s, %(version)s, %(prefix)s || g, false, '{}', '',
       CASE WHEN %(burst)s THEN 'running'
            WHEN g %% 20 = 0 THEN 'failed' WHEN g %% 10 = 1 THEN 'running'
            ELSE 'succeeded' END,
       '{}', '{}', '{}', CASE WHEN g %% 20 = 0 THEN 'boom' ELSE '' END, 1, 1000,
       now() + interval '30 days',
       now() - make_interval(secs => g::float * %(spread)s / %(n)s), now()
  FROM generate_series(1, %(n)s) g
  JOIN LATERAL (SELECT id FROM workflows_organisation ORDER BY id
                OFFSET (CASE WHEN %(burst)s THEN 0 ELSE g %% %(orgs)s END) LIMIT 1) o ON true
"""


def fill(args: argparse.Namespace) -> list[int]:
    empty_run_tables()
    orgs = [Organisation.objects.get_or_create(slug=f"room-{n}", defaults={"name": f"Room {n}"})[0]
            for n in range(args.orgs)]  # fmt: skip
    version = automation_publish_definition(org=orgs[0], slug="room", definition=DEFINITION)
    common = {"automation": version.automation_id, "version": version.pk, "orgs": args.orgs}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(RUNS, {**common, "prefix": "r-", "n": args.runs, "burst": False,
                              "spread": 30 * 86_400})  # fmt: skip
        cursor.execute(RUNS, {**common, "prefix": "b-", "n": args.burst, "burst": True,
                              "spread": 3_000})  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE workflows_run")
    return [org.pk for org in orgs]


def explain(statement: str, params: dict[str, Any]) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params)
        raw = cursor.fetchone()[0]
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]
    root = plan["Plan"]
    touched = root.get("Shared Hit Blocks", 0) + root.get("Shared Read Blocks", 0)
    return f"{plan['Execution Time']:8.1f} ms, {touched:6} buffers"


def indexes(statement: str, params: dict[str, Any]) -> str:
    """How the plan reads the runs: its scans, by index (or Seq Scan)."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + statement, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    scans = re.findall(r"((?:Index Only |Bitmap Index |Index |Seq )Scan(?: Backward)?) "
                       r"(?:using|on) (\w+)", plan)  # fmt: skip
    return ", ".join(sorted({f"{kind} {name}" for kind, name in scans}))


def measure(orgs: list[int]) -> None:
    counts = {"statuses": list(RunStatus.values), "cap": COUNT_CAP + 1}
    for who, scope in (("every organisation", orgs), ("one organisation", orgs[:1])):
        by_status = {**counts, "orgs": scope}
        failed = {"orgs": scope, "limit": FAILED_SHOWN}
        print(f"{who}:")
        print(f"  RUNS_BY_STATUS      {explain(sql.RUNS_BY_STATUS, by_status)}"
              f"   ({indexes(sql.RUNS_BY_STATUS, by_status)})")  # fmt: skip
        print(f"  NEWEST_FAILED_RUNS  {explain(sql.NEWEST_FAILED_RUNS, failed)}"
              f"   ({indexes(sql.NEWEST_FAILED_RUNS, failed)})")  # fmt: skip
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("DROP INDEX run_org_status_created")
            print(f"  RUNS_BY_STATUS without run_org_status_created "
                  f"{explain(sql.RUNS_BY_STATUS, by_status)}"
                  f"   ({indexes(sql.RUNS_BY_STATUS, by_status)})")  # fmt: skip
            transaction.set_rollback(True)
    flags = {"is_superuser": True, "is_staff": True}
    root, _ = User.objects.get_or_create(username="room-bench", defaults=flags)
    request = RequestFactory().get("/admin/")
    request.user = root
    for _ in range(3):
        began = time.perf_counter()
        room = control_room(request)
        took = (time.perf_counter() - began) * 1000
    print(f"control_room() for a superuser: {took:.1f} ms, {len(room.panels)} panels")
    print("  " + "; ".join(f"{line.text} {'/'.join(line.values)}" for line in room.panels[0].lines))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--orgs", type=int, default=20)
    parser.add_argument("--burst", type=int, default=20_000)
    args = parser.parse_args()
    began = time.perf_counter()
    orgs = fill(args)
    print(f"{args.runs:,} runs over {args.orgs} organisations, {args.burst:,} in the last hour "
          f"(filled in {time.perf_counter() - began:.0f} s)", flush=True)  # fmt: skip
    measure(orgs)


if __name__ == "__main__":
    main()
