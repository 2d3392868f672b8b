"""Starting runs: once per start key, atomically with their first steps and wake-ups."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from ..definitions.fields import parse_duration
from ..definitions.storable import UNSTORABLE_REASON, has_unstorable, unstorable_path
from ..definitions.validator import canonical_json
from ..engine import sql
from ..engine.definition_cache import definition_for
from ..engine.faults import crash_point
from ..engine.sql.rows import fetch_dict, query_prepared
from ..engine.walk import RunState, Walk
from ..errors import (
    InvalidInput,
    NoPublishedVersion,
    PayloadTooLarge,
    StartKeyConflict,
    UnknownAutomation,
)
from ..models import Organisation
from . import quotas

MAX_START_KEY = 255
DERIVED_KEY_PREFIX = "input:"  # keys the engine derives from the input; clients cannot use it


@dataclass(frozen=True)
class StartResult:
    run_id: int
    created: bool
    status: str  # the run's status as the start left it (a quick-only run may be finished)
    start_key: str  # as given, or derived from the input


def input_digest(run_input: Any) -> str:
    return hashlib.sha256(canonical_json(run_input).encode()).hexdigest()


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


def check_input(run_input: Any) -> None:
    """A run input: a JSON object within the limits (see check_json_value)."""
    if not isinstance(run_input, dict):
        raise InvalidInput(reason="input must be a JSON object")
    check_json_value(run_input, "input", "The run input")


def check_json_value(value: Any, field: str, what: str) -> None:
    """A JSON value from a client that is to be stored (a run input, a signal payload): not
    nested too deep, storable by PostgreSQL, within WAYMARK_MAX_INPUT_BYTES. ``field`` names
    it in messages, ``what`` in the size refusal."""
    if _depth(value) > MAX_INPUT_DEPTH:
        raise InvalidInput(reason=f"{field} nests deeper than {MAX_INPUT_DEPTH} levels")
    unstorable = unstorable_path(value)
    if unstorable is not None:
        raise InvalidInput(reason=f"{field}.{unstorable} {UNSTORABLE_REASON}")
    size = len(canonical_json(value).encode())
    limit = settings.WAYMARK["MAX_INPUT_BYTES"]
    if size > limit:
        raise PayloadTooLarge(what=what, size=size, limit=limit)


def _check_start_key(start_key: str) -> None:
    if not 1 <= len(start_key) <= MAX_START_KEY:
        raise InvalidInput(reason=f"start_key must be 1 to {MAX_START_KEY} characters")
    if has_unstorable(start_key):
        raise InvalidInput(reason=f"start_key {UNSTORABLE_REASON}")
    if start_key.startswith(DERIVED_KEY_PREFIX):
        raise InvalidInput(reason=f'start keys starting with "{DERIVED_KEY_PREFIX}" are reserved')


def _limits(definition: dict[str, Any]) -> tuple[int, float]:
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
    into one run (see docs/api.md). The same key with another input, or for another
    automation, is refused with start_key_conflict.
    """
    check_input(run_input)
    if start_key is not None:
        _check_start_key(start_key)
    digest = input_digest(run_input)
    quotas.check_running_runs(org)
    # One transaction for the lookup and the start: one commit per start, not two.
    with transaction.atomic(durable=True):
        target = _target(org, automation_slug)
        derived = start_key is None
        key = start_key or f"{DERIVED_KEY_PREFIX}{target.automation_id}:{digest}"
        result = _start(org, target, key, derived, run_input, digest)
    crash_point("run_start.after_commit")
    return result


@dataclass(frozen=True)
class _Target:
    automation_id: int
    version_id: int
    definition: dict[str, Any]


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
    return _Target(row["automation_id"], row["version_id"], definition_for(row["version_id"]))


def _start(
    org: Organisation,
    target: _Target,
    key: str,
    derived: bool,
    run_input: dict[str, Any],
    digest: str,
) -> StartResult:
    definition = target.definition
    max_steps, max_age = _limits(definition)
    with connection.cursor() as cursor:  # in run_start's transaction
        inserted = query_prepared(
            cursor,
            sql.INSERT_RUN,
            {
                "org": org.pk, "automation": target.automation_id,
                "version": target.version_id, "key": key,
                "derived": derived, "digest": digest, "max_steps": max_steps, "max_age": max_age,
                "input": Jsonb(run_input),
            },
        )  # fmt: skip
        if not inserted:
            # This key already started a run (maybe a concurrent duplicate that just won).
            cursor.execute(sql.EXISTING_RUN, {"org": org.pk, "key": key})
            existing = fetch_dict(cursor)
            assert existing is not None
            # Start keys are unique per organisation: the same key for another automation, or
            # with another input, is a different start and must not return this run.
            if (
                existing["input_digest"] != digest
                or existing["automation_id"] != target.automation_id
            ):
                raise StartKeyConflict(start_key=key, run_id=existing["id"])
            return StartResult(
                run_id=existing["id"], created=False, status=existing["status"], start_key=key
            )
        run_id, created_at = inserted[0]["id"], inserted[0]["created_at"]
        state = RunState(
            id=run_id, org_id=org.pk, version_id=target.version_id, status="running",
            input=json.loads(canonical_json(run_input)), vars={}, outputs={}, entered={},
            steps_executed=0, max_steps=max_steps, expired=False, created_at=created_at,
        )  # fmt: skip
        walk = Walk(cursor, state, definition)
        walk.start()
        walk.flush()
    status = walk.finish[0] if walk.finish is not None else state.status
    return StartResult(run_id=run_id, created=True, status=status, start_key=key)
