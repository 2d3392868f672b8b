"""The effect ledger: every outside call goes through ``run_effect``.

At least once, made idempotent. The effect is claimed under its key (``run/step/iteration``)
*before* the call, in the same database as the run, with a lease and an owner token of its
own (not the step's); the answer is stored after. So:

- a settled effect returns its stored answer and is never called again;
- a live in-flight effect (another attempt's call may be under way) is never overlapped:
  the step waits until that lease ends (a deferral: no attempt spent);
- an in-flight effect whose lease lapsed, or a call that failed ambiguously, is
  ``outcome_unknown``, and is reconciled before anything is called again: looked up at the
  provider (found: settled with it; not there: called again), or repeated with the same key
  when the provider honours keys and still remembers it, or repeated when the call makes
  nothing outside (``repeatable``); otherwise parked as ``needs_review`` for a person, with
  what is known. Uncertainty is never permission to make a fresh effect.

The connection's gate (broken, circuit breaker, concurrency cap) is passed in the same
transaction that begins a call, under the connection's row lock.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from workflows.engine.executors import Park, StepContext, StepDeferred, StepFailure, StepResult
from workflows.engine.faults import crash_point
from workflows.engine.sql.rows import event_row, fetch_dict, insert_events, json_or_null

from . import sql
from .providers.base import (
    Answer,
    AuthFailed,
    CallError,
    ConnectionInfo,
    KeyInUse,
    Provider,
    RateLimited,
    Request,
)
from .states import EffectState, sources

logger = logging.getLogger(__name__)


def effects_setting(name: str) -> Any:
    return settings.EFFECTS[name]


@dataclass(frozen=True)
class Call:
    """One effect call: who makes it, through what, with what."""

    ctx: StepContext
    provider: Provider
    conn: ConnectionInfo | None
    request: Request

    @property
    def key(self) -> str:
        return self.ctx.effect_key

    @property
    def lease(self) -> float:
        timeout = self.conn.timeout_seconds if self.conn else 30.0
        return timeout + float(effects_setting("LEASE_MARGIN_SECONDS"))


class ParkStep(Exception):
    """The step must wait for a person (a review, a repaired connection, a budget)."""

    def __init__(self, park: Park) -> None:
        super().__init__(park.detail.get("reason", "parked"))
        self.park = park


def run_effect(call: Call) -> StepResult:
    """Make the effect of ``call`` at most once per key, as far as the provider allows; return
    the step's result (the stored answer on every repeat)."""
    try:
        answer = _effect(call)
    except ParkStep as parked:
        return StepResult(park=parked.park)
    return StepResult(output=answer.result, outcome="ok")


def _effect(call: Call) -> Answer:
    effect = _claim_or_read(call)
    state = effect["state"]
    if state == EffectState.SETTLED:
        return Answer(effect["result"])
    if state == EffectState.NEEDS_REVIEW:
        raise ParkStep(_review_park(effect))
    if state == EffectState.OUTCOME_UNKNOWN:
        effect = _reconcile(call, effect)
        if effect["state"] == EffectState.SETTLED:
            return Answer(effect["result"])
    return _make_call(call, effect)


# --- claiming ---------------------------------------------------------------------------------


def _claim_or_read(call: Call) -> dict[str, Any]:
    """The effect under the key: newly claimed in flight (the caller calls), or as it stands.

    One transaction: the connection's gate and the claim commit together."""
    ctx = call.ctx
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.LOCK_EFFECT, {"org_id": ctx.org_id, "key": call.key})
        effect = fetch_dict(cursor)
        if effect is not None and effect["state"] == EffectState.IN_FLIGHT:
            if not effect["lease_lapsed"]:
                # Another attempt may be calling now: never overlap it.
                raise StepDeferred(
                    max(effect["lease_seconds_left"], effects_setting("DEFER_SECONDS")),
                    f"effect {call.key} is in flight in another attempt; waiting for it",
                )
            cursor.execute(sql.LAPSED_TO_UNKNOWN, {"id": effect["id"]})
            why = "the attempt that held it stopped before it recorded an answer"
            _event(cursor, ctx, "effect.outcome_unknown", {"key": call.key, "why": why})
            effect["state"] = EffectState.OUTCOME_UNKNOWN
        if effect is not None and effect["state"] != EffectState.FAILED:
            return effect
        # A first call, or a call again after the provider refused: through the gate.
        _gate(cursor, call)
        return _begin(cursor, call, effect)


def _begin(cursor: Any, call: Call, effect: dict[str, Any] | None) -> dict[str, Any]:
    ctx = call.ctx
    params = {
        "token": secrets.token_hex(16), "owner": f"{ctx.lane}:{ctx.run_id}:{ctx.attempt}",
        "step_attempt": ctx.attempt, "lease": call.lease,
        "request": json_or_null(dict(call.request.summary)),
        "reserved_cost": call.request.reserve,
    }  # fmt: skip
    if effect is None:
        cursor.execute(sql.INSERT_IN_FLIGHT, {
            **params, "org_id": ctx.org_id, "run_id": ctx.run_id, "step_id": ctx.step_id,
            "iteration": ctx.iteration, "key": call.key, "provider": call.provider.name,
            "connection_id": call.conn.id if call.conn else None,
        })  # fmt: skip
    else:
        sources_ = sources(EffectState.IN_FLIGHT)
        cursor.execute(sql.BEGIN_AGAIN, {**params, "id": effect["id"], "sources": sources_})
    begun = fetch_dict(cursor)
    if begun is None:
        # Another attempt claimed the key between our read and our write (a unique-key
        # conflict or a state change): look again later rather than guess.
        raise StepDeferred(effects_setting("DEFER_SECONDS"), f"effect {call.key} was taken")
    _reserve_budget(cursor, call, held=effect["reserved_cost"] if effect else Decimal(0))
    return begun


def _gate(cursor: Any, call: Call) -> None:
    """Broken connection: park. Open circuit, a probe under way, or the concurrency cap
    reached: defer (no attempt spent). A closed circuit past its cool-down: this call is the
    probe."""
    if call.conn is None or call.conn.id is None:
        return
    cursor.execute(sql.LOCK_CONNECTION, {"connection_id": call.conn.id})
    gate = fetch_dict(cursor)
    if gate is None:
        raise StepFailure(f"connection {call.conn.name!r} was deleted", retryable=False,
                          error_class="unknown_connection")  # fmt: skip
    if gate["status"] == "broken":
        raise ParkStep(_broken_park(call, gate["broken_reason"]))
    defer = effects_setting("DEFER_SECONDS")
    if gate["circuit"] != "closed" and gate["circuit_waiting"]:
        what = "open" if gate["circuit"] == "open" else "being probed"
        raise StepDeferred(max(defer, gate["circuit_seconds"]),
                           f"the circuit of connection {call.conn.name!r} is {what}")  # fmt: skip
    if gate["in_flight"] >= gate["max_concurrency"]:
        raise StepDeferred(
            max(defer, min(gate["first_free_seconds"] or defer, 30.0)),
            f"connection {call.conn.name!r} is at its concurrency cap "
            f"({gate['max_concurrency']} calls in flight)",
        )
    if gate["circuit"] != "closed":  # its cool-down has passed: one probe goes through
        cursor.execute(sql.CIRCUIT_PROBE, {"connection_id": call.conn.id, "lease": call.lease})


def _reserve_budget(cursor: Any, call: Call, held: Decimal) -> None:
    """Reserve the call's allowed cost against the organisation's model budget. ``held`` is
    what the effect already holds (an unknown outcome keeps its reservation): only the
    difference is reserved again. A budgeted provider's call with nothing to reserve still
    needs budget left."""
    if not call.provider.budgeted and call.request.reserve <= 0:
        return
    amount = max(Decimal(0), call.request.reserve - held)
    params = {"org_id": call.ctx.org_id, "amount": amount}
    cursor.execute(sql.RESERVE_BUDGET, params)
    if cursor.fetchone() is not None:
        return
    cursor.execute(sql.HAS_BUDGET, params)
    if cursor.fetchone() is None:
        return  # no budget set for the organisation: no limit
    # Exhausted: this transaction (and its claim) rolls back; the step parks until raised.
    raise ParkStep(Park(
        deadline_seconds=effects_setting("PARK_SECONDS"), refund_attempt=True,
        detail={"parked_on": f"budget:{call.ctx.org_id}",
                "reason": "the organisation's model budget is exhausted: raise it to go on",
                "reserve": str(call.request.reserve)},
    ))  # fmt: skip


# --- reconciling ------------------------------------------------------------------------------


def _reconcile(call: Call, effect: dict[str, Any]) -> dict[str, Any]:
    """An outcome_unknown effect, before anything is called again: settled from the
    provider's record, or begun again when that is safe, or parked for a person."""
    provider, conn = call.provider, call.conn
    if provider.supports_lookup(conn):
        found = _lookup(call)
        if found is not None:
            _settle_found(call, effect, found, by="reconcile")
            return {**effect, "state": EffectState.SETTLED, "result": found.result}
        return _begin_again(call, effect, "lookup found nothing under the key")
    retention = provider.retention(conn)
    fresh = retention is None or (effect["age_seconds"] or 0) < retention
    if provider.supports_key(conn) and fresh:
        return _begin_again(call, effect, "the provider honours the key: repeating it")
    if provider.repeatable:
        return _begin_again(call, effect, "the call makes nothing outside: asking again")
    why = (
        "the provider may have forgotten the key (first attempt "
        f"{effect['age_seconds']:.0f} s ago, kept {retention:.0f} s)"
        if provider.supports_key(conn) and retention is not None
        else "the provider has neither idempotency keys nor a lookup"
    )
    _to_review(call, effect, f"outcome unknown and {why}: a person must decide")
    raise ParkStep(_review_park({**effect, "error": why}))


def _lookup(call: Call) -> Answer | None:
    try:
        return call.provider.lookup(call.request, call.key, call.conn)
    except AuthFailed as exc:
        # The credentials cannot even read: the connection is broken, the step parks.
        _mark_broken(call, exc)
        raise _step_failure(call, exc) from exc
    except CallError as exc:
        # Cannot tell yet: the effect stays outcome_unknown and the step tries again later
        # (after the provider's Retry-After, when it gave one).
        retry_after = exc.retry_after if isinstance(exc, RateLimited) else None
        raise StepFailure(f"reconciling effect {call.key}: {exc}", retry_after=retry_after,
                          error_class=exc.error_class) from exc  # fmt: skip


def _mark_broken(call: Call, exc: AuthFailed) -> None:
    if call.conn is None or call.conn.id is None:
        return
    reason = f"reconnect {call.conn.name}: {exc}"[:500]
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.CONNECTION_BROKEN, {"connection_id": call.conn.id, "reason": reason})
        _event(cursor, call.ctx, "connection.broken", {"connection": call.conn.name,
                                                        "reason": reason})  # fmt: skip


def _begin_again(call: Call, effect: dict[str, Any], why: str) -> dict[str, Any]:
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        _gate(cursor, call)
        begun = _begin(cursor, call, effect)
        _event(cursor, call.ctx, "effect.reconciled", {"key": call.key, "action": why})
    return begun


def _settle_found(call: Call, effect: dict[str, Any], found: Answer, *, by: str) -> None:
    params: dict[str, Any] = {
        "id": effect["id"], "result": json_or_null(found.result), "by": by,
        "sources": [EffectState.OUTCOME_UNKNOWN.value],
    }  # fmt: skip
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.SETTLE_FOUND, params)
        if cursor.fetchone() is not None:
            _release_budget(cursor, call, effect["reserved_cost"], spent=found.cost)
            action = "found at the provider: settled with it"
            _event(cursor, call.ctx, "effect.reconciled", {"key": call.key, "action": action})


def _to_review(call: Call, effect: dict[str, Any], why: str) -> None:
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        params = {"id": effect["id"], "error": why, "sources": sources(EffectState.NEEDS_REVIEW)}
        cursor.execute(sql.TO_REVIEW, params)
        if cursor.fetchone() is not None:
            _event(cursor, call.ctx, "effect.needs_review", {"key": call.key, "why": why})


# --- calling ----------------------------------------------------------------------------------


def _make_call(call: Call, effect: dict[str, Any]) -> Answer:
    """Call the provider under the effect claimed for this attempt, and record how it ended."""
    token = effect["token"]
    crash_point("effect.before_call")
    started = time.monotonic()
    try:
        answer = call.provider.call(call.request, call.key, call.conn)
    except CallError as exc:
        crash_point("effect.after_answer")
        _record_failure(call, effect, exc)
        raise _step_failure(call, exc) from exc
    except Exception as exc:
        # A bug in a provider, or an error nobody classified: the request may have left.
        logger.exception("effect %s: provider %s raised", call.key, call.provider.name)
        unknown = CallError(f"{type(exc).__name__}: {exc}")
        _record_failure(call, effect, unknown)
        raise _step_failure(call, unknown) from exc
    crash_point("effect.after_answer")
    _record_answer(call, effect, token, answer, time.monotonic() - started)
    return answer


def _record_answer(
    call: Call, effect: dict[str, Any], token: str, answer: Answer, seconds: float
) -> None:
    params: dict[str, Any] = {
        "id": effect["id"], "token": token, "result": json_or_null(answer.result),
        "response": json_or_null(dict(answer.response) if answer.response else None),
        "cost": answer.cost,
        "sources": [EffectState.IN_FLIGHT.value, EffectState.OUTCOME_UNKNOWN.value],
    }  # fmt: skip
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.SETTLE, params)
        if cursor.fetchone() is None:
            # Another attempt took the key over after our lease lapsed; it owns the ledger now.
            logger.warning("effect %s: answered after another attempt took it over", call.key)
            return
        _release_budget(cursor, call, effect["reserved_cost"], spent=answer.cost)
        if call.conn is not None and call.conn.id is not None:
            cursor.execute(sql.CIRCUIT_SUCCESS, {"connection_id": call.conn.id})
        detail = {"key": call.key, "calls": effect["calls"], "seconds": round(seconds, 3)}
        _event(cursor, call.ctx, "effect.settled", detail)


def _record_failure(call: Call, effect: dict[str, Any], exc: CallError) -> None:
    state = EffectState.FAILED if exc.made == "no" else EffectState.OUTCOME_UNKNOWN
    params: dict[str, Any] = {
        "id": effect["id"], "token": effect["token"], "state": state.value,
        "error": str(exc)[:2000], "response": json_or_null(exc.response),
        "sources": [EffectState.IN_FLIGHT.value],
    }  # fmt: skip
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.END_ATTEMPT, params)
        if cursor.fetchone() is None:
            return  # taken over meanwhile: the newer attempt records its own ending
        if state == EffectState.FAILED:
            _release_budget(cursor, call, effect["reserved_cost"], spent=None)
        conn_id = call.conn.id if call.conn else None
        if conn_id is not None and exc.counts_against_circuit:
            cursor.execute(sql.CIRCUIT_FAILURE, {
                "connection_id": conn_id, "threshold": effects_setting("CIRCUIT_FAILURES"),
                "cooldown": effects_setting("CIRCUIT_COOLDOWN_SECONDS"),
            })  # fmt: skip
        kind = "effect.failed" if state == EffectState.FAILED else "effect.outcome_unknown"
        _event(cursor, call.ctx, kind, {"key": call.key, "error": str(exc)[:500],
                                       "class": exc.error_class})  # fmt: skip
    if isinstance(exc, AuthFailed):
        _mark_broken(call, exc)


def _step_failure(call: Call, exc: CallError) -> Exception:
    """What the step does after a call that did not answer."""
    if isinstance(exc, AuthFailed):
        reason = f"reconnect {call.conn.name!r}: {exc}" if call.conn else str(exc)
        return ParkStepFailure(_broken_park(call, reason))
    retry_after = exc.retry_after if isinstance(exc, RateLimited) else None
    if isinstance(exc, KeyInUse):
        retry_after = effects_setting("DEFER_SECONDS")
    return StepFailure(str(exc), retryable=exc.retryable, retry_after=retry_after,
                       error_class=exc.error_class)  # fmt: skip


class ParkStepFailure(ParkStep):
    """ParkStep raised from the call's failure (for ``raise ... from``)."""


# --- parks --------------------------------------------------------------------------------------


def _broken_park(call: Call, reason: str) -> Park:
    assert call.conn is not None
    return Park(
        deadline_seconds=effects_setting("PARK_SECONDS"), refund_attempt=True,
        detail={"parked_on": f"connection:{call.conn.id}", "connection": call.conn.name,
                "reason": reason or f"reconnect {call.conn.name}"},
    )  # fmt: skip


def _review_park(effect: Mapping[str, Any]) -> Park:
    return Park(
        deadline_seconds=effects_setting("PARK_SECONDS"), refund_attempt=True,
        detail={"parked_on": f"effect:{effect['id']}", "effect": effect["key"],
                "reason": f"effect needs review: {effect.get('error') or 'outcome unknown'}"},
    )  # fmt: skip


# --- small helpers --------------------------------------------------------------------------


def _release_budget(cursor: Any, call: Call, reserved: Decimal, *, spent: Decimal | None) -> None:
    if reserved or spent:
        cursor.execute(sql.SETTLE_BUDGET, {"org_id": call.ctx.org_id, "reserved": reserved,
                                           "spent": spent or Decimal(0)})  # fmt: skip


def _event(cursor: Any, ctx: StepContext, kind: str, detail: Mapping[str, Any]) -> None:
    insert_events(cursor, [event_row(
        ctx.org_id, ctx.run_id, kind, ctx.step_id, iteration=ctx.iteration,
        attempt=ctx.attempt, worker=f"{ctx.lane}", detail=dict(detail),
    )])  # fmt: skip
