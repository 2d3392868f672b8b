"""Starting runs: once per start key, atomically with their first steps and wake-ups."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from ..definitions.validator import canonical_json, parse_duration
from ..engine.faults import crash_point
from ..engine.walk import RunState, Walk
from ..errors import InvalidInput, NoPublishedVersion, PayloadTooLarge, StartKeyConflict
from ..models import Automation, Organisation
from ..selectors import automation_get

MAX_START_KEY = 255

INSERT_RUN = """
INSERT INTO workflows_run
    (org_id, automation_id, version_id, start_key, start_key_derived, input, input_digest,
     status, vars, outputs, entered, error, steps_executed, max_steps, deadline_at, created_at)
VALUES (%(org)s, %(automation)s, %(version)s, %(key)s, %(derived)s, %(input)s, %(digest)s,
        'running', '{}', '{}', '{}', '', 0, %(max_steps)s,
        now() + make_interval(secs => %(max_age)s), now())
ON CONFLICT (org_id, start_key) DO NOTHING
RETURNING id, created_at
"""

EXISTING_RUN = """
SELECT id, input_digest FROM workflows_run WHERE org_id = %(org)s AND start_key = %(key)s
"""


@dataclass(frozen=True)
class StartResult:
    run_id: int
    created: bool


def input_digest(run_input: Any) -> str:
    import hashlib

    return hashlib.sha256(canonical_json(run_input).encode()).hexdigest()


def _check_input(run_input: Any) -> None:
    if not isinstance(run_input, dict):
        raise InvalidInput(reason="input must be a JSON object")
    size = len(canonical_json(run_input).encode())
    limit = settings.WAYMARK["MAX_INPUT_BYTES"]
    if size > limit:
        raise PayloadTooLarge(what="The run input", size=size, limit=limit)


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

    Without a start key the canonical input's digest is the key: two separate triggers with
    identical input then collapse into one run (see docs/api.md). The same key with another
    input is refused with start_key_conflict.
    """
    _check_input(run_input)
    digest = input_digest(run_input)
    derived = start_key is None
    key = f"input:{digest}" if start_key is None else start_key
    if not key or len(key) > MAX_START_KEY:
        raise InvalidInput(reason=f"start_key must be 1 to {MAX_START_KEY} characters")
    automation = automation_get(org=org, slug=automation_slug)
    version = automation.current_version
    if version is None:
        raise NoPublishedVersion(slug=automation_slug)
    result = _start(org, automation, version.id, version.definition, key, derived, run_input)
    crash_point("run_start.after_commit")
    return result


def _start(
    org: Organisation,
    automation: Automation,
    version_id: int,
    definition: dict[str, Any],
    key: str,
    derived: bool,
    run_input: dict[str, Any],
) -> StartResult:
    digest = input_digest(run_input)
    max_steps, max_age = _limits(definition)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            INSERT_RUN,
            {
                "org": org.pk, "automation": automation.pk, "version": version_id, "key": key,
                "derived": derived, "input": Jsonb(run_input), "digest": digest,
                "max_steps": max_steps, "max_age": max_age,
            },
        )  # fmt: skip
        row = cursor.fetchone()
        if row is None:
            # This key already started a run (maybe a concurrent duplicate that just won).
            cursor.execute(EXISTING_RUN, {"org": org.pk, "key": key})
            run_id, existing_digest = cursor.fetchone()
            if existing_digest != digest:
                raise StartKeyConflict(start_key=key, run_id=run_id)
            return StartResult(run_id=run_id, created=False)
        run_id, created_at = row
        state = RunState(
            id=run_id, org_id=org.pk, version_id=version_id, status="running",
            input=json.loads(canonical_json(run_input)), vars={}, outputs={}, entered={},
            steps_executed=0, max_steps=max_steps, expired=False, created_at=created_at,
        )  # fmt: skip
        walk = Walk(cursor, state, definition)
        walk.start()
        walk.flush()
    return StartResult(run_id=run_id, created=True)
