"""Signals: delivering them to waiting steps, exactly once.

- ``deliver`` stores the signal under its identity (a duplicate is recognised and changes
  nothing) and, in the same transaction, wakes the oldest step waiting for it: storing it,
  waking the step (``waits.wake_step``: the run walks on) and marking it consumed commit
  together. Nothing else sees the signal before its own delivery was tried, so the answer
  (consumed, by whom; or pending) is what happened, never a sweep's delivery of a signal
  it reported pending. A signal nobody waits for yet stays pending.
- A step entering a wait (``take_pending``, from the `wait_signal` step) takes the oldest
  pending signal meant for it in the walk's transaction, so a signal that came first is
  consumed when the run gets there.
- A signal and a wait that commit at the same moment can each miss the other; the sweep
  matches such pairs every tick (``LateMatching``), so that costs at most one tick: from
  the signals received since its previous pass (a pair that missed each other is that
  recent), with a full pass from every wait (``match_late``) when a sweeper begins and
  every ``FULL_PASS_SECONDS`` as well.
- Unmatched signals are dropped after ``SIGNAL_RETENTION_DAYS`` (``drop_old``); the row
  stays as the record, without its payload.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import connection, transaction

from ..definitions.validator import canonical_json
from . import sql
from .clock import database_now
from .faults import crash_point
from .lanes import engine_setting
from .sql.rows import fetch_dict, fetch_dicts, json_or_null
from .transient import log_failure
from .waits import Wake, wake_step

logger = logging.getLogger(__name__)

RECEIVED = "received"


@dataclass(frozen=True)
class Delivered:
    signal_id: int
    duplicate: bool  # this identity was delivered before: nothing changed now
    consumed_by: str  # "run/step/iteration" of the step that took it, or "" (pending)

    @property
    def taker_run_id(self) -> int | None:
        """The run of the step that took it; None while pending."""
        return taker_run_id(self.consumed_by)


def taker_run_id(consumed_by: str) -> int | None:
    """The run named by a signal's ``consumed_by`` ("run/step/iteration"); None for ""."""
    head = consumed_by.partition("/")[0]
    return int(head) if head.isdigit() else None


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
    admit_pending: Callable[[], None] | None = None,
) -> Delivered:
    """Store the signal (once per identity) and wake a step waiting for it, if any. ``also``:
    more correlation keys it answers (a step waiting on any of them takes it).
    ``admit_pending``: called in the signal's transaction when no step took it, before it is
    kept pending; what it raises rolls the signal back (the pending-signals quota).

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
    # Stored and delivered in one transaction: nothing else (the sweep's late matching, a wait
    # entering) can take the signal between the two, leaving this sender to answer "pending"
    # for a signal that another path consumed.
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        stored = _store_once(cursor, params, derived)
        if isinstance(stored, Delivered):
            return stored
        signal = {**params, "id": stored, "payload": payload}
        taker = _wake_a_waiter_now(signal)
        if not taker and admit_pending is not None:
            admit_pending()
        return Delivered(stored, False, taker)


def _store_once(cursor: Any, params: dict[str, Any], derived: bool) -> int | Delivered:
    """The new signal's id; or, for a duplicate, the first one as it stands (committed: a
    sender of the same identity waits here until the first's delivery committed)."""
    for _ in range(2):
        cursor.execute(sql.SIGNAL_INSERT, params)
        inserted = fetch_dict(cursor)
        if inserted is not None:
            return int(inserted["id"])
        cursor.execute(sql.SIGNAL_BY_IDENTITY, params)
        first = fetch_dict(cursor)
        assert first is not None
        spent = first["consumed_at"] is not None or first["dropped_at"] is not None
        if not (derived and spent and first["past_dedup"]):
            return Delivered(first["id"], True, first["consumed_by"])
        cursor.execute(sql.SIGNAL_RETIRE_IDENTITY, {"id": first["id"]})
    raise AssertionError("a retired identity was taken again in the same transaction")


def _wake_a_waiter_now(signal: dict[str, Any]) -> str:
    """In the transaction that stored the signal, which nobody else sees yet: wake the oldest
    step waiting for it, the signal consumed in the round trip of the walk's writes. The step
    it woke ("run/step/iteration"), or "" when none waits. Should waking fail (an engine
    error, a deadlock), the savepoint keeps the signal stored, pending: the sweep tries again
    next tick."""
    try:
        with transaction.atomic():  # a savepoint
            for waiter in _waiters(signal):
                taker = _taker(waiter)
                consume = (sql.SIGNAL_CONSUMED, {"id": signal["id"], "by": taker})
                if wake_step(step_pk=waiter["id"], wake=_wake(signal), run_id=waiter["run_id"],
                             also=[consume]):  # fmt: skip
                    return taker
    except Exception as exc:
        log_failure(logger, exc, "delivering signal %s failed: it stays pending", signal["id"])
    return ""


def _wake_a_waiter_late(signal: dict[str, Any]) -> str:
    """The sweep's delivery of a stored signal (visible to every consumer now): consume it and
    wake the oldest step waiting for it in one transaction per try. The step it woke, or ""
    when none waits or a wait entering took it first."""
    for waiter in _waiters(signal):
        taker = _taker(waiter)
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            # The signal first (the one order every consumer takes), then the run and step.
            cursor.execute(sql.SIGNAL_CONSUMED, {"id": signal["id"], "by": taker})
            if cursor.fetchone() is None:
                return ""  # consumed meanwhile (a wait took it as it entered)
            if wake_step(step_pk=waiter["id"], wake=_wake(signal), run_id=waiter["run_id"]):
                crash_point("signal.after_consume")  # consumed and woken, not committed
                return taker
            transaction.set_rollback(True)  # that step stopped waiting: try the next
    return ""


def _waiters(signal: dict[str, Any]) -> list[sql.SignalWaiterRow]:
    """The steps waiting for this signal, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(sql.SIGNAL_WAITERS, signal)
        return cast(list[sql.SignalWaiterRow], fetch_dicts(cursor))


def _taker(waiter: sql.SignalWaiterRow) -> str:
    return f"{waiter['run_id']}/{waiter['step_id']}/{waiter['iteration']}"


def _wake(signal: dict[str, Any]) -> Wake:
    by = f"signal:{signal['identity']}"[:100]
    return Wake(outcome=RECEIVED, output=_output(signal), reason="signal", by=by)


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
    consumed = cursor.fetchone() is not None
    if consumed:
        crash_point("signal.after_consume")  # in the walk's transaction, not committed
    return signal if consumed else None


def match_late(*, limit: int = 200) -> int:
    """The sweep's full backstop: deliver pending signals that any waiting step matches. It
    only sees signals whose sender's own delivery has committed (``deliver``), so it never
    takes one its sender is still delivering and would report pending."""
    with connection.cursor() as cursor:
        cursor.execute(sql.SIGNALS_MATCHED_LATE, {"n": limit})
        late = fetch_dicts(cursor)
    return _deliver_late(late)[0]


def _deliver_late(late: list[dict[str, Any]]) -> tuple[int, bool]:
    """Deliver each signal found late; how many were taken, and whether any delivery failed."""
    matched, failed = 0, False
    for signal in late:
        try:
            matched += bool(_wake_a_waiter_late(signal))
        except Exception as exc:
            failed = True
            log_failure(logger, exc, "matching signal %s failed", signal["id"])
    return matched, failed


# A signal and a wait miss each other only when their transactions overlap, so a pair that
# did has a signal received no earlier than both transactions' length before the pass that
# missed it began. Every transaction that delivers a signal or parks a wait is a few
# statements, each bounded by the connection's statement and lock timeouts: five minutes is
# far more than two of them. A full pass now and then covers whatever this reasoning misses:
# a wait that locked an old signal to take it and then rolled back for good (its run
# cancelled meanwhile) while another wait for the key entered, skipped it and parked.
LATE_MARGIN = timedelta(minutes=5)
FULL_PASS_SECONDS = 600.0


class LateMatching:
    """The sweep's late matching, kept by the sweeper from tick to tick: a full pass first
    (and every FULL_PASS_SECONDS), then only the signals received since the previous complete
    pass began, less LATE_MARGIN. A pass that filled its batch, or whose delivery failed,
    leaves the mark where it was, so the next one reads those signals again."""

    def __init__(self) -> None:
        self.since: datetime | None = None
        self.next_full = 0.0

    def run(self, *, limit: int = 200) -> int:
        full = self.since is None or time.monotonic() >= self.next_full
        began = database_now()
        with connection.cursor() as cursor:
            if full:
                cursor.execute(sql.SIGNALS_MATCHED_LATE, {"n": limit})
            else:
                cursor.execute(sql.SIGNALS_MATCHED_SINCE, {"n": limit, "since": self.since})
            late = fetch_dicts(cursor)
        matched, failed = _deliver_late(late)
        if failed or len(late) >= limit:
            return matched
        self.since = began - LATE_MARGIN
        if full:
            self.next_full = time.monotonic() + FULL_PASS_SECONDS
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
