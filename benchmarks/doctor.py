"""What the absence monitors (``manage.py doctor``, ``/readyz``) cost on a large installation.

    .venv/bin/python benchmarks/doctor.py [--live 100000] [--finished 300000] [--orgs 50]

In its own database (waymark_doctor): ``--finished`` finished runs of five done steps each
(the history retention keeps), ``--live`` live runs spread over ``--orgs`` organisations, each
with two done steps and one waiting step: nine in ten on a timer (pending), the rest on a
signal (a deadline); 5,000 ready io steps, 20,000 pending signals nobody waits for, and
100,000 sent outbox rows. All written with SQL in a few statements, then VACUUM ANALYZE (as
autovacuum would have). Then each registered check, three times (the last is shown: caches
warm), with its time and what it found; and EXPLAIN (ANALYZE, BUFFERS) of the one check
whose cost follows the live runs (workflows.stranded_runs). Prints; asserts nothing
(tests/test_doctor.py checks what the bounded checks read).
"""

from __future__ import annotations

import argparse
import json
import time

from common import empty_run_tables, setup

setup("waymark_doctor")

from django.db import connection, transaction  # noqa: E402

from workflows.engine.health import HEALTH_CHECKS, WAIT_ANSWERS, Limits, run_check  # noqa: E402
from workflows.engine.sql import health as health_sql  # noqa: E402
from workflows.models import Organisation  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402

TIMER_WAIT = {
    "start": "a",
    "steps": [
        {"id": "a", "type": "set", "values": {"x": 1}, "next": "b"},
        {"id": "b", "type": "noop", "next": "pause"},
        {"id": "pause", "type": "wait", "duration": "30d", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}

# Runs of one version, then their steps, from generate_series: %(first)s.. ids of this batch.
RUNS = """
INSERT INTO workflows_run (org_id, automation_id, version_id, start_key, start_key_derived,
                           input, input_digest, status, vars, outputs, entered, error,
                           steps_executed, max_steps, deadline_at, created_at, finished_at)
SELECT o.id, %(automation)s, %(version)s, %(prefix)s || g, false, '{}', '', %(status)s,
       '{"x": 1}', '{}', '{}', '', 3, 1000, now() + interval '30 days', now(),
       CASE WHEN %(status)s = 'succeeded' THEN now() END
  FROM generate_series(1, %(n)s) g
  JOIN LATERAL (SELECT id FROM workflows_organisation ORDER BY id
                OFFSET (g %% %(orgs)s) LIMIT 1) o ON true
"""

DONE_STEPS = """
INSERT INTO workflows_step (org_id, run_id, step_id, iteration, type, lane, status, attempt,
                            release_count, series_offset, max_attempts, wait_kind, error,
                            created_at, finished_at)
SELECT r.org_id, r.id, 's' || k, 1, 'noop', 'io', 'done', 1, 0, 0, 5, '', '', now(), now()
  FROM workflows_run r CROSS JOIN generate_series(1, %(steps)s) k
 WHERE r.start_key LIKE %(prefix)s || '%%'
"""

WAITING_STEPS = """
INSERT INTO workflows_step (org_id, run_id, step_id, iteration, type, lane, status, attempt,
                            release_count, series_offset, max_attempts, wait_kind, wake_at,
                            wait_detail, error, created_at)
SELECT r.org_id, r.id, 'pause', 1, CASE WHEN r.id %% 10 = 0 THEN 'wait_signal' ELSE 'wait' END,
       'inline', 'waiting', 1, 0, 0, 1, 'external',
       CASE WHEN r.id %% 10 = 0 THEN now() + interval '1 day' END,
       CASE WHEN r.id %% 10 = 0
            THEN jsonb_build_object('signal', 'go', 'correlation', r.id::text)
            ELSE jsonb_build_object('parked_on', 'timer:' || r.id) END,
       '', now()
  FROM workflows_run r WHERE r.start_key LIKE 'live-%%'
"""

TIMERS = """
INSERT INTO timers_timer (org_id, run_id, step_id, iteration, kind, intent, zone,
                          spread_seconds, offset_seconds, due_at, error, created_at)
SELECT s.org_id, s.run_id, 'pause', 1, 'wait', '{"duration": 2592000}', '', 0, 0,
       now() + interval '30 days', '', now()
  FROM workflows_step s WHERE s.step_id = 'pause' AND s.type = 'wait'
"""

READY = """
INSERT INTO workflows_step (org_id, run_id, step_id, iteration, type, lane, status, attempt,
                            release_count, series_offset, max_attempts, lease_until,
                            wait_kind, error, created_at)
SELECT r.org_id, r.id, 'more', 1, 'noop', 'io', 'ready', 0, 0, 0, 5, now(), '', '', now()
  FROM workflows_run r WHERE r.start_key LIKE 'live-%%' AND r.id %% 20 = 1
"""

SIGNALS = """
INSERT INTO workflows_signal (org_id, name, correlation, correlations, identity, source,
                              received_at, consumed_by)
SELECT %(org)s, 'go', 'nobody-' || g, ARRAY['nobody-' || g], 'nobody-' || g, 'api', now(), ''
  FROM generate_series(1, 20000) g
"""

OUTBOX = """
INSERT INTO workflows_outbox (org_id, topic, payload, created_at, sent_at)
SELECT %(org)s, 'lane.wake', '{"lane": "io"}', now(), now() FROM generate_series(1, 100000)
"""


def fill(args: argparse.Namespace) -> None:
    empty_run_tables()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workflows_signal, timers_timer")
    orgs = [Organisation.objects.get_or_create(slug=f"doc-{n}", defaults={"name": f"Doc {n}"})[0]
            for n in range(args.orgs)]  # fmt: skip
    version = automation_publish_definition(org=orgs[0], slug="waits", definition=TIMER_WAIT)
    common = {"automation": version.automation_id, "version": version.pk, "orgs": args.orgs}
    with transaction.atomic(), connection.cursor() as cursor:
        for prefix, status, n, steps in (("done-", "succeeded", args.finished, 5),
                                         ("live-", "running", args.live, 2)):  # fmt: skip
            cursor.execute(RUNS, {**common, "prefix": prefix, "status": status, "n": n})
            cursor.execute(DONE_STEPS, {"prefix": prefix, "steps": steps})
        cursor.execute(WAITING_STEPS, {})
        cursor.execute(TIMERS, {})
        cursor.execute(READY, {})
        cursor.execute(SIGNALS, {"org": orgs[0].pk})
        cursor.execute(OUTBOX, {"org": orgs[0].pk})
    with connection.cursor() as cursor:
        for table in ("workflows_run", "workflows_step", "timers_timer", "workflows_signal",
                      "workflows_outbox"):  # fmt: skip
            cursor.execute(f"VACUUM ANALYZE {table}")


def measure() -> None:
    limits = Limits(late_seconds=300, examples=10)
    for name, check in sorted(HEALTH_CHECKS.items()):
        for _ in range(3):
            began = time.perf_counter()
            findings = run_check(name, check, limits, timeout_seconds=60)
            took = (time.perf_counter() - began) * 1000
        said = "; ".join(f"{f.severity} {f.count}" for f in findings)
        print(f"{name:<36} {took:9.1f} ms   {said}", flush=True)
    answers = [(prefix, answer.holds) for prefix, answer in sorted(WAIT_ANSWERS.items())]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                       + health_sql.stranded_runs(answers), limits.params())  # fmt: skip
        raw = cursor.fetchone()[0]
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]
    root = plan["Plan"]
    touched = root.get("Shared Hit Blocks", 0) + root.get("Shared Read Blocks", 0)
    print(f"stranded_runs EXPLAIN: {plan['Execution Time']:.1f} ms, buffers {touched}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--live", type=int, default=100_000)
    parser.add_argument("--finished", type=int, default=300_000)
    parser.add_argument("--orgs", type=int, default=50)
    args = parser.parse_args()
    began = time.perf_counter()
    fill(args)
    print(f"{args.live:,} live runs, {args.finished:,} finished, {args.orgs} organisations "
          f"(filled in {time.perf_counter() - began:.0f} s)", flush=True)  # fmt: skip
    measure()


if __name__ == "__main__":
    main()
