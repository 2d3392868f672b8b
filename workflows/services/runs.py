"""Starting runs: once per start key, atomically with their first steps and wake-ups."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from opentelemetry.trace import Span, SpanKind
from psycopg.types.json import Jsonb

from ..definitions.fields import parse_duration
from ..definitions.storable import UNSTORABLE_REASON, has_unstorable, unstorable_path
from ..definitions.validator import canonical_json
from ..engine import sql, tracing
from ..engine.definition_cache import definition_for, version_label
from ..engine.faults import crash_point
from ..engine.sql.rows import fetch_dict, in_outermost_block, query_prepared
from ..engine.starts import start_in_one_trip
from ..engine.walk import RunState, Walk
from ..errors import (
    InvalidInput,
    NoPublishedVersion,
    PayloadTooLarge,
    StartKeyConflict,
    StartQuota,
    UnknownAutomation,
)
from ..models import Organisation
from ..states import RunStatus
from . import quotas

MAX_START_KEY = 255
DERIVED_KEY_PREFIX = "input:"  # keys the engine derives from the input; clients cannot use it


@dataclass(frozen=True)
class StartResult:
    run_id: int
    created: bool
    status: str  # the run's status as the start left it (a quick-only run may be finished)
    start_key: str  # as given, or derived from the input
    version_id: int | None = None  # the version the run runs (a repeat: the first start's)


MAX_INPUT_DEPTH = 32


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value, computed without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, level + 1) for child in item)
    return deepest


def check_input(run_input: Any) -> str:
    """A run input: a JSON object within the limits (see check_json_value). Returns its
    canonical JSON, which the start's digest and stored input are made from."""
    if not isinstance(run_input, dict):
        raise InvalidInput(reason="input must be a JSON object")
    return check_json_value(run_input, "input", "The run input")


def check_json_value(value: Any, field: str, what: str) -> str:
    """A JSON value from a client that is to be stored (a run input, a signal payload): not
    nested too deep, storable by PostgreSQL, within WAYMARK_MAX_INPUT_BYTES. ``field`` names
    it in messages, ``what`` in the size refusal. Returns its canonical JSON."""
    if _depth(value) > MAX_INPUT_DEPTH:
        raise InvalidInput(reason=f"{field} nests deeper than {MAX_INPUT_DEPTH} levels")
    unstorable = unstorable_path(value)
    if unstorable is not None:
        raise InvalidInput(reason=f"{field}.{unstorable} {UNSTORABLE_REASON}")
    canonical = canonical_json(value)
    size = len(canonical.encode())
    limit = settings.WAYMARK["MAX_INPUT_BYTES"]
    if size > limit:
        raise PayloadTooLarge(what=what, size=size, limit=limit)
    return canonical


def _check_start_key(start_key: str) -> None:
    if not 1 <= len(start_key) <= MAX_START_KEY:
        raise InvalidInput(reason=f"start_key must be 1 to {MAX_START_KEY} characters")
    if has_unstorable(start_key):
        raise InvalidInput(reason=f"start_key {UNSTORABLE_REASON}")
    if start_key.startswith(DERIVED_KEY_PREFIX):
        raise InvalidInput(reason=f'start keys starting with "{DERIVED_KEY_PREFIX}" are reserved')


def run_limits(definition: dict[str, Any]) -> tuple[int, float]:
    limits = definition.get("limits") or {}
    max_steps = limits.get("max_steps") or settings.WAYMARK["DEFAULT_MAX_STEPS"]
    age = parse_duration(limits["max_age"]) if "max_age" in limits else None
    max_age = age.total_seconds() if age else float(settings.WAYMARK["DEFAULT_MAX_AGE_SECONDS"])
    return int(max_steps), max_age


def run_start(
    *,
    org: Organisation,
    automation_slug: str,
    run_input: Any,
    start_key: str | None = None,
) -> StartResult:
    """Start one run of the automation's current version, or return the one this key started.

    Start keys are unique per organisation. Without one, the automation and the canonical
    input's digest make the key: two separate triggers with identical input then collapse
    into one run (see docs/how-to/call-the-api.md). The same key with another input, or for another
    automation, is refused with start_key_conflict.
    """
    if not tracing.on():
        return _run_start(org, automation_slug, run_input, start_key, trace=None)
    attributes = {tracing.ORG_ID: org.pk, tracing.AUTOMATION: automation_slug}
    with tracing.span("waymark.run.start", kind=SpanKind.PRODUCER, attributes=attributes) as span:
        # The run stores this span's context: its steps' spans, in any process, are children.
        started = _run_start(org, automation_slug, run_input, start_key,
                             trace=tracing.traceparent(span))  # fmt: skip
        _traced_start(span, started)
        return started


def _run_start(
    org: Organisation, slug: str, run_input: Any, start_key: str | None, *, trace: str | None
) -> StartResult:
    canonical = check_input(run_input)
    if start_key is not None:
        _check_start_key(start_key)
    start = _Start(org, slug, start_key, run_input, canonical, trace)
    admission = quotas.start_admission(org)
    result = _start_in_one_trip(start, admission) or _start_in_a_transaction(start, admission)
    crash_point("run_start.after_commit")
    return result


def _traced_start(span: Span, started: StartResult) -> None:
    span.set_attribute(tracing.RUN_ID, started.run_id)
    span.set_attribute(tracing.CREATED, started.created)
    if started.version_id is not None:
        span.set_attribute(tracing.VERSION_ID, started.version_id)
        span.set_attribute(tracing.VERSION, version_label(started.version_id)[1])


def _start_in_a_transaction(start: _Start, admission: dict[str, Any]) -> StartResult:
    """The start that could not go in one statement (nor be admitted in it): the lookup and
    the start in one transaction (one commit per start, not two), admitted first under the
    organisation's start quotas when one applies (quotas.admit_start, which counts the runs
    when the bound reached the quota), so no path, and no number of racing starts, passes
    the quota. Refused, a start whose key already started its run still answers with it."""
    try:
        with transaction.atomic(durable=True):
            if admission["admit"]:
                quotas.admit_start(start.org)
            return _start_as_last_seen(start) or _start_looked_up(start)
    except StartQuota as refused:
        quotas.remember_count(start.org, refused)
        existing = _already_started(start)
        if existing is None:
            raise
        return existing


def _already_started(start: _Start) -> StartResult | None:
    """The run this start's key started, if any (start_key_conflict if it is another
    start's); None when none did or the automation cannot say."""
    target = _LAST_SEEN.get(start.org.pk, start.slug)
    if target is None:
        try:
            target = _target(start.org, start.slug)
        except (UnknownAutomation, NoPublishedVersion):
            return None
    with connection.cursor() as cursor:
        cursor.execute(sql.EXISTING_RUN, {"org": start.org.pk, "key": start.key(target)})
        if fetch_dict(cursor) is None:
            return None
    return _existing(start, target)


def _start_looked_up(start: _Start) -> StartResult:
    """The start as the automation's current version, read now (and remembered)."""
    target = _guarded(start, _target(start.org, start.slug))
    _LAST_SEEN.remember(start.org.pk, start.slug, target)
    with connection.cursor() as cursor:
        inserted = query_prepared(cursor, sql.INSERT_RUN, start.row(target))
    return _started(start, target, inserted)


@dataclass(frozen=True)
class _Target:
    automation_id: int
    version_id: int
    definition: dict[str, Any]
    max_steps: int  # the definition's limits, read once per version seen (run_limits)
    max_age: float


@dataclass(frozen=True)
class _Start:
    """One start's request, as the run's row is built from it."""

    org: Organisation
    slug: str
    start_key: str | None
    run_input: Any
    canonical: str  # the input's canonical JSON (check_input made it)
    trace: str | None = None  # the start span's traceparent; None: untraced

    def key(self, target: _Target) -> str:
        """The start key: as given, or derived from the automation and the input's digest."""
        return self.start_key or f"{DERIVED_KEY_PREFIX}{target.automation_id}:{self.digest}"

    @cached_property
    def digest(self) -> str:
        """sha256 (hex) of the input's canonical JSON: the derived start key, and what tells
        a repeated start from a conflicting one."""
        return hashlib.sha256(self.canonical.encode()).hexdigest()

    @cached_property
    def stored_input(self) -> Any:
        """The input as the run stores it (its canonical JSON, read back): what a walk sees."""
        return json.loads(self.canonical)

    def row(self, target: _Target) -> dict[str, Any]:
        return {
            "org": self.org.pk, "automation": target.automation_id,
            "version": target.version_id, "key": self.key(target),
            "derived": self.start_key is None, "digest": self.digest,
            "max_steps": target.max_steps, "max_age": target.max_age,
            "input": Jsonb(self.run_input), "trace": self.trace,
        }  # fmt: skip


class _LastSeen:
    """The target each (organisation, automation slug) last started, per process. A start
    tries it first, guarded in its INSERT (sql.INSERT_RUN_IF_CURRENT): the automation's
    current version is still read in the start's transaction, in the same round trip as
    the insert, so a publish since then costs only the ordinary lookup, never a wrong run."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self.seen: dict[tuple[int, str], _Target] = {}
        self.lock = threading.Lock()

    def get(self, org_id: int, slug: str) -> _Target | None:
        return self.seen.get((org_id, slug))

    def remember(self, org_id: int, slug: str, target: _Target) -> None:
        with self.lock:
            if len(self.seen) >= self.size:
                self.seen.clear()  # bounded; the next starts look their targets up again
            self.seen[(org_id, slug)] = target

    def forget(self, org_id: int, slug: str) -> None:
        with self.lock:
            self.seen.pop((org_id, slug), None)


_LAST_SEEN = _LastSeen()

# What a start's version must pass before its run is written: each guard is called with the
# organisation, the version's definition and the run's input, and raises a WaymarkError to
# refuse the start. Code workflows register theirs (workflows/code: which organisations may
# run one, and the input its schema allows), which this module cannot import.
StartGuard = Callable[[Organisation, Mapping[str, Any], Any], None]
START_GUARDS: list[StartGuard] = []


def register_start_guard(guard: StartGuard) -> None:
    if guard not in START_GUARDS:
        START_GUARDS.append(guard)


def check_start_guards(org: Organisation, definition: Mapping[str, Any], run_input: Any) -> None:
    """Refuse (raise) what the start guards refuse: a start, or a re-run (a start for the
    organisation's limits too: services/rerun.py)."""
    for guard in START_GUARDS:
        guard(org, definition, run_input)


def check_startable(org: Organisation, automation: Any, run_input: Any) -> None:
    """Refuse (raise) what the start guards would refuse of a start of ``automation`` (an
    Automation of ``org``) with ``run_input`` now, on its current version; writes nothing.
    A schedule is checked so when it is made or changed, not only at each occurrence."""
    version_id = getattr(automation, "current_version_id", None)
    if version_id is not None:
        check_start_guards(org, definition_for(version_id), run_input)


def _guarded(start: _Start, target: _Target) -> _Target:
    check_start_guards(start.org, target.definition, start.run_input)
    return target


def _start_in_one_trip(start: _Start, admission: dict[str, Any]) -> StartResult | None:
    """The start as one statement (engine/starts.py), as the version this process last saw,
    admitted under the start quotas as ``admission`` says; None (no run written) when there
    is none to try, it is no longer current, the walk cannot go in one statement, or the
    statement could not admit it."""
    target = _LAST_SEEN.get(start.org.pk, start.slug)
    if target is None:
        return None
    _guarded(start, target)
    rows = start_in_one_trip(
        {**start.row(target), "slug": start.slug}, org_id=start.org.pk,
        version_id=target.version_id, run_input=start.stored_input,
        max_steps=target.max_steps, definition=target.definition, admission=admission,
    )  # fmt: skip
    if rows and not rows[0]["admitted"]:
        return None
    current = None if rows is None else _still_current(start, target, rows)
    if current is None:
        return None
    if current["id"] is None:
        return _existing(start, target)
    return StartResult(
        run_id=current["id"], created=True, status=RunStatus.RUNNING,
        start_key=start.key(target), version_id=target.version_id,
    )  # fmt: skip


def _start_as_last_seen(start: _Start) -> StartResult | None:
    """The start made as the version this process last saw, if that is still the current
    one; None (nothing written) when there is none to try or it is no longer current."""
    target = _LAST_SEEN.get(start.org.pk, start.slug)
    if target is None:
        return None
    _guarded(start, target)
    with connection.cursor() as cursor:
        params = {**start.row(target), "slug": start.slug}
        rows = query_prepared(cursor, sql.INSERT_RUN_IF_CURRENT, params)
    current = _still_current(start, target, rows)
    if current is None:
        return None
    inserted = [current] if current["id"] is not None else []
    return _started(start, target, inserted)


def _still_current(
    start: _Start, target: _Target, rows: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The answer of an INSERT guarded by the version last seen (INSERT_RUN_IF_CURRENT,
    START_RUN), if that version was still current; else None, and it is forgotten."""
    current = rows[0] if rows else None
    if current is None or (current["automation_id"], current["version_id"]) != (
        target.automation_id,
        target.version_id,
    ):
        _LAST_SEEN.forget(start.org.pk, start.slug)
        return None
    return current


def _target(org: Organisation, slug: str) -> _Target:
    """The automation's current version, read in the start's transaction; its definition
    comes from the process's cache (a published version never changes), so a start parses
    no definition and builds no ORM query."""
    with connection.cursor() as cursor:
        rows = query_prepared(cursor, sql.START_TARGET, {"org": org.pk, "slug": slug})
    row = rows[0] if rows else None
    if row is None:
        raise UnknownAutomation(slug=slug)
    if row["version_id"] is None:
        raise NoPublishedVersion(slug=slug)
    definition = definition_for(row["version_id"])
    max_steps, max_age = run_limits(definition)
    return _Target(row["automation_id"], row["version_id"], definition, max_steps, max_age)


def _existing(start: _Start, target: _Target) -> StartResult:
    """The run this start's key already started (maybe a concurrent duplicate that just
    won), if it is the same start."""
    key = start.key(target)
    with connection.cursor() as cursor:
        cursor.execute(sql.EXISTING_RUN, {"org": start.org.pk, "key": key})
        existing = fetch_dict(cursor)
    assert existing is not None
    # Start keys are unique per organisation: the same key for another automation, or with
    # another input, is a different start and must not return this run.
    if existing["automation_id"] != target.automation_id:
        raise StartKeyConflict(
            start_key=key, run_id=existing["id"], differs="of another automation"
        )
    if existing["input_digest"] != start.digest:
        raise StartKeyConflict(
            start_key=key, run_id=existing["id"], differs="with a different input"
        )
    return StartResult(
        run_id=existing["id"], created=False, status=existing["status"], start_key=key,
        version_id=existing["version_id"],
    )  # fmt: skip


def _started(start: _Start, target: _Target, inserted: list[dict[str, Any]]) -> StartResult:
    """After the run's INSERT: walk the new run on, or return the run its key started."""
    if not inserted:
        return _existing(start, target)
    key = start.key(target)
    with connection.cursor() as cursor:  # in run_start's transaction
        run_id, created_at = inserted[0]["id"], inserted[0]["created_at"]
        state = RunState(
            id=run_id, org_id=start.org.pk, version_id=target.version_id, status="running",
            input=start.stored_input, vars={}, outputs={},
            entered={}, steps_executed=0, max_steps=target.max_steps, expired=False,
            created_at=created_at,
        )  # fmt: skip
        walk = Walk(cursor, state, target.definition)
        walk.start()
        # The start's last writes: its COMMIT goes with them, one round trip for both, when
        # run_start's block is the outermost.
        walk.flush(commit=in_outermost_block())
    status = walk.finish[0] if walk.finish is not None else state.status
    return StartResult(
        run_id=run_id, created=True, status=status, start_key=key, version_id=target.version_id
    )
