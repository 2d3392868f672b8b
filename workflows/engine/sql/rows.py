"""Building and reading engine rows: multi-row INSERTs, and rows read by column name.

Rows come back as dicts keyed by the column names the statements in ``sql`` select, never
positionally: adding a column to a statement cannot shift another field (the main ones are
typed there, as TypedDicts). Rows to insert are NamedTuples whose fields are the columns
(NewStep, EventRow): built by name, sent as the plain tuples they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple, TypeVar

import psycopg
from django.db import connection, models
from psycopg.types.json import Jsonb

from ..plans import refresh_plans_when_due

M = TypeVar("M", bound=models.Model)


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
    names = column_names(cursor)
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def model_from_row(model: type[M], row: dict[str, Any], prefix: str = "") -> M:
    """A model instance from a raw row, as the ORM would load it: each concrete field from
    the column ``prefix + attname``. A field the row lacks is deferred (loaded when read),
    never wrong; the fields' types need no conversion from the database (no JSON)."""
    fields = [f.attname for f in model._meta.concrete_fields if prefix + f.attname in row]
    return model.from_db("default", fields, [row[prefix + name] for name in fields])


def fetch_dict(cursor: Any) -> dict[str, Any] | None:
    row = cursor.fetchone()
    if row is None:
        return None
    return dict(zip(column_names(cursor), row, strict=True))


def column_names(cursor: Any) -> list[str]:
    """The result's column names, read off the server's result (``description`` builds a
    Column object per column, which was a tenth of a timer batch's Python time)."""
    result = getattr(cursor, "cursor", cursor).pgresult
    return [result.fname(i).decode() for i in range(result.nfields)]


def has_rows(cursor: psycopg.Cursor[Any]) -> bool:
    """Whether the statement returns rows (a query), not only a status (a command)."""
    result = cursor.pgresult
    return result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK


def json_or_null(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


Statement = tuple[str, Any]


def json_rows(columns: Sequence[str], rows: Sequence[tuple]) -> Jsonb:
    """Rows as one JSON array of objects keyed by column name, for a server-side function
    (sql/functions.py): NOW is 0 and NowPlus(s) is s (the function adds now()), a Jsonb cell
    is its value."""
    return Jsonb([dict(zip(columns, row, strict=True)) for row in rows], dumps=dumps_cells)


def _cell(value: Any) -> Any:
    """What JSON holds for a cell that is not JSON itself (the encoder's ``default``, called
    only for those: a row's other cells cost no Python call each)."""
    if value is NOW:
        return 0
    if isinstance(value, NowPlus):
        return value.seconds
    if isinstance(value, Jsonb):
        return value.obj
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# json.dumps's defaults otherwise, without the check for a value that contains itself (a
# set of the ids of every container written, kept for each document: about a sixth of the
# encoding of a hop's document). One that does still fails: RecursionError, not ValueError.
_CELLS = json.JSONEncoder(default=_cell, check_circular=False)


def dumps_cells(document: Any) -> str:
    """A JSON document holding rows as objects (json_rows, RowCells): json.dumps's text,
    their cells as json_rows says."""
    return _CELLS.encode(document)


def execute(cursor: Any, statement: Statement | None) -> None:
    """Run one statement built here; None (nothing to insert) runs nothing."""
    if statement is not None:
        cursor.execute(*statement)


def insert_rows(cursor: Any, table: str, columns: Sequence[str], rows: Sequence[tuple]) -> None:
    """One multi-row INSERT; NOW in a row becomes now(), NowPlus(s) now() + s seconds."""
    execute(cursor, insert_statement(table, columns, rows))


def insert_statement(table: str, columns: Sequence[str], rows: Sequence[tuple]) -> Statement | None:
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


def in_outermost_block() -> bool:
    """Whether the caller's atomic block is the outermost one: only then may its COMMIT go
    with its last writes (run_batch's ``commit``), not when a test's transaction holds it."""
    return len(connection.atomic_blocks) == 1


def run_batch(
    cursor: Any,
    statements: Sequence[Statement | None],
    *,
    then: Statement | None = None,
    commit: bool = False,
) -> tuple[int, list[dict[str, Any]]]:
    """Run several statements in one round trip; return the first one's row count and the
    rows of ``then``, a query run last (none when it is not given). ``commit``: the
    transaction's COMMIT goes in the same round trip, after them (see _pipelined).

    They are sent in one pipeline (psycopg's pipeline mode: one trip to the server, one
    sync), each as a server-side prepared statement, in the caller's transaction on the
    connection behind ``cursor``. Prepared, because the engine sends the same few statements
    all day: planning them each time was about 40 % of the database's time per step
    (pg_stat_statements, docs/explanation/claim-and-settle.md)."""
    parts = [s for s in statements if s is not None]
    if then is not None:
        parts.append(then)
    if not parts:
        return 0, []
    with _pipelined(cursor, parts, commit=commit) as cursors:
        return int(cursors[0].rowcount), fetch_dicts(cursors[-1]) if then is not None else []


def query_pipelined(cursor: Any, statements: list[Statement]) -> list[list[dict[str, Any]]]:
    """Several queries in one round trip (one pipeline, each server-side prepared, in the
    caller's transaction); the rows of each, by column name. For a single-threaded caller
    where a round trip costs more than the pipeline's Python work (see query_prepared)."""
    with _pipelined(cursor, statements) as cursors:
        return [fetch_dicts(each) if has_rows(each) else [] for each in cursors]


def transaction_pipelined(cursor: Any, statements: list[Statement]) -> list[list[dict[str, Any]]]:
    """Several queries as one transaction in one round trip: BEGIN, each statement (server-side
    prepared), COMMIT, in one pipeline; the rows of each, by column name. Committed when this
    returns. Inside the caller's atomic block (a test's transaction) they are only pipelined,
    in that transaction.

    Not in Django's atomic block: there psycopg begins the transaction with a BEGIN it waits
    for, a round trip of its own even in a pipeline, and the COMMIT is another; with a
    group's statement in between, three trips where one does. A statement that fails makes
    the server skip the rest, the COMMIT too (a pipeline stops at its first error): this rolls
    the transaction back and raises, and nothing was written."""
    if connection.in_atomic_block:
        return query_pipelined(cursor, statements)
    conn = _psycopg_connection(cursor)
    if not conn.autocommit:  # Django's connection outside an atomic block always is
        raise RuntimeError("transaction_pipelined needs a connection in autocommit")
    try:
        with _pipelined(cursor, statements, begin=True, commit=True) as cursors:
            return [fetch_dicts(each) if has_rows(each) else [] for each in cursors]
    except BaseException:
        _roll_back(conn)
        raise


def _roll_back(conn: psycopg.Connection[Any]) -> None:
    """End a transaction a failed pipeline left open (BEGIN ran, COMMIT was skipped); a
    broken connection has none left to end (the caller closes it)."""
    if conn.closed or conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return
    with suppress(psycopg.Error):  # it broke meanwhile: the server ends the transaction with it
        conn.execute("ROLLBACK")


@contextmanager
def _pipelined(
    cursor: Any, statements: list[Statement], *, begin: bool = False, commit: bool = False
) -> Iterator[list[psycopg.Cursor[Any]]]:
    """The statements sent in one pipeline on the connection behind ``cursor``, each
    prepared; their cursors, closed when the block ends.

    ``begin``: BEGIN first, in the same pipeline (see transaction_pipelined).
    ``commit``: then COMMIT, in the same pipeline. The caller's transaction is committed when
    this returns; if a statement failed, the server skipped the COMMIT (a pipeline stops at
    its first error), this raises and the caller's atomic block rolls back as usual. Only
    for the last writes of a durable (outermost) atomic block, whose own commit then finds
    nothing to do."""
    conn = _psycopg_connection(cursor)
    with _database_errors(cursor):
        refresh_plans_when_due(conn)
    with _database_errors(cursor), conn.pipeline():
        if begin:
            psycopg.Cursor(conn).execute("BEGIN")
        cursors = [_execute_prepared(conn, sql, params) for sql, params in statements]
        if commit:
            psycopg.Cursor(conn).execute("COMMIT")
    try:
        yield cursors
    finally:
        for each in cursors:
            each.close()


def query_prepared(cursor: Any, sql: str, params: Any) -> list[dict[str, Any]]:
    """One statement as a server-side prepared statement, in the caller's transaction on the
    connection behind ``cursor``; its rows by column name (none for a command).

    Sent on its own, not pipelined with the statement after it: pipelining the settle's run
    lock with its transition saved a round trip but cost the drained rate 17 % (psycopg's
    pipeline does more Python work per statement, and a busy worker's settling threads share
    one interpreter)."""
    conn = _psycopg_connection(cursor)
    with _database_errors(cursor):
        refresh_plans_when_due(conn)
        prepared = _execute_prepared(conn, sql, params)
        rows = fetch_dicts(prepared) if has_rows(prepared) else []
    prepared.close()
    return rows


def _execute_prepared(conn: psycopg.Connection[Any], sql: str, params: Any) -> psycopg.Cursor[Any]:
    # A plain psycopg cursor binds on the server (Django's binds on the client, which cannot
    # be prepared); prepare=True since Django turns automatic preparation off.
    prepared = psycopg.Cursor(conn)
    prepared.execute(sql, params, prepare=True)
    return prepared


def _psycopg_connection(cursor: Any) -> psycopg.Connection[Any]:
    """The psycopg connection behind a Django cursor (or a psycopg cursor)."""
    conn: psycopg.Connection[Any] = getattr(cursor, "cursor", cursor).connection
    return conn


def _database_errors(cursor: Any) -> Any:
    """Django's translation of driver errors (OperationalError and the rest), as its own
    cursors give them, so callers catch one kind whichever cursor ran the statement."""
    db = getattr(cursor, "db", None)
    return db.wrap_database_errors if db is not None else nullcontext()


class NewStep(NamedTuple):
    """A step row to insert (workflows_step), its fields the columns in the INSERT's order
    (STEP_COLUMNS): built by name, sent as the plain tuple it is (insert_statement), or as
    objects keyed by column (json_rows, RowCells) for the server functions that read JSON."""

    org_id: int
    run_id: int
    step_id: str
    iteration: int
    type: str
    lane: str
    status: str
    owner: str | None
    attempt: int
    release_count: int
    series_offset: int
    max_attempts: int
    lease_until: _Now | NowPlus | None
    wait_kind: str
    wake_at: NowPlus | None
    wait_detail: Jsonb | None
    output: Jsonb | None
    error: str
    finished_at: _Now | None
    fork_join_id: int | None
    branch: int | None


class EventRow(NamedTuple):
    """A run event to insert (workflows_runevent), its fields the columns (EVENT_COLUMNS)."""

    org_id: int
    run_id: int
    kind: str
    step_id: str
    iteration: int | None
    attempt: int | None
    worker: str
    detail: Jsonb | None
    at: _Now


STEP_COLUMNS = NewStep._fields
EVENT_COLUMNS = EventRow._fields


class RowCells:
    """The cells of rows that a server function reads from JSON (jsonb_to_recordset): only
    those it names, and none that is null, since a missing key reads as NULL as a JSON null
    does. A hop's and a start's documents are encoded in the worker or the web process and
    parsed by the server on every hop and start, so they carry no cell the function takes
    from elsewhere (the run's organisation and id, the worker, the time) and no null."""

    def __init__(self, columns: Sequence[str], fields: Sequence[str]) -> None:
        self.fields = tuple(fields)
        self.cells = itemgetter(*(columns.index(name) for name in self.fields))

    def objects(self, rows: Sequence[tuple]) -> list[dict[str, Any]]:
        fields, cells = self.fields, self.cells
        return [
            {name: cell for name, cell in zip(fields, cells(row), strict=True) if cell is not None}
            for row in rows
        ]

    def json(self, rows: Sequence[tuple]) -> Jsonb:
        """The objects as one JSON parameter, encoded as json_rows encodes rows."""
        return Jsonb(self.objects(rows), dumps=dumps_cells)


# sql/functions.py (waymark_settle_hop_v1, waymark_settle_hops_v3) and sql.START_RUN read
# these: a new step's every column but the run's (the statement's own), and an event's kind,
# step, iteration, attempt and detail (a hop's worker is the hop's; a start's is each event's).
NEW_STEP_CELLS = RowCells(STEP_COLUMNS, [c for c in STEP_COLUMNS if c not in ("org_id", "run_id")])
HOP_EVENT_CELLS = RowCells(EVENT_COLUMNS, ("kind", "step_id", "iteration", "attempt", "detail"))
START_EVENT_CELLS = RowCells(
    EVENT_COLUMNS, ("kind", "step_id", "iteration", "attempt", "worker", "detail")
)


# Both are built by name through their own __new__, called directly (``NewStep.__new__(NewStep,
# org_id=..., ...)``): calling the class packs the keyword arguments into a dict first, which
# made building an event cost two and a half times as much (one or more per transition).


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
) -> EventRow:
    """One run event, for insert_events: every transition of a run is one of these."""
    return EventRow.__new__(
        EventRow, org_id=org_id, run_id=run_id, kind=kind, step_id=step_id, iteration=iteration,
        attempt=attempt, worker=worker, detail=json_or_null(detail), at=NOW,
    )  # fmt: skip


def insert_events(cursor: Any, rows: list[EventRow]) -> None:
    execute(cursor, events_statement(rows))


def json_params(params: dict[str, Any]) -> dict[str, Any]:
    """A statement's parameters as one JSON object, for a statement that reads its rows
    from JSON (a hop's, several runs' updates): a JSON parameter is its value, and a NULL
    is left out (a missing key reads as SQL NULL; a JSON null would be jsonb 'null')."""
    return {
        name: value.obj if isinstance(value, Jsonb) else value
        for name, value in params.items()
        if value is not None
    }


def events_statement(rows: list[EventRow]) -> Statement | None:
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
