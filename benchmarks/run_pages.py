"""The admin's runs list and run page, and the API's run list, at a million runs.

    .venv/bin/python benchmarks/run_pages.py [--runs 1000000] [--orgs 10] [--repeat 7]
                                             [--keep]

In its own database (waymark_bench_pages): ``--runs`` runs spread over ``--orgs``
organisations (written by generate_series, a batch a statement, the search index rebuilt
once after; ``--keep`` reuses a database already filled with as many), 90% succeeded, 8%
running, 2% failed, each with an input naming a customer (one of 500 numbers and one of 5
surnames, drawn independently of each other and of the organisation) and an order id.
Then it times, through Django's test client (the whole request: middleware, admin, ORM,
templates), the median of ``--repeat`` requests after one to warm up:

- the admin's runs list: the first page, a search for a name (1 run in 2,500), for an
  order id (one run), for a name that is nowhere, for a word in 1 run in 5, a status
  filter; as a superuser (every organisation) and as a member of one;
- the API's list with the same searches and filter (an organisation's key);
- the run page of a run parked mid-way, and of one with 10,000 steps and 20,000 events, and
  the live view's answer when nothing moved.

Prints each figure with its queries and the plan of the search; asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from typing import Any

from common import empty_run_tables, setup

setup("waymark_bench_pages")

from django.contrib.auth.models import Permission, User  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from workflows.models import Membership, Organisation, Run  # noqa: E402
from workflows.selectors import run_search  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402
from workflows.services.runs import run_start  # noqa: E402
from workflows.services.tenancy import api_key_create  # noqa: E402

BATCH = 100_000
NAMES = 500
HOST = "localhost"
FLOW: dict = {
    "start": "greet",
    "steps": [
        {"id": "greet", "type": "set", "values": {"greeting": "Hello {{ input.customer.name }}"},
         "next": "paid"},
        {"id": "paid", "type": "wait_signal", "signal": "order.paid",
         "correlation": "{{ input.order }}", "timeout": "1d",
         "next": {"received": "ship", "timed_out": "remind"}},
        {"id": "ship", "type": "noop", "next": "done"},
        {"id": "remind", "type": "set", "values": {"reminded": True}, "next": "done"},
        {"id": "done", "type": "end", "output": "{{ vars.greeting }}"},
    ],
}  # fmt: skip
SEARCH_INDEX = importlib.import_module("workflows.migrations.0025_run_search")


def fill(runs: int, orgs: int) -> list[Organisation]:
    """``runs`` runs over ``orgs`` organisations, each organisation's automation published
    through the service (its version is real); the rows themselves by generate_series."""
    empty_run_tables()
    organisations = []
    for n in range(orgs):
        org, _ = Organisation.objects.get_or_create(slug=f"bench-{n}", defaults={"name": f"B{n}"})
        automation_publish_definition(org=org, slug="orders", definition=FLOW)
        organisations.append(org)
    with connection.cursor() as cursor:
        cursor.execute(SEARCH_INDEX.DROP)  # built once after the rows: far faster than per row
        cursor.execute(
            """SELECT a.org_id, a.id AS automation_id, a.current_version_id
               FROM workflows_automation a WHERE a.slug = 'orders' ORDER BY a.org_id"""
        )
        owners = cursor.fetchall()
        started = time.perf_counter()
        for first in range(1, runs + 1, BATCH):
            last = min(first + BATCH - 1, runs)
            cursor.execute(
                """
                INSERT INTO workflows_run (org_id, automation_id, version_id, start_key,
                    start_key_derived, input, input_digest, status, vars, outputs, entered,
                    output, error, steps_executed, max_steps, deadline_at, created_at,
                    finished_at)
                SELECT o.org_id, o.automation_id, o.version_id, 'order-' || i, false,
                       jsonb_build_object(
                           'customer', jsonb_build_object(
                               'name', 'Customer' || (i / 10 %% %(names)s) || ' ' ||
                                       (ARRAY['Adams','Baker','Clark','Davis','Evans'])
                                       [i / 3 %% 5 + 1],
                               'email', 'c' || i || '@example.com'),
                           'order', 'A-' || i, 'total', (i %% 997) / 10.0),
                       md5(i::text) || md5(i::text),
                       s.status, '{}', '{}', '{}',
                       CASE WHEN s.status = 'succeeded' THEN to_jsonb('Hello Customer' || i) END,
                       CASE WHEN s.status = 'failed' THEN 'step ''ship'' failed: 502' ELSE '' END,
                       3, 1000, now() + interval '30 days',
                       now() - (%(last)s - i) * interval '1 second',
                       CASE WHEN s.status <> 'running'
                            THEN now() - (%(last)s - i) * interval '1 second' END
                FROM generate_series(%(first)s, %(last)s) AS i
                CROSS JOIN LATERAL (SELECT CASE WHEN i %% 50 = 0 THEN 'failed'
                                                WHEN i %% 100 < 8 THEN 'running'
                                                ELSE 'succeeded' END AS status) AS s
                JOIN (SELECT row_number() OVER () - 1 AS n, *
                      FROM unnest(%(orgs)s::bigint[], %(automations)s::bigint[],
                                  %(versions)s::bigint[])
                           AS t(org_id, automation_id, version_id)) AS o
                  ON o.n = i %% %(norgs)s
                """,
                {"first": first, "last": last, "names": NAMES, "norgs": len(owners),
                 "orgs": [o[0] for o in owners], "automations": [o[1] for o in owners],
                 "versions": [o[2] for o in owners]},
            )  # fmt: skip
            print(f"  {last:>9,} runs written ({time.perf_counter() - started:5.1f} s)", flush=True)
        cursor.execute("SET maintenance_work_mem = '512MB'")
        cursor.execute(SEARCH_INDEX.CREATE.replace("CONCURRENTLY ", ""))
        cursor.execute(SEARCH_INDEX.STATISTICS)
        print(f"  search index built ({time.perf_counter() - started:5.1f} s)", flush=True)
        cursor.execute("VACUUM ANALYZE workflows_run")
    return organisations


def parked_run(org: Organisation, key: str) -> Run:
    """A run through the engine: greeted, parked on its signal."""
    started = run_start(org=org, automation_slug="orders", start_key=key,
                        run_input={"customer": {"name": "Eve Adams"}, "order": "B-7"})  # fmt: skip
    return Run.objects.get(pk=started.run_id)


def add_history(run: Run, steps: int, events: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO workflows_step (org_id, run_id, step_id, iteration, type, lane,
                   status, attempt, release_count, series_offset, max_attempts, wait_kind,
                   output, error, finished_at)
               SELECT %(org)s, %(run)s, 'ship', i + 1, 'noop', 'io', 'done', 1, 0, 0, 5, '',
                   jsonb_build_object('n', i), '', now()
               FROM generate_series(1, %(steps)s) AS i""",
            {"org": run.org_id, "run": run.pk, "steps": steps},
        )
        cursor.execute(
            """INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration,
                   attempt, worker, detail)
               SELECT %(org)s, %(run)s, 'step.succeeded', 'ship', i %% %(steps)s + 2, 1,
                   'bench:1:io', jsonb_build_object('n', i)
               FROM generate_series(1, %(events)s) AS i""",
            {"org": run.org_id, "run": run.pk, "steps": steps, "events": events},
        )


def timed(client: Client, url: str, repeat: int, **headers: Any) -> tuple[float, int, int]:
    """Median milliseconds of ``repeat`` GETs after one to warm up, the queries of one, and
    its status."""
    response = client.get(url, HTTP_HOST=HOST, **headers)
    times = []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as queries:
            began = time.perf_counter()
            response = client.get(url, HTTP_HOST=HOST, **headers)
            times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times), len(queries.captured_queries), response.status_code


def show(label: str, figure: tuple[float, int, int]) -> None:
    ms, queries, status = figure
    print(f"  {label:<58} {ms:8.1f} ms  {queries:3d} queries  ({status})", flush=True)


def plan(org: Organisation | None, term: str) -> str:
    runs = Run.objects.all() if org is None else Run.objects.filter(org=org)
    sql, params = run_search(runs, term).order_by("-id")[:100].query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
        return "\n".join("      " + row[0] for row in cursor.fetchall())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--orgs", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="reuse a database already filled")
    args = parser.parse_args()

    if args.keep and Run.objects.filter(start_key__startswith="order-").count() >= args.runs:
        orgs = list(Organisation.objects.filter(slug__startswith="bench-").order_by("id"))
        print(f"reusing {args.runs:,} runs")
    else:
        print(f"filling {args.runs:,} runs over {args.orgs} organisations")
        began = time.perf_counter()
        orgs = fill(args.runs, args.orgs)
        print(f"  filled in {time.perf_counter() - began:.0f} s")
    org = orgs[0]
    suffix = str(time.time_ns())
    parked = parked_run(org, f"parked-{suffix}")
    big = parked_run(org, f"big-{suffix}")
    add_history(big, 10_000, 20_000)

    root, _ = User.objects.get_or_create(username="bench-root", defaults={
        "is_staff": True, "is_superuser": True})  # fmt: skip
    member, _ = User.objects.get_or_create(username="bench-member", defaults={"is_staff": True})
    member.user_permissions.set(Permission.objects.filter(codename="view_run"))
    Membership.objects.get_or_create(user=member, org=org)
    as_root, as_member = Client(), Client()
    as_root.force_login(root)
    as_member.force_login(member)
    _, raw_key = api_key_create(org=org, name=f"bench {suffix}")
    api = Client()
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {raw_key}", "HTTP_ACCEPT": "application/json"}

    # 1 run in 2,500, in every organisation (a run's organisation is i % 10, its name
    # i / 10 % 500 and its surname i / 3 % 5: independent of each other).
    name = "Customer123 Davis"
    order = f"A-{args.runs // 2}"
    runs_list = "/admin/workflows/run/"
    print(f"\nThe admin's runs list ({Run.objects.count():,} runs; median of {args.repeat})")
    for who, client in (("superuser", as_root), ("member of one organisation", as_member)):
        show(f"{who}: first page", timed(client, runs_list, args.repeat))
        show(f"{who}: search a name ({name})", timed(client, f"{runs_list}?q={name}", args.repeat))
        show(f"{who}: search an order id ({order})",
             timed(client, f"{runs_list}?q={order}", args.repeat))  # fmt: skip
        show(f"{who}: search a name nobody has",
             timed(client, f"{runs_list}?q=Zebedee", args.repeat))  # fmt: skip
        show(f"{who}: search a word in 1 run in 5 (Davis)",
             timed(client, f"{runs_list}?q=Davis", args.repeat))  # fmt: skip
        show(
            f"{who}: status failed", timed(client, f"{runs_list}?status__exact=failed", args.repeat)
        )
        show(f"{who}: status failed, page 5",
             timed(client, f"{runs_list}?status__exact=failed&p=5", args.repeat))  # fmt: skip

    mine = Run.objects.filter(org=org).count()
    print(f"\nThe API's run list (one organisation's key: {mine:,} runs)")
    searches = [("", ""), (f"search={name}", f"?search={name}"),
                (f"search={order}", f"?search={order}"), ("search=Zebedee", "?search=Zebedee"),
                ("status=failed", "?status=failed")]  # fmt: skip
    for label, query in searches:
        show(f"GET /api/v1/runs {label}", timed(api, f"/api/v1/runs{query}", args.repeat, **bearer))

    print("\nThe run page")
    show(
        "a run parked on its signal", timed(as_root, f"{runs_list}{parked.pk}/change/", args.repeat)
    )
    show("a run of 10,000 steps and 20,000 events",
         timed(as_root, f"{runs_list}{big.pk}/change/", args.repeat))  # fmt: skip
    live = f"{runs_list}{parked.pk}/live/"
    version = as_root.get(live, HTTP_HOST=HOST).json()["version"]
    show("its live view, nothing moved", timed(as_root, f"{live}?since={version}", args.repeat))
    show("its live view, moved (everything rendered)", timed(as_root, live, args.repeat))

    print(f"\nThe search's plan, a superuser's ({name}):\n{plan(None, name)}")
    print(f"\nThe search's plan, one organisation's ({order}):\n{plan(org, order)}")


if __name__ == "__main__":
    main()
