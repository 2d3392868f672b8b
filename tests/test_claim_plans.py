"""Work that is not yet due costs the claim nothing: same buffers with 0 or 200,000 of it.

Buffers, not milliseconds: EXPLAIN (ANALYZE, BUFFERS) counts the pages a statement touched,
which does not depend on how loaded the machine is. Each measured statement runs inside a
savepoint that is rolled back, so both measurements see the same claimable row.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from django.db import connection, transaction

from workflows.engine import sql
from workflows.engine.executors import StepResult
from workflows.engine.lanes import UNSHARED, lane_policy
from workflows.engine.plans import FIRST_REFRESH, MOST_USES_BETWEEN, PlanAge
from workflows.engine.sql.rows import query_prepared
from workflows.engine.steps import (
    PreparedClaims,
    claim,
    plan_claims_generically_from_now_on,
    settle_and_take_next,
)
from workflows.engine.walk import TakeNext
from workflows.models import Run
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .factories import IO_DEFINITION

pytestmark = pytest.mark.django_db

NOT_DUE = 200_000


def _touched(node: dict[str, Any]) -> int:
    return int(node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0))


def _index_scans(node: dict[str, Any], index: str) -> int:
    """Buffers the scans of ``index`` touched (their heap pages included)."""
    own = _touched(node) if node.get("Index Name") == index else 0
    return own + sum(_index_scans(child, index) for child in node.get("Plans", []))


def buffers(
    statement: str, params: dict[str, Any], index: str, *, generic: bool = False
) -> tuple[int, int]:
    """(buffers the scans of ``index`` touched, buffers the whole statement touched), hit +
    read: the least of three executions after a first that warms the caches. One execution
    may pay once for something that is not the backlog's (an index page splitting as the
    claim's event is inserted, a page pruned of the rolled-back attempts before it).

    ``generic``: of the statement's generic plan, the one a worker's connections run it with
    (sql.GENERIC_PLANS): prepared, then executed."""
    seen: list[tuple[int, int]] = []
    for _ in range(4):
        with transaction.atomic(), connection.cursor() as cursor:
            explained = statement
            if generic:
                explained = _prepared(cursor, statement, params)
            sid = transaction.savepoint()
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {explained}", params)
            plan = cursor.fetchone()[0]
            transaction.savepoint_rollback(sid)
            if generic:
                cursor.execute("DEALLOCATE measured")
        root = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
        seen.append((_index_scans(root, index), _touched(root)))
    warm = seen[1:]
    return min(s for s, _ in warm), min(t for _, t in warm)


def _prepared(cursor: Any, statement: str, params: dict[str, Any]) -> str:
    """Prepare ``statement`` as "measured" with its placeholders numbered, to be planned
    generically in this transaction; the EXECUTE that runs it with ``params``."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    numbered = re.sub(r"%\((\w+)\)s", number, statement)
    assert set(names) == set(params), (names, params)
    cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    cursor.execute(f"PREPARE measured AS {numbered}")
    return f"EXECUTE measured({', '.join(f'%({name})s' for name in names)})"


def add_steps(run: Run, count: int, *, status: str, wait_kind: str = "") -> None:
    """``count`` steps of the run's organisation: finished history, or (waiting, retry) work
    that is not yet due (a backoff of an hour)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO workflows_step
                (org_id, run_id, step_id, iteration, type, lane, status, attempt, release_count,
                 series_offset, max_attempts, wait_kind, wake_at, error, created_at)
            SELECT %(org)s, %(run)s, %(step_id)s, g, 'noop', 'io', %(status)s, 1, 0, 0, 5,
                   %(kind)s, CASE WHEN %(kind)s = '' THEN NULL ELSE now() + interval '1 hour' END,
                   '', now()
              FROM generate_series(1, %(n)s) g
            """,
            {"org": run.org_id, "run": run.pk, "n": count, "status": status, "kind": wait_kind,
             "step_id": f"{status}_{wait_kind}"},
        )  # fmt: skip
        cursor.execute("ANALYZE workflows_step")


CLAIM = {"lane": "io", "n": 16, "worker": "w", "lease": 30, "after_org": 0, **UNSHARED.params(16)}
PROMOTE = {"lane": "io", "n": 500, "worker": "w"}


def step_indexes() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_index WHERE indrelid = 'workflows_step'::regclass")
        return int(cursor.fetchone()[0])


def update_descents() -> int:
    """The pages an update of a step row may touch beyond a HOT update's: a descent of each
    of the table's indexes (B-trees of three levels at the heights measured here)."""
    return 3 * step_indexes()


def claim_buffers(*, generic: bool = False) -> tuple[int, int]:
    return buffers(sql.CLAIM, CLAIM, "step_claimable", generic=generic)


def promote_buffers() -> tuple[int, int]:
    return buffers(sql.PROMOTE_DUE_RETRIES, PROMOTE, "step_wake_due")


def test_not_yet_due_work_costs_the_claim_and_the_retry_promotion_nothing(org) -> None:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    run = Run.objects.get(pk=run_start(org=org, automation_slug="io", run_input={},
                                       start_key="k").run_id)  # fmt: skip
    # The table has history, as a real one does (a nearly empty table is read whole, which
    # would compare a sequential scan with index scans): 200,000 finished steps.
    add_steps(run, NOT_DUE, status="done")
    empty = (claim_buffers(), promote_buffers())
    empty_generic = claim_buffers(generic=True)

    add_steps(run, NOT_DUE, status="waiting", wait_kind="retry")
    backlog = (claim_buffers(), promote_buffers())
    backlog_generic = claim_buffers(generic=True)

    report = (
        f"(claim, promotion) buffers as (scans of its index, whole statement) with 0 / "
        f"{NOT_DUE} not-yet-due steps: {empty} / {backlog}"
    )
    (claim_scans, claim_total), (promote_scans, _) = empty
    (backlog_claim_scans, backlog_claim_total), (backlog_promote_scans, _) = backlog
    # Finding and locking the claimable work reads exactly the same pages.
    assert backlog_claim_scans == claim_scans, report
    # Updating the claimed row costs the same work either way, but not always the same pages:
    # when the new version cannot stay on the row's page (a HOT update; the measurements'
    # own rolled-back attempts fill that page, and when its space is reclaimed is up to the
    # server), the update descends every index of the table to insert its entry, each tree
    # now 400,000 rows tall instead of 200,000 (three levels). So at most a descent per
    # index more, never a page per not-yet-due row (a scan of them: thousands of pages).
    assert backlog_claim_total <= claim_total + update_descents(), report
    # The promotion reads the due end of an index over the waiting rows, which was empty:
    # only its height grows.
    assert backlog_promote_scans <= promote_scans + 2, report
    # The plan a worker runs the claim with (generic, planned once) pays no more for it.
    generic_report = f"generic plan's claim buffers: {empty_generic} / {backlog_generic}"
    assert backlog_generic[0] == empty_generic[0] == claim_scans, generic_report
    assert backlog_generic[1] <= empty_generic[1] + update_descents(), generic_report


ONE = {
    "start": "only",
    "steps": [{"id": "only", "type": "noop", "next": "done"}, {"id": "done", "type": "end"}],
}
PLANNED = 8  # past the five custom plans after which PostgreSQL may settle on a generic one
CLAIM_PLANS = """
SELECT coalesce(sum(generic_plans), 0) AS generic, coalesce(sum(custom_plans), 0) AS custom
  FROM pg_prepared_statements WHERE statement LIKE '%%ahead(org_id,%%depth) AS%%'
"""


@pytest.mark.django_db(transaction=True)
def test_a_workers_connections_plan_the_claim_once(org) -> None:
    """Both connections a worker claims on, its claim loop's (sql.CLAIM) and a settling
    thread's (whose settle claims the lane's next step when its run ends: sql.
    CLAIM_AFTER_HOPS), run the claim on a generic plan: planned once per connection, not on
    every call (sql.GENERIC_PLANS)."""
    automation_publish_definition(org=org, slug="one", definition=ONE)
    for n in range(2 * PLANNED):
        run_start(org=org, automation_slug="one", run_input={}, start_key=f"k{n}")
    policy = lane_policy("io")
    loop = PreparedClaims()
    held = [claim(policy=policy, worker="w", limit=1, on=loop)[0] for _ in range(PLANNED)]
    assert loop.conn is not None
    with loop.conn.cursor() as cursor:
        on_loop = cursor.execute(CLAIM_PLANS).fetchone()
    loop.close()

    seen: dict[str, Any] = {}

    def settling_thread() -> None:  # as a worker's: its connection opens in the thread
        take = TakeNext(worker="w", lane="io", lease_seconds=30, claim_lane=True)
        try:
            for step in held:  # each ends its run, then claims one of the others
                assert settle_and_take_next(step, StepResult(output=None), worker="w",
                                            take=take).from_lane  # fmt: skip
            with connection.cursor() as cursor:
                cursor.execute(CLAIM_PLANS)
                seen["plans"] = cursor.fetchone()
        finally:
            connection.close()

    plan_claims_generically_from_now_on()  # as Worker.run does
    thread = threading.Thread(target=settling_thread)
    thread.start()
    thread.join()

    assert on_loop == {"generic": PLANNED, "custom": 0}
    assert tuple(seen["plans"]) == (PLANNED, 0)


def _grow(run: Run, count: int) -> None:
    """``count`` finished runs like ``run``, each with a finished step: the tables a claim
    joins grow, its claimable work does not."""
    columns = [
        str(f.column) for f in Run._meta.concrete_fields if f.column not in ("id", "start_key")
    ]
    listed = ", ".join(columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO workflows_run ({listed}, start_key)"  # noqa: S608 (model columns)
            f" SELECT {listed}, 'grown-' || g FROM workflows_run, generate_series(1, %(n)s) g"
            " WHERE id = %(run)s",
            {"n": count, "run": run.pk},
        )
        cursor.execute(
            """
            INSERT INTO workflows_step (org_id, run_id, step_id, iteration, type, lane, status,
                attempt, release_count, series_offset, max_attempts, wait_kind, error, created_at)
            SELECT org_id, id, 'grown', 1, 'noop', 'io', 'done', 1, 0, 0, 5, '', '', now()
              FROM workflows_run WHERE start_key LIKE 'grown-%%'
            """
        )


PREPARED_CLAIM = (
    "SELECT name FROM pg_prepared_statements WHERE statement LIKE '%WITH RECURSIVE ahead%'"
)


def _literal(value: Any) -> str:
    """``value`` as EXECUTE's parameter list spells it (a list as an array literal)."""
    if isinstance(value, list):
        return "'{" + ",".join(str(v) for v in value) + "}'"
    return repr(value)


def _claim_plan(conn: Any) -> str:
    """The plan ``conn`` would run its prepared claim with now (its cached generic plan),
    read with EXPLAIN EXECUTE on that same connection, as text."""
    names: list[str] = []
    for name in re.findall(r"%\((\w+)\)s", sql.CLAIM):
        if name not in names:
            names.append(name)
    values = ", ".join(_literal(CLAIM[name]) for name in names)
    with conn.cursor() as cursor:
        cursor.execute(PREPARED_CLAIM)
        (row,) = cursor.fetchall()
        prepared = row["name"] if isinstance(row, dict) else row[0]
        cursor.execute(f"EXPLAIN EXECUTE {prepared}({values})")
        return "\n".join(r["QUERY PLAN"] if isinstance(r, dict) else r[0]
                         for r in cursor.fetchall())  # fmt: skip


def _whole_table_scans(plan: str) -> list[str]:
    return re.findall(r"Seq Scan on (workflows_run|workflows_step)\b", plan)


@pytest.mark.django_db(transaction=True)
def test_a_claim_planned_on_small_tables_is_planned_again_as_they_grow(org) -> None:
    """A worker plans its claim once per connection (sql.GENERIC_PLANS). Planned while the
    tables were nearly empty (a new install, a benchmark's first second), that plan read
    ``workflows_run`` and ``workflows_step`` whole at every claim, for as long as the
    connection lived. Both connections a worker claims on, its claim loop's and a settling
    thread's, drop their plans after PlanAge's uses of prepared statements (plans.py): the
    claim is then planned again for the tables as they are, by key lookups."""
    with _no_autoanalyze("workflows_run", "workflows_step"):
        _planned_on_small_tables_then_grown(org)


@contextmanager
def _no_autoanalyze(*tables: str) -> Iterator[None]:
    """Autovacuum's ANALYZE of a grown table invalidates the plans made on it, which would
    make the claim again before the test reads the plan made on small tables (CI saw it
    once, late in a full run): for this test's length, only PlanAge replans."""
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for table in tables:
                cursor.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


def _planned_on_small_tables_then_grown(org: Any) -> None:
    automation_publish_definition(org=org, slug="one", definition=ONE)
    run = Run.objects.get(pk=run_start(org=org, automation_slug="one", run_input={},
                                       start_key="first").run_id)  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workflows_run, workflows_step")  # small, as a new install's
    # Claims that find nothing: the generic plan does not depend on the lane.
    nowhere = replace(lane_policy("io"), name="nowhere")
    loop = PreparedClaims()
    claim(policy=nowhere, worker="w", limit=1, on=loop)  # planned now, on small tables

    planned, grown, seen = threading.Event(), threading.Event(), {}

    def settling_thread() -> None:  # a worker's settling thread: its connection opens here
        try:
            with connection.cursor() as cursor:
                query_prepared(cursor, sql.CLAIM, {**CLAIM, "lane": "nowhere"})
            planned.set()
            grown.wait()
            seen["before"] = _claim_plan(connection.connection)
            for _ in range(FIRST_REFRESH):
                with connection.cursor() as cursor:
                    query_prepared(cursor, sql.CLAIM, {**CLAIM, "lane": "nowhere"})
            seen["after"] = _claim_plan(connection.connection)
        finally:
            planned.set()
            connection.close()

    plan_claims_generically_from_now_on()  # as Worker.run does
    thread = threading.Thread(target=settling_thread)
    thread.start()
    planned.wait()
    _grow(run, 3000)
    grown.set()
    thread.join()

    assert loop.conn is not None
    loop_before = _claim_plan(loop.conn)
    for _ in range(FIRST_REFRESH):
        claim(policy=nowhere, worker="w", limit=1, on=loop)
    loop_after = _claim_plan(loop.conn)
    loop.close()

    # The premise, on both: the plans made on small tables read them whole.
    assert _whole_table_scans(loop_before), loop_before
    assert _whole_table_scans(seen["before"]), seen["before"]
    assert not _whole_table_scans(loop_after), loop_after
    assert not _whole_table_scans(seen["after"]), seen["after"]


def test_plans_are_dropped_ever_less_often_down_to_a_floor() -> None:
    """PlanAge: after 32 uses, then after twice as many as the time before, up to every
    MOST_USES_BETWEEN: often while a new connection's tables may be growing fast, then
    rarely, and never stops."""
    age, gaps, since = PlanAge(), [], 0
    for _ in range(4 * MOST_USES_BETWEEN + 8_000):
        since += 1
        if age.due():
            gaps.append(since)
            since = 0
    assert gaps[:8] == [32, 64, 128, 256, 512, 1024, 2048, 4096]
    assert gaps[8:] and set(gaps[8:]) == {MOST_USES_BETWEEN}
