"""Signals: delivering them to waiting steps, exactly once.

- ``deliver`` stores the signal under its identity (a duplicate is recognised and changes
  nothing), then, in a second transaction, wakes the oldest step waiting for it: waking the
  step (``waits.wake_step``: the run walks on) and marking the signal consumed commit
  together. A signal nobody waits for yet stays pending.
- A step entering a wait (``take_pending``, from the `wait_signal` step) takes the oldest
  pending signal meant for it in the walk's transaction, so a signal that came first is
  consumed when the run gets there.
- A signal and a wait that commit at the same moment can each miss the other; the sweep
  matches such pairs every tick (``match_late``), so that costs at most one tick.
- Unmatched signals are dropped after ``SIGNAL_RETENTION_DAYS`` (``drop_old``); the row
  stays as the record, without its payload.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from ..definitions.validator import canonical_json
from . import sql
from .lanes import engine_setting
from .sql.rows import fetch_dict, fetch_dicts, json_or_null
from .waits import Wake, wake_step

logger = logging.getLogger(__name__)

RECEIVED = "received"


@dataclass(frozen=True)
class Delivered:
    signal_id: int
    duplicate: bool  # this identity was delivered before: nothing changed now
    consumed_by: str  # "run/step/iteration" of the step that took it, or "" (pending)


def identity_of(name: str, correlation: str, run_id: int | None, payload: Any) -> str:
    """A signal without an id of its own is identified by its content: the same content
    twice is one signal (a retried webhook)."""
    content = canonical_json({"name": name, "correlation": correlation, "run": run_id,
                              "payload": payload})  # fmt: skip
    return "sha256:" + hashlib.sha256(content.encode()).hexdigest()


def deliver(
    *,
    org_id: int,
    name: str,
    correlation: str = "",
    payload: Any = None,
    identity: str | None = None,
    run_id: int | None = None,
    source: str = "api",
    also: Sequence[str] = (),
) -> Delivered:
    """Store the signal (once per identity) and wake a step waiting for it, if any. ``also``:
    more correlation keys it answers (a step waiting on any of them takes it).

    A signal identified by its content (no ``identity`` given) is a duplicate only while the
    first is pending or recent (``SIGNAL_DEDUP_SECONDS``): the same content a week later is
    a new signal for whatever waits then."""
    derived = identity is None
    correlations = list(dict.fromkeys([correlation, *also]))
    params: dict[str, Any] = {
        "org_id": org_id, "name": name, "correlation": correlation, "run_id": run_id,
        "identity": identity or identity_of(name, correlation, run_id, payload),
        "payload": json_or_null(payload), "source": source, "correlations": correlations,
        "dedup": float(engine_setting("SIGNAL_DEDUP_SECONDS")),
    }  # fmt: skip
    for _ in range(2):
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql.SIGNAL_INSERT, params)
            inserted = fetch_dict(cursor)
            if inserted is not None:
                break
            cursor.execute(sql.SIGNAL_BY_IDENTITY, params)
            first = fetch_dict(cursor)
            assert first is not None
            spent = first["consumed_at"] is not None or first["dropped_at"] is not None
            if not (derived and spent and first["past_dedup"]):
                return Delivered(first["id"], True, first["consumed_by"])
            cursor.execute(sql.SIGNAL_RETIRE_IDENTITY, {"id": first["id"]})
    assert inserted is not None
    signal = {**params, "id": inserted["id"], "payload": payload}
    return Delivered(inserted["id"], False, _wake_a_waiter(signal))


def _wake_a_waiter(signal: dict[str, Any]) -> str:
    """Give the signal to the oldest step waiting for it: wake and consume in one
    transaction. The step it woke ("run/step/iteration"), or "" when none waits."""
    with connection.cursor() as cursor:
        cursor.execute(sql.SIGNAL_WAITERS, signal)
        waiters = fetch_dicts(cursor)
    for waiter in waiters:
        taker = f"{waiter['run_id']}/{waiter['step_id']}/{waiter['iteration']}"
        by = f"signal:{signal['identity']}"[:100]
        wake = Wake(outcome=RECEIVED, output=_output(signal), reason="signal", by=by)
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            # The signal first (the one order every consumer takes), then the run and step.
            cursor.execute(sql.SIGNAL_CONSUMED, {"id": signal["id"], "by": taker})
            if cursor.fetchone() is None:
                return ""  # consumed meanwhile (a wait took it as it entered)
            if wake_step(step_pk=waiter["id"], wake=wake):
                return taker
            transaction.set_rollback(True)  # that step stopped waiting: try the next
    return ""


def take_pending(
    cursor: Any, *, org_id: int, run_id: int, name: str, correlation: str, taker: str
) -> dict[str, Any] | None:
    """Inside the walk entering a wait: the oldest pending signal for it, consumed now."""
    params = {"org_id": org_id, "name": name, "correlation": correlation, "run_id": run_id}
    cursor.execute(sql.PENDING_SIGNAL_FOR, params)
    signal = fetch_dict(cursor)
    if signal is None:
        return None
    cursor.execute(sql.SIGNAL_CONSUMED, {"id": signal["id"], "by": taker})
    return signal if cursor.fetchone() is not None else None


def match_late(*, limit: int = 200) -> int:
    """The sweep's backstop: deliver pending signals that a waiting step now matches."""
    with connection.cursor() as cursor:
        cursor.execute(sql.SIGNALS_MATCHED_LATE, {"n": limit})
        late = fetch_dicts(cursor)
    matched = 0
    for signal in late:
        try:
            matched += bool(_wake_a_waiter(signal))
        except Exception:
            logger.exception("matching signal %s failed", signal["id"])
    return matched


def drop_old() -> int:
    """Drop unmatched signals past retention (the row stays as the record)."""
    age = float(engine_setting("SIGNAL_RETENTION_DAYS")) * 86_400
    if age <= 0:
        return 0
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.SIGNALS_DROP_OLD, {"age": age})
        return int(cursor.rowcount)


def _output(signal: dict[str, Any]) -> dict[str, Any]:
    return {"signal": signal["name"], "payload": signal["payload"],
            "identity": signal["identity"]}  # fmt: skip
