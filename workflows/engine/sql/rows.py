"""Building and reading engine rows: multi-row INSERTs, and rows read by column name.

Rows come back as dicts keyed by the column names the statements in ``sql`` select, never
positionally: adding a column to a statement cannot shift another field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb


class _Now:
    """The database's now() in an inserted row."""

    def __repr__(self) -> str:
        return "NOW"


NOW = _Now()


@dataclass(frozen=True)
class NowPlus:
    """The database's now() plus some seconds, in an inserted row."""

    seconds: float


def fetch_dicts(cursor: Any) -> list[dict[str, Any]]:
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def fetch_dict(cursor: Any) -> dict[str, Any] | None:
    row = cursor.fetchone()
    if row is None:
        return None
    return dict(zip([column[0] for column in cursor.description], row, strict=True))


def json_or_null(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


Statement = tuple[str, Any]


def execute(cursor: Any, statement: Statement | None) -> None:
    """Run one statement built here; None (nothing to insert) runs nothing."""
    if statement is not None:
        cursor.execute(*statement)


def insert_rows(cursor: Any, table: str, columns: Sequence[str], rows: list[tuple]) -> None:
    """One multi-row INSERT; NOW in a row becomes now(), NowPlus(s) now() + s seconds."""
    execute(cursor, insert_statement(table, columns, rows))


def insert_statement(table: str, columns: Sequence[str], rows: list[tuple]) -> Statement | None:
    """The multi-row INSERT of ``rows`` (None for no rows), for insert_rows or run_batch."""
    if not rows:
        return None
    params: list[Any] = []
    groups = []
    for row in rows:
        cells = []
        for value in row:
            if value is NOW:
                cells.append("now()")
            elif isinstance(value, NowPlus):
                cells.append("now() + make_interval(secs => %s)")
                params.append(value.seconds)
            else:
                cells.append("%s")
                params.append(value)
        groups.append(f"({', '.join(cells)})")
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join(groups)}"  # noqa: S608
    return sql, params


def run_batch(
    cursor: Any, statements: list[Statement | None], *, then: Statement | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """Run several statements in one round trip; return the first one's row count and the
    rows of ``then``, a query run last (none when it is not given).

    Each is bound on the client exactly as a single execute would bind it (psycopg's
    ClientCursor.mogrify, which Django's PostgreSQL cursor is), then they are sent together:
    one trip to the server instead of one per statement, in the caller's transaction."""
    parts = [s for s in statements if s is not None]
    if then is not None:
        parts.append(then)
    if not parts:
        return 0, []
    client = cursor.cursor  # the psycopg cursor behind Django's wrapper
    cursor.execute(";\n".join(client.mogrify(sql, params) for sql, params in parts))
    first = int(cursor.rowcount)
    if then is None:
        return first, []
    while client.nextset():  # on to the last result: the query's
        pass
    return first, fetch_dicts(client)


STEP_COLUMNS = (
    "org_id", "run_id", "step_id", "iteration", "type", "lane", "status", "owner", "attempt",
    "release_count", "series_offset", "max_attempts", "lease_until", "wait_kind", "wake_at",
    "wait_detail", "output", "error", "finished_at", "fork_join_id", "branch",
)  # fmt: skip
EVENT_COLUMNS = (
    "org_id", "run_id", "kind", "step_id", "iteration", "attempt", "worker", "detail", "at",
)  # fmt: skip


def event_row(
    org_id: int,
    run_id: int,
    kind: str,
    step_id: str = "",
    *,
    iteration: int | None = None,
    attempt: int | None = None,
    worker: str = "",
    detail: Any = None,
) -> tuple:
    """One run event, for insert_events: every transition of a run is one of these."""
    return (org_id, run_id, kind, step_id, iteration, attempt, worker, json_or_null(detail), NOW)


def insert_events(cursor: Any, rows: list[tuple]) -> None:
    execute(cursor, events_statement(rows))


def events_statement(rows: list[tuple]) -> Statement | None:
    return insert_statement("workflows_runevent", EVENT_COLUMNS, rows)


def insert_wakes(cursor: Any, wakes: list[tuple[int, int, str]]) -> None:
    """Outbox rows waking a lane, from (org id, run id, lane) triples."""
    execute(cursor, wakes_statement(wakes))


# The lane channel the relay notifies (transport.channel_for) and idle workers listen on.
LANE_CHANNEL_PREFIX = "waymark_lane_"


def wakes_statement(wakes: list[tuple[int, int, str]]) -> Statement | None:
    """The outbox rows for ``wakes``, in one statement that also notifies the lanes that have
    an idle worker listed (sql.MARK_IDLE), so an idle engine starts the work at once; the
    relay publishes the rows as well (a duplicate wake costs one empty claim). A busy lane
    lists no idle worker, so its writers take no notification lock at commit."""
    insert = insert_statement(
        "workflows_outbox",
        ("org_id", "topic", "payload", "created_at"),
        [(org, "lane.wake", Jsonb({"lane": lane, "run": run}), NOW) for org, run, lane in wakes],
    )
    if insert is None:
        return None
    sql, params = insert
    notify = f"""
WITH woken AS ({sql} RETURNING payload->>'lane' AS lane)
SELECT pg_notify('{LANE_CHANNEL_PREFIX}' || lane, '') FROM (
    SELECT DISTINCT lane FROM workflows_idleworker
     WHERE lane IN (SELECT lane FROM woken) AND idle_until > now()
) idle"""  # noqa: S608 (constant SQL around a built INSERT)
    return notify, params
