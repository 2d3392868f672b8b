"""A million runs: do the hot paths stay flat, how big do the tables grow, do workers leak?

    .venv/bin/python benchmarks/scale.py [--runs 1000000] [--timers 200000] [--signals 100000]
                                         [--keep] [--soak-minutes 5] [--soak-rate 50]

In its own database (waymark_bench_scale), in four parts:

1. **Empty**: with the run tables empty (ten organisations, their automations, nothing
   else), it measures the hot paths: ``--fresh`` runs of three no-op io steps started through
   the service (starts/s), one claim of 16 of their steps (EXPLAIN (ANALYZE, BUFFERS) of the
   engine's own ``sql.CLAIM``), a relay and the io workers draining them (io steps/s, first
   claim to last finish), ``--due`` timers of real waiting runs brought due and fired by the
   timers' sweep (``fire_due_timers`` batch by batch, and the due query's generic plan),
   one pass of the engine's sweep (``sweep_once``: deadlines, retries, late signals) and of
   each registered sweep task, a signal delivered to one of ``--due`` waiting runs, and the
   admin's runs list (first page, status running, a search for one order id), a finished
   run's page and the API's run list (Django's test client, as run_pages.py: median of
   ``--repeat`` after one to warm up).
2. **Fill**: ``--runs`` finished runs, ``--timers`` runs waiting on a timer due 1 to 30 days
   ahead and ``--signals`` runs waiting for a signal (a one-day deadline), over the ten
   organisations. Each is a copy of a run the engine itself wrote in part 1 (its run, steps,
   history and timer rows, by ``INSERT ... SELECT generate_series``, 100,000 runs a
   statement; the finished ones spread over the last 58 days, inside the 90-day retention;
   a waiting step's ``wait_detail`` names its own timer or correlation), so the engine's
   own statements meet the rows they meet in production. Then VACUUM ANALYZE (as autovacuum
   would have by then), and part 1 again: the side-by-side table (figure, empty, full,
   ratio) and the plans of the claim, the due query and the late signal matching.
   ``--keep``: reuse a database filled by an earlier call, against the empty figures the
   last call that measured them saved in the temporary directory (a call on another,
   empty database with ``--runs 0 --timers 0 --signals 0 --soak-minutes 0`` just before
   takes them at the same load).
3. **Sizes**: each table's and index's size, whole and per 100,000 runs, the hot tables'
   live and dead tuples and last (auto)vacuum, and the autovacuum settings (the server's
   and each hot table's own).
4. **Soak**: ``manage.py runengine --no-web`` beside a thread starting ``--soak-rate`` runs a
   second (noop, a wait of 2 s, noop) for ``--soak-minutes``; every engine process's resident
   memory sampled every ``--sample-seconds`` (by its WAYMARK_PROCESS_ROLE), printed as first,
   at two minutes, last, max and slope (MB per hour, least squares), over the whole soak and
   from two minutes on (after its warm-up: the slope a leak shows in), per process; then the
   hot tables' dead tuples and autovacuum counts again (what the churn left).

Prints; asserts nothing, but exits non-zero when a run started in a measurement or in the
soak does not finish or does not succeed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import ROOT, THREE_IO, claim_params, empty_run_tables, setup, start_runs

setup("waymark_bench_scale")

import psutil  # noqa: E402
from backlog import claim_figures  # noqa: E402
from django.contrib.auth.models import Permission, User  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from run_pages import SEARCH_INDEX, timed  # noqa: E402
from throughput import drained_seconds, engine, io_workers, stop, wait_finished  # noqa: E402
from timer_sweep import explain as due_plan  # noqa: E402
from timer_sweep import plan_figures  # noqa: E402

from tests.factories import SIGNAL_WAIT_DEFINITION  # noqa: E402
from timers.sweep import fire_due_timers  # noqa: E402
from workflows.engine import sql  # noqa: E402
from workflows.engine.sweep import sweep_once  # noqa: E402
from workflows.engine.sweeper import SWEEP_TASKS  # noqa: E402
from workflows.models import Membership, Organisation, Run  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402
from workflows.services.runs import run_start  # noqa: E402
from workflows.services.signals import signal_send  # noqa: E402
from workflows.services.tenancy import api_key_create  # noqa: E402

ORGS = 10
BATCH = 100_000
HOT = ("workflows_run", "workflows_step", "workflows_runevent", "workflows_outbox",
       "timers_timer", "workflows_signal")  # fmt: skip
EMPTY_FIGURES = Path(tempfile.gettempdir()) / "waymark_bench_scale_empty.json"
WAIT_30D = {"start": "pause", "steps": [
    {"id": "pause", "type": "wait", "duration": "30d", "next": "done"},
    {"id": "done", "type": "end"}]}  # fmt: skip
SOAK = {"start": "a", "steps": [
    {"id": "a", "type": "noop", "next": "pause"},
    {"id": "pause", "type": "wait", "duration": "2s", "next": "b"},
    {"id": "b", "type": "noop", "next": "done"},
    {"id": "done", "type": "end"}]}  # fmt: skip
DEFINITIONS = {"three": THREE_IO, "timer": WAIT_30D, "signal": SIGNAL_WAIT_DEFINITION,
               "soak": SOAK}  # fmt: skip
PROBLEMS: list[str] = []
WARM_UP_SECONDS = 120


def execute(statement: str, params: dict[str, Any] | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def load() -> str:
    return "load " + " / ".join(f"{x:.1f}" for x in os.getloadavg())


def heading(title: str) -> None:
    print(f"\n== {title} ==  [{os.cpu_count()} CPUs, {load()}]", flush=True)


def reset() -> list[Organisation]:
    """Empty run tables (and timers, signals) and the ten organisations' automations."""
    name = connection.settings_dict["NAME"]
    if "bench" not in name:
        raise SystemExit(f"refusing to empty database {name!r}: not a benchmark database")
    empty_run_tables()
    execute("TRUNCATE timers_timer, timers_orgsweep, workflows_signal, workflows_sweeplease,"
            " workflows_quotausage CASCADE")  # fmt: skip
    orgs = []
    for n in range(ORGS):
        org, _ = Organisation.objects.get_or_create(slug=f"scale-{n}", defaults={"name": f"S{n}"})
        for slug, definition in DEFINITIONS.items():
            automation_publish_definition(org=org, slug=slug, definition=definition)
        orgs.append(org)
    return orgs


def orgs_of() -> list[Organisation]:
    return list(Organisation.objects.filter(slug__startswith="scale-").order_by("id"))


# ---------------------------------------------------------------------------------------
# Part 1: the hot paths' figures, the same on the empty and on the full database.


class Figures:
    """name -> (value, unit, lower_is_better); plans by name."""

    def __init__(self) -> None:
        self.values: dict[str, list[Any]] = {}
        self.plans: dict[str, str] = {}

    def put(self, name: str, value: float, unit: str, *, lower: bool = True) -> None:
        self.values[name] = [value, unit, lower]
        print(f"  {name:<56} {value:10.2f} {unit}", flush=True)


def median_ms(action: Callable[[], Any], repeat: int) -> float:
    action()  # warm
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        action()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def measure(org: Organisation, args: argparse.Namespace, phase: str) -> Figures:
    heading(f"{phase}: the hot paths ({Run.objects.count():,} runs in the table)")
    out = Figures()
    tag = f"{phase}-{time.time_ns()}"
    began = time.perf_counter()
    ids = start_runs(org, "three", args.fresh, f"{tag}-io", threads=4)
    out.put(f"starts through the service, {args.fresh} runs, 4 threads",
            len(ids) / (time.perf_counter() - began), "runs/s", lower=False)  # fmt: skip
    buffers, claim_ms = claim_figures()
    out.put("claim of 16: buffers touched", buffers, "buffers")
    out.put("claim of 16: execution", claim_ms, "ms")
    out.plans["claim"] = claim_plan()
    processes = engine(["relay"], *io_workers())
    try:
        wait_finished(ids, timeout=900)
    finally:
        stop(processes)
    check(ids, "the drain")
    out.put(f"drained by relay + io workers, {3 * len(ids):,} io steps",
            3 * len(ids) / drained_seconds(ids), "io steps/s", lower=False)  # fmt: skip
    timer_figures(org, args, tag, out)
    sweep_figures(out, args.repeat)
    signal_figures(org, args, tag, out)
    page_figures(org, ids[len(ids) // 2], args.repeat, out)
    return out


def claim_plan() -> str:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql.CLAIM}", claim_params())
        lines = [row[0] for row in cursor.fetchall()]
        transaction.set_rollback(True)
    return "\n".join(lines)


def timer_figures(org: Organisation, args: argparse.Namespace, tag: str, out: Figures) -> None:
    """``--due`` real waiting runs whose timers are brought due (as tests/test_timers.py
    does), then fired by the timers' sweep batch by batch."""
    ids = start_runs(org, "timer", args.due, f"{tag}-due", threads=4)
    execute("UPDATE timers_timer SET due_at = now() WHERE run_id = ANY(%(ids)s)", {"ids": ids})
    execute("ANALYZE timers_timer")
    plan = due_plan()
    out.plans["due timers (generic plan)"] = "\n".join(plan)
    print(f"  due query: {plan_figures(plan)}")
    times, fired = [], 0
    while fired < len(ids):
        began = time.perf_counter()
        batch = fire_due_timers(by="scale")
        times.append((time.perf_counter() - began) * 1000)
        fired += batch.fired
        if not batch.fired:
            PROBLEMS.append(f"timers: a batch fired nothing with {len(ids) - fired} due")
            break
    out.put(f"timers' sweep: first batch ({args.due} due)", times[0], "ms")
    out.put(f"timers' sweep: {args.due} due timers fired", fired / (sum(times) / 1000),
            "timers/s", lower=False)  # fmt: skip
    check(ids, "the due timers")


def sweep_figures(out: Figures, repeat: int) -> None:
    out.put("engine sweep pass (deadlines, retries, late signals)",
            median_ms(lambda: sweep_once(name="scale"), repeat), "ms")  # fmt: skip
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql.SIGNALS_MATCHED_LATE}", {"n": 500})
        out.plans["late signal matching"] = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    for name, task in sorted(SWEEP_TASKS.items()):
        out.put(f"sweep task {name}", median_ms(lambda task=task: task.run("scale"), 3), "ms")


def signal_figures(org: Organisation, args: argparse.Namespace, tag: str, out: Figures) -> None:
    """A signal to each of ``--due`` runs waiting for one: the service call, median."""
    ids = start_runs(org, "signal", args.due, f"{tag}-sig", threads=4,
                     inputs=lambda n: {"order": f"{tag}-{n}"})  # fmt: skip
    times = []
    for n in range(args.due):
        began = time.perf_counter()
        signal_send(org=org, name="order.paid", correlation=f"{tag}-{n}")
        times.append((time.perf_counter() - began) * 1000)
    out.put("a signal delivered to its waiting run (service), median", statistics.median(times),
            "ms")  # fmt: skip
    check(ids, "the signalled runs")


def page_figures(org: Organisation, finished: int, repeat: int, out: Figures) -> None:
    root, _ = User.objects.get_or_create(username="scale-root", defaults={
        "is_staff": True, "is_superuser": True})  # fmt: skip
    member, _ = User.objects.get_or_create(username="scale-member", defaults={"is_staff": True})
    member.user_permissions.set(Permission.objects.filter(codename="view_run"))
    Membership.objects.get_or_create(user=member, org=org)
    as_root, as_member = Client(), Client()
    as_root.force_login(root)
    as_member.force_login(member)
    _, raw_key = api_key_create(org=org, name=f"scale {time.time_ns()}")
    api = Client()
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {raw_key}", "HTTP_ACCEPT": "application/json"}
    order = execute("SELECT input->>'order' FROM workflows_run WHERE org_id = %(o)s AND"
                    " start_key LIKE 'fin-%%' ORDER BY id DESC LIMIT 1", {"o": org.pk})  # fmt: skip
    listing = "/admin/workflows/run/"
    pages = [
        ("admin runs list, superuser, first page", as_root, listing, {}),
        ("admin runs list, member of one organisation", as_member, listing, {}),
        ("admin runs list, status running", as_root, f"{listing}?status__exact=running", {}),
        ("admin run page, a finished run", as_root, f"{listing}{finished}/change/", {}),
        ("API GET /api/v1/runs", api, "/api/v1/runs", bearer),
        ("API GET /api/v1/runs?status=running", api, "/api/v1/runs?status=running", bearer),
    ]
    if order:  # only once filled: the copies' inputs name an order
        pages.append((f"admin runs list, search an order id ({order[0][0]})", as_root,
                      f"{listing}?q={order[0][0]}", {}))  # fmt: skip
    for label, client, url, headers in pages:
        ms, queries, status = timed(client, url, repeat, **headers)
        if status != 200:
            PROBLEMS.append(f"{label}: status {status}")
        out.put(label, ms, f"ms, {queries} queries")


def check(ids: list[int], what: str) -> None:
    bad = Run.objects.filter(pk__in=ids).exclude(status="succeeded").count()
    if bad:
        PROBLEMS.append(f"{what}: {bad} of {len(ids)} runs did not succeed")


def side_by_side(empty: Figures, full: Figures, runs: int) -> None:
    heading(f"side by side: empty against {runs:,} finished runs and the waits")
    print(f"  {'figure':<60} {'empty':>10} {'full':>10} {'ratio':>7}  unit")
    for name, (value, unit, lower) in full.values.items():
        before = empty.values.get(name)
        if before is None:
            print(f"  {name:<60} {'':>10} {value:10.2f} {'':>7}  {unit}")
            continue
        ratio = value / before[0] if before[0] else float("nan")
        worse = ratio > 1.5 if lower else ratio < 1 / 1.5
        flag = "  <- not flat" if worse else ""
        print(f"  {name:<60} {before[0]:10.2f} {value:10.2f} {ratio:7.2f}  {unit}{flag}")
    for name, plan in full.plans.items():
        print(f"\n-- {name}, full: --\n{plan}")


def save(figures: Figures) -> None:
    EMPTY_FIGURES.write_text(json.dumps({"values": figures.values, "plans": figures.plans}))


def saved() -> Figures | None:
    if not EMPTY_FIGURES.exists():
        return None
    data = json.loads(EMPTY_FIGURES.read_text())
    figures = Figures()
    figures.values, figures.plans = data["values"], data["plans"]
    return figures


# ---------------------------------------------------------------------------------------
# Part 2: the fill, copies of runs the engine wrote.


def columns(table: str) -> list[str]:
    rows = execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %(t)s"
        " AND column_name <> 'id' ORDER BY ordinal_position",
        {"t": table},
    )
    return [row[0] for row in rows]


def cols(table: str, alias: str, overrides: dict[str, str]) -> tuple[str, str]:
    """The column list of ``table`` and a select list copying from ``alias``, but for
    ``overrides``."""
    names = columns(table)
    return ", ".join(names), ", ".join(overrides.get(c, f"{alias}.{c}") for c in names)


# The owners of copy g: organisation g % 10, its automation of the template's slug.
OWNERS = """
owners AS (
    SELECT row_number() OVER (ORDER BY a.org_id) - 1 AS n, a.org_id, a.id AS automation_id,
           a.current_version_id AS version_id
      FROM workflows_automation a
     WHERE a.slug = %(slug)s AND a.org_id = ANY(%(orgs)s)
)"""


def clone_sql(kind: str) -> str:
    """One statement writing copies first..last of template run %(template)s: its run, steps,
    history and (for a timer wait) timer. Finished copies are shifted into the past (copy g
    (total - g) * spacing seconds earlier); waiting ones wait from now, each its own timer
    (due 1 day + g * spacing from now) or correlation."""
    shift = "make_interval(secs => (%(total)s - {g}) * %(spacing)s + 60)"
    run_over = {"org_id": "o.org_id", "automation_id": "o.automation_id",
                "version_id": "o.version_id", "start_key": "%(tag)s || g"}  # fmt: skip
    step_over = {"org_id": "r.org_id", "run_id": "r.id"}
    event_over = {"org_id": "r.org_id", "run_id": "r.id"}
    if kind == "finished":
        past = shift.format(g="g")
        run_over |= {"input": "jsonb_build_object('n', g, 'order', 'A-' || g)",
                     "created_at": f"t.created_at - {past}",
                     "finished_at": f"t.finished_at - {past}",
                     "deadline_at": f"t.deadline_at - {past}"}  # fmt: skip
        past = shift.format(g="r.g")
        step_over |= {"created_at": f"s.created_at - {past}",
                      "finished_at": f"s.finished_at - {past}"}  # fmt: skip
        event_over |= {"at": f"e.at - {past}"}
    elif kind == "timer":
        run_over |= {"input": "jsonb_build_object('n', g)", "created_at": "now()"}
        timer = ("jsonb_build_object('timer', tm.id, 'parked_on', 'timer:' || tm.id,"
                 " 'due_at', tm.due_at)")  # fmt: skip
        step_over |= {"created_at": "now()",
                      "wait_detail": f"CASE WHEN s.wait_detail ? 'timer' THEN s.wait_detail"
                                     f" || {timer} ELSE s.wait_detail END"}  # fmt: skip
        event_over |= {"at": "now()", "detail": f"CASE WHEN e.detail ? 'timer' THEN e.detail"
                                                f" || {timer} ELSE e.detail END"}  # fmt: skip
    else:  # signal
        run_over |= {"input": "jsonb_build_object('order', 'o-' || g)", "created_at": "now()"}
        mine = "jsonb_build_object('correlation', 'o-' || r.g)"
        step_over |= {"created_at": "now()",
                      "wake_at": "s.wake_at + make_interval(secs => r.g * %(spacing)s)",
                      "wait_detail": f"CASE WHEN s.wait_detail ? 'signal' THEN s.wait_detail"
                                     f" || {mine} ELSE s.wait_detail END"}  # fmt: skip
        event_over |= {"at": "now()", "detail": f"CASE WHEN e.detail ? 'signal' THEN e.detail"
                                                f" || {mine} ELSE e.detail END"}  # fmt: skip
    run_cols, run_select = cols("workflows_run", "t", run_over)
    step_cols, step_select = cols("workflows_step", "s", step_over)
    event_cols, event_select = cols("workflows_runevent", "e", event_over)
    timers, join = "", ""
    if kind == "timer":
        timer_cols, timer_select = cols("timers_timer", "x", {
            "org_id": "r.org_id", "run_id": "r.id", "created_at": "now()",
            "due_at": "now() + make_interval(secs => 86400 + r.g * %(spacing)s)"})  # fmt: skip
        timers = f""",
timers AS (
    INSERT INTO timers_timer ({timer_cols})
    SELECT {timer_select} FROM runs r JOIN timers_timer x ON x.run_id = %(template)s
    RETURNING id, run_id, due_at
)"""  # noqa: S608 (columns from information_schema, fragments of this module)
        join = "LEFT JOIN timers tm ON tm.run_id = r.id"
    return f"""
WITH {OWNERS},
runs AS (
    INSERT INTO workflows_run ({run_cols})
    SELECT {run_select}
      FROM workflows_run t CROSS JOIN generate_series(%(first)s, %(last)s) g
      JOIN owners o ON o.n = g %% %(norgs)s
     WHERE t.id = %(template)s
    RETURNING id, org_id, substr(start_key, length(%(tag)s) + 1)::bigint AS g
){timers},
steps AS (
    INSERT INTO workflows_step ({step_cols})
    SELECT {step_select} FROM runs r JOIN workflows_step s ON s.run_id = %(template)s {join}
    RETURNING 1
)
INSERT INTO workflows_runevent ({event_cols})
SELECT {event_select} FROM runs r JOIN workflows_runevent e ON e.run_id = %(template)s {join}
"""  # noqa: S608 (columns from information_schema, fragments of this module)


def templates(org: Organisation) -> dict[str, int]:
    """A finished run of three io steps (from part 1's drain), a run waiting on its timer and
    one waiting for its signal: what the engine wrote, to copy."""
    finished = Run.objects.filter(org=org, automation__slug="three", status="succeeded")
    tag = f"template-{time.time_ns()}"
    timer = run_start(org=org, automation_slug="timer", run_input={}, start_key=f"{tag}-t")
    signal = run_start(org=org, automation_slug="signal", run_input={"order": tag},
                       start_key=f"{tag}-s")  # fmt: skip
    return {"finished": finished.order_by("id").values_list("id", flat=True).first(),
            "timer": timer.run_id, "signal": signal.run_id}  # fmt: skip


def fill(orgs: list[Organisation], args: argparse.Namespace) -> None:
    heading(f"fill: {args.runs:,} finished runs, {args.timers:,} on timers, "
            f"{args.signals:,} waiting for signals")  # fmt: skip
    made = templates(orgs[0])
    began = time.perf_counter()
    execute(SEARCH_INDEX.DROP)  # built once after the rows: far faster than per row
    # kind, copies, tag, spacing (seconds between copies)
    plan = [("finished", args.runs, "fin-", 58 * 86400 / max(1, args.runs)),
            ("timer", args.timers, "tmr-", 29 * 86400 / max(1, args.timers)),
            ("signal", args.signals, "sig-", 3600 / max(1, args.signals))]  # fmt: skip
    for kind, total, tag, spacing in plan:
        statement = clone_sql(kind)
        template = Run.objects.get(pk=made[kind])
        slug = template.automation.slug
        for first in range(1, total + 1, BATCH):
            last = min(first + BATCH - 1, total)
            execute(statement, {"template": made[kind], "first": first, "last": last,
                                "total": total, "spacing": spacing, "tag": tag, "slug": slug,
                                "orgs": [o.pk for o in orgs], "norgs": len(orgs)})  # fmt: skip
            print(f"  {kind:<8} {last:>9,} of {total:,} ({time.perf_counter() - began:6.1f} s,"
                  f" {load()})", flush=True)  # fmt: skip
    execute("SET maintenance_work_mem = '512MB'")
    execute(SEARCH_INDEX.CREATE.replace("CONCURRENTLY ", ""))
    execute(SEARCH_INDEX.STATISTICS)
    print(f"  search index built ({time.perf_counter() - began:6.1f} s)", flush=True)
    for table in HOT:
        execute(f"VACUUM ANALYZE {table}")
    print(f"  filled and vacuumed in {time.perf_counter() - began:.0f} s", flush=True)


def filled(args: argparse.Namespace) -> bool:
    rows = execute("SELECT count(*) FROM workflows_run WHERE start_key LIKE 'fin-%%'")
    return int(rows[0][0]) >= args.runs


# ---------------------------------------------------------------------------------------
# Part 3: sizes, dead tuples, autovacuum settings.

SIZES_SQL = """
SELECT c.relname AS name, pg_total_relation_size(c.oid) AS total,
       pg_relation_size(c.oid) AS heap, pg_indexes_size(c.oid) AS indexes,
       c.reltuples::bigint AS rows
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind = 'r' AND n.nspname = 'public' AND pg_total_relation_size(c.oid) > 1048576
 ORDER BY 2 DESC
"""
INDEX_SQL = """
SELECT i.relname AS table_name, i.indexrelname AS name, pg_relation_size(i.indexrelid) AS size
  FROM pg_stat_user_indexes i
 WHERE i.relname = ANY(%(tables)s) AND pg_relation_size(i.indexrelid) > 0
 ORDER BY 1, 3 DESC
"""
DEAD_SQL = """
SELECT relname, n_live_tup, n_dead_tup, last_vacuum, last_autovacuum, autovacuum_count,
       last_autoanalyze, autoanalyze_count
  FROM pg_stat_user_tables WHERE relname = ANY(%(tables)s) ORDER BY relname
"""


def mb(size: float) -> str:
    return f"{size / 1048576:9.1f} MB"


def sizes(runs: int) -> None:
    heading(f"sizes ({runs:,} runs in the table; per 100,000 runs = size x 100,000 / runs)")
    per = 100_000 / max(1, runs)
    print(f"  {'table':<28} {'total':>12} {'heap':>12} {'indexes':>12} {'rows':>12}"
          f" {'total/100k runs':>16}")  # fmt: skip
    for name, total, heap, indexes, rows in execute(SIZES_SQL):
        print(f"  {name:<28} {mb(total)} {mb(heap)} {mb(indexes)} {rows:12,} {mb(total * per)}")
    print(f"\n  {'index':<52} {'size':>12} {'per 100k runs':>14}")
    for table, name, size in execute(INDEX_SQL, {"tables": list(HOT)}):
        print(f"  {table + '.' + name:<52} {mb(size)} {mb(size * per)}")


def vacuum_state(title: str) -> dict[str, tuple]:
    heading(title)
    rows = execute(DEAD_SQL, {"tables": list(HOT)})
    print(f"  {'table':<22} {'live':>11} {'dead':>9} {'dead %':>7} {'autovacuums':>11}"
          f" {'autoanalyzes':>12}  last autovacuum")  # fmt: skip
    for name, live, dead, _, auto, count, _, analyzes in rows:
        share = 100 * dead / max(1, live + dead)
        last = f"{auto:%H:%M:%S}" if auto else "never"
        print(f"  {name:<22} {live:11,} {dead:9,} {share:6.1f}% {count:11} {analyzes:12}  {last}")
    return {row[0]: row for row in rows}


def autovacuum_settings() -> None:
    heading("autovacuum settings")
    for name, setting, unit in execute(
        "SELECT name, setting, coalesce(unit, '') FROM pg_settings"
        " WHERE name LIKE 'autovacuum%%' OR name = 'vacuum_cost_limit' ORDER BY name"
    ):
        print(f"  {name:<40} {setting} {unit}")
    rows = execute("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%(t)s)"
                   " ORDER BY relname", {"t": list(HOT)})  # fmt: skip
    for name, options in rows:
        print(f"  {name:<22} own settings: {', '.join(options) if options else 'none'}")


# ---------------------------------------------------------------------------------------
# Part 4: the soak.


def role_of(process: psutil.Process) -> str:
    try:
        role = process.environ().get("WAYMARK_PROCESS_ROLE", "")
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        role = ""
    if role:
        return role
    line = process.cmdline()
    return " ".join(line[line.index("manage.py") + 1 :][:3]) if "manage.py" in line else line[0]


class Starter(threading.Thread):
    """Starts runs of ``soak`` at ``rate`` a second until stopped (one thread, paced)."""

    def __init__(self, org: Organisation, rate: float) -> None:
        super().__init__(daemon=True)
        self.org, self.rate = org, rate
        self.ids: list[int] = []
        self.halt = threading.Event()

    def run(self) -> None:
        tag, began, n = f"soak-{time.time_ns()}", time.monotonic(), 0
        try:
            while not self.halt.is_set():
                ahead = began + n / self.rate - time.monotonic()
                if ahead > 0:
                    self.halt.wait(ahead)
                self.ids.append(run_start(org=self.org, automation_slug="soak", run_input={},
                                          start_key=f"{tag}-{n}").run_id)  # fmt: skip
                n += 1
        finally:
            connection.close()


def slope_mb_per_hour(samples: list[tuple[float, float]]) -> float:
    if len(samples) < 2:
        return 0.0
    xs, ys = [t for t, _ in samples], [m for _, m in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den * 3600 if den else 0


def soak(org: Organisation, args: argparse.Namespace) -> None:
    heading(f"soak: runengine --no-web, {args.soak_rate:g} runs/s of noop, wait 2s, noop, "
            f"for {args.soak_minutes:g} min; memory every {args.sample_seconds:g} s")  # fmt: skip
    before = vacuum_state("before the soak: the hot tables")
    runengine = subprocess.Popen([sys.executable, "manage.py", "runengine", "--no-web"],
                                 cwd=ROOT, env=dict(os.environ))  # fmt: skip
    memory: dict[tuple[int, str], list[tuple[float, float]]] = {}
    starter = Starter(org, args.soak_rate)
    try:
        time.sleep(10)  # its children start and connect
        began = time.monotonic()
        starter.start()
        end = began + args.soak_minutes * 60
        while True:
            now = time.monotonic()
            for child in psutil.Process(runengine.pid).children(recursive=True):
                try:
                    rss = child.memory_info().rss / 1048576
                    memory.setdefault((child.pid, role_of(child)), []).append((now - began, rss))
                except psutil.NoSuchProcess:
                    continue
            print(f"  {(now - began) / 60:5.1f} min: {len(starter.ids):,} runs started, "
                  f"{load()}", flush=True)  # fmt: skip
            if now >= end:
                break
            time.sleep(min(args.sample_seconds, max(0.0, end - now)))
        starter.halt.set()
        starter.join()
        elapsed = time.monotonic() - began
        ids = starter.ids
        print(f"  started {len(ids):,} runs in {elapsed:.0f} s ({len(ids) / elapsed:.1f}/s); "
              "waiting for them to finish", flush=True)  # fmt: skip
        try:
            wait_finished(ids, timeout=600)
        except SystemExit as gone:
            PROBLEMS.append(f"soak: {gone}")
    finally:
        runengine.terminate()
        runengine.wait(timeout=60)
    check(ids, "the soak")
    heading("soak: resident memory per engine process (MB)")
    # A process grows while it warms up (imports, caches, its first batches): the slope from
    # WARM_UP_SECONDS on is the one a leak shows in.
    print(f"  {'process':<34} {'first':>8} {f'at {WARM_UP_SECONDS // 60} min':>8} {'last':>8}"
          f" {'max':>8} {'slope MB/h':>11} {'after warm-up':>14} samples")  # fmt: skip
    for (pid, role), samples in sorted(memory.items(), key=lambda item: item[0][1]):
        rss = [m for _, m in samples]
        warm = [(t, m) for t, m in samples if t >= WARM_UP_SECONDS]
        print(f"  {role + ' (' + str(pid) + ')':<34} {rss[0]:8.1f} "
              f"{warm[0][1] if warm else float('nan'):8.1f} {rss[-1]:8.1f} {max(rss):8.1f} "
              f"{slope_mb_per_hour(samples):11.1f} {slope_mb_per_hour(warm):14.1f} "
              f"{len(rss):7}")  # fmt: skip
    after = vacuum_state("after the soak: the hot tables")
    for name, row in after.items():
        done = row[5] - before[name][5] if name in before else row[5]
        print(f"  {name:<22} autovacuums during the soak: {done}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="finished runs")
    parser.add_argument("--timers", type=int, default=200_000, help="runs waiting on a timer")
    parser.add_argument("--signals", type=int, default=100_000, help="runs waiting for a signal")
    parser.add_argument("--fresh", type=int, default=1000, help="runs drained per measurement")
    parser.add_argument("--due", type=int, default=500, help="due timers and signals measured")
    parser.add_argument("--repeat", type=int, default=7, help="requests per page figure")
    parser.add_argument("--keep", action="store_true", help="reuse a database already filled")
    parser.add_argument("--soak-minutes", type=float, default=5.0)
    parser.add_argument("--soak-rate", type=float, default=50.0, help="runs started a second")
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    args = parser.parse_args()
    began = time.perf_counter()
    empty = saved() if args.keep else None
    if args.keep and empty is not None and filled(args):
        orgs = orgs_of()
        print(f"reusing the filled database and the empty figures of {EMPTY_FIGURES}")
    else:
        orgs = reset()
        empty = measure(orgs[0], args, "empty")
        save(empty)
        fill(orgs, args)
    full = measure(orgs[0], args, "full")
    side_by_side(empty, full, args.runs)
    sizes(Run.objects.count())
    vacuum_state("the hot tables after the fill and the measurements")
    autovacuum_settings()
    if args.soak_minutes > 0:
        soak(orgs[0], args)
    print(f"\nall done in {(time.perf_counter() - began) / 60:.1f} min")
    if PROBLEMS:
        print("\nPROBLEMS:\n" + "\n".join(f"- {p}" for p in PROBLEMS))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
