"""The effect ledger: every outside call goes through ``run_effect``.

At least once, made idempotent. The effect is claimed under its key (``run/step/iteration``)
*before* the call, in the same database as the run, with a lease and an owner token of its
own (not the step's); the answer is stored after. So:

- a settled effect returns its stored answer and is never called again;
- a live in-flight effect (another attempt's call may be under way) is never overlapped:
  the step waits until that lease ends (a deferral: no attempt spent). A call under way
  keeps its effect's lease renewed, so a slow provider is not mistaken for a dead attempt;
- an in-flight effect whose lease lapsed, or a call that failed ambiguously, is
  ``outcome_unknown``, and is reconciled before anything is called again: looked up at the
  provider (found: settled with it; not there, once the provider has had time to finish
  what it was sent: called again), or repeated with the same key when the provider honours
  keys and still remembers it, or repeated when the call makes nothing outside
  (``repeatable``); otherwise parked as ``needs_review`` for a person, with what is known.
  Uncertainty is never permission to make a fresh effect.

The connection's gate (broken, circuit breaker, concurrency cap), the consent check and the
budget reservation are passed in the same transaction that begins a call. Lock order
everywhere: the connection's row, then the effect's.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from workflows.plugins import Park, StepContext, StepDeferred, StepFailure, StepResult
from workflows.plugins.engine import (
    crash_point,
    engine_setting,
    event_row,
    fetch_dict,
    insert_events,
    is_transient,
    json_or_null,
    log_failure,
    own_connection,
    tracing_on,
)

from . import sql
from .consent import suppression
from .limits import operator_limit
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
from .reruns import reused_effect
from .states import EffectState, sources
from .traces import provider_called, traced_effect

logger = logging.getLogger(__name__)

LOOKUP_FAILURES_BEFORE_REVIEW = 5
# The most of a call's error an effect keeps (as much as the engine keeps of a step's).
MAX_ERROR_CHARS = 2000
SUPPRESSED = "suppressed"
# A person chose "retry", and before the retry began the first call's answer arrived (or a
# lookup found what it made): what arrived wins, and the effect and its history say so.
RETRY_NOT_SENT = ("the first call's answer arrived before the retry a person chose was "
                  "sent: the retry was not sent")  # fmt: skip
RETRY_FOUND = ("a lookup found the first call made before the retry a person chose was "
               "sent: the retry was not sent")  # fmt: skip


def effects_setting(name: str) -> Any:
    return settings.EFFECTS[name]


@dataclass(frozen=True)
class Call:
    """One effect call: who makes it, through what, with what; ``channel``: the suppression
    list its recipient is checked against (it contacts a person)."""

    ctx: StepContext
    provider: Provider
    conn: ConnectionInfo | None
    request: Request
    channel: str | None = None

    @property
    def key(self) -> str:
        return self.ctx.effect_key

    @property
    def lease(self) -> float:
        timeout = self.conn.timeout_seconds if self.conn else 30.0
        return timeout + float(effects_setting("LEASE_MARGIN_SECONDS"))

    @property
    def conn_id(self) -> int | None:
        return self.conn.id if self.conn else None

    def scrub(self, text: str) -> str:
        """``text`` without the connection's secret (an error message may quote a header)."""
        secret = self.conn.secret if self.conn else ""
        return text.replace(secret, "***") if len(secret) >= 4 else text


class ParkStep(Exception):
    """The step must wait for a person (a review, a repaired connection, a budget)."""

    def __init__(self, park: Park) -> None:
        super().__init__(park.detail.get("reason", "parked"))
        self.park = park


class Suppressed(Exception):
    """The recipient is on the suppression list now: nothing is sent."""


def run_effect(call: Call) -> StepResult:
    """Make the effect of ``call`` at most once per key, as far as the provider allows; return
    the step's result (the stored answer on every repeat). Traced, it is a span of its own."""
    if tracing_on():
        name = call.conn.name if call.conn else None
        return traced_effect(call.ctx, provider=call.provider.name, connection=name,
                             run=lambda: _run_effect(call))  # fmt: skip
    return _run_effect(call)


def _run_effect(call: Call) -> StepResult:
    try:
        answer = _effect(call)
    except ParkStep as parked:
        return StepResult(park=parked.park)
    except Suppressed as suppressed:
        output = {"suppressed": True, "to": call.request.recipient, "reason": str(suppressed)}
        return StepResult(output=output, outcome=SUPPRESSED)
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
    if state == EffectState.FAILED:  # a person's retry, where the provider can be asked first
        effect = _look_before_retry(call, effect)
        if effect["state"] == EffectState.SETTLED:
            return Answer(effect["result"])
    return _make_call(call, effect)


# --- claiming ---------------------------------------------------------------------------------


def _claim_or_read(call: Call) -> dict[str, Any]:
    """The effect under the key: newly claimed in flight (the caller calls), or as it stands.

    One transaction: the connection's gate, consent, the budget and the claim commit
    together."""
    ctx = call.ctx
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        gate = _lock_connection(cursor, call)
        _check_step_runs(cursor, ctx)
        cursor.execute(sql.LOCK_EFFECT, {"org_id": ctx.org_id, "key": call.key})
        effect = fetch_dict(cursor)
        if effect is None:
            # A re-run's new entry of a step may take an effect already made (reruns.py).
            reused = reused_effect(cursor, ctx)
            if reused is not None:
                return {"state": EffectState.SETTLED, "result": reused["result"]}
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
        if effect is not None and effect["state"] == EffectState.FAILED:
            if effect["resolution"] == "fail":
                raise StepFailure(f"effect {call.key} was failed by a person: {effect['error']}",
                                  retryable=False, error_class="resolved_failed")  # fmt: skip
            if effect["resolution"] == "retry" and call.provider.supports_lookup(call.conn):
                return effect  # asked for at the provider first (_look_before_retry)
        elif effect is not None:
            return effect
        # A first call, or a call again after the provider refused: through the gate.
        _pass_gate(cursor, call, gate)
        return _begin(cursor, call, effect)


def _check_step_runs(cursor: Any, ctx: StepContext) -> None:
    """Only the attempt that still runs claims: a run cancelled, or its person erased, since
    this attempt began has no call begun and none of its data written again (the settle that
    follows is fenced out too)."""
    held = {"run_id": ctx.run_id, "step_id": ctx.step_id, "iteration": ctx.iteration,
            "attempt": ctx.attempt}  # fmt: skip
    cursor.execute(sql.STEP_STILL_RUNS, held)
    if fetch_dict(cursor) is None:
        raise StepFailure(f"effect {ctx.effect_key}: the step no longer runs (cancelled or "
                          "taken over); nothing was called", retryable=True,
                          error_class="step_gone")  # fmt: skip


def _begin(cursor: Any, call: Call, effect: dict[str, Any] | None) -> dict[str, Any]:
    """Claim the effect in flight for this attempt (a new row, or the row again)."""
    ctx = call.ctx
    _check_consent(cursor, call)
    if effect is not None and effect["state"] == EffectState.OUTCOME_UNKNOWN:
        # The unknown call may have cost what it reserved: count it spent, reserve anew.
        _release_budget(cursor, call, effect["reserved_cost"], spent=effect["reserved_cost"])
    _reserve_budget(cursor, call)
    params: dict[str, Any] = {
        "token": secrets.token_hex(16), "owner": f"{ctx.lane}:{ctx.run_id}:{ctx.attempt}",
        "step_attempt": ctx.attempt, "lease": call.lease,
        "request": json_or_null(dict(call.request.summary)),
        "reserved_cost": call.request.reserve,
    }  # fmt: skip
    if effect is None:
        cursor.execute(sql.INSERT_IN_FLIGHT, {
            **params, "org_id": ctx.org_id, "run_id": ctx.run_id, "step_id": ctx.step_id,
            "iteration": ctx.iteration, "key": call.key, "provider": call.provider.name,
            "connection_id": call.conn_id,
            "external_key": f"{call.key}:{secrets.token_hex(6)}",
        })  # fmt: skip
    else:
        cursor.execute(sql.BEGIN_AGAIN, {**params, "id": effect["id"],
                                         "sources": sources(EffectState.IN_FLIGHT),
                                         "seen_calls": effect["calls"]})  # fmt: skip
    begun = fetch_dict(cursor)
    if begun is None:
        # Another attempt claimed or called under the key since we read it: look again
        # later rather than act on what we saw.
        raise StepDeferred(effects_setting("DEFER_SECONDS"), f"effect {call.key} was taken")
    return begun


def _lock_connection(cursor: Any, call: Call) -> dict[str, Any] | None:
    """Lock the connection's row first (the one lock order) and read its gate."""
    if call.conn_id is None:
        return None
    cursor.execute(sql.LOCK_CONNECTION, {"connection_id": call.conn_id})
    gate = fetch_dict(cursor)
    if gate is None:
        raise StepFailure(f"connection {_name(call)!r} was deleted", retryable=False,
                          error_class="unknown_connection")  # fmt: skip
    return gate


def _pass_gate(cursor: Any, call: Call, gate: dict[str, Any] | None) -> None:
    """Broken connection: park. Open circuit, a probe under way, or the concurrency cap
    reached: defer (no attempt spent). A circuit past its cool-down: this call probes."""
    if gate is None:
        return
    if gate["status"] == "broken":
        raise ParkStep(_broken_park(call, gate["broken_reason"]))
    defer = effects_setting("DEFER_SECONDS")
    if gate["circuit"] == "open" and gate["circuit_waiting"]:
        raise StepDeferred(max(defer, gate["circuit_seconds"]),
                           f"the circuit of connection {_name(call)!r} is open")  # fmt: skip
    if gate["circuit"] == "half_open" and gate["circuit_waiting"]:
        # A probe usually answers in moments, and its lease is only its worst case: look
        # again shortly rather than waiting out the lease.
        raise StepDeferred(defer, f"the circuit of connection {_name(call)!r} is being probed")
    # Held to the operator's limit too, for a connection written before it was lowered.
    cap = min(gate["max_concurrency"], int(operator_limit("max_concurrency")))
    if gate["in_flight"] >= cap:
        raise StepDeferred(
            max(defer, min(gate["first_free_seconds"] or defer, 30.0)),
            f"connection {_name(call)!r} is at its concurrency cap ({cap} calls in flight)",
        )
    if gate["circuit"] != "closed":  # its cool-down has passed: one probe goes through
        cursor.execute(sql.CIRCUIT_PROBE, {"connection_id": call.conn_id, "lease": call.lease})


def _check_consent(cursor: Any, call: Call) -> None:
    recipient = call.request.recipient
    if call.channel is None or recipient is None:
        return
    reason = suppression(cursor, call.ctx.org_id, call.channel, recipient)
    if reason is not None:
        raise Suppressed(reason)


def _reserve_budget(cursor: Any, call: Call) -> None:
    """Reserve the call's allowed cost against the organisation's model budget. Spent out:
    park until it is raised. Only other calls' reservations in the way: defer."""
    amount = call.request.reserve
    if not call.provider.budgeted and amount <= 0:
        return
    params: dict[str, Any] = {"org_id": call.ctx.org_id, "amount": amount}
    cursor.execute(sql.RESERVE_BUDGET, params)
    if cursor.fetchone() is not None:
        return
    cursor.execute(sql.BUDGET, params)
    budget = fetch_dict(cursor)
    if budget is None:
        return  # no budget set for the organisation: no limit
    if budget["spent_out"] or budget["spent"] + amount > budget["limit"]:
        raise ParkStep(Park(
            deadline_seconds=effects_setting("RECHECK_SECONDS"), refund_attempt=True,
            detail={"parked_on": f"budget:{call.ctx.org_id}", "reserve": str(amount),
                    "reason": "the organisation's model budget is exhausted: raise it to go on"},
            woken_after_park=partial(_raised_meanwhile, call.ctx.org_id, amount),
        ))  # fmt: skip
    raise StepDeferred(effects_setting("DEFER_SECONDS") * 5,
                       "the model budget is held by calls in flight")  # fmt: skip


# --- reconciling ------------------------------------------------------------------------------


def _reconcile(call: Call, effect: dict[str, Any]) -> dict[str, Any]:
    """An outcome_unknown effect, before anything is called again: settled from the
    provider's record, or begun again when that is safe, or parked for a person."""
    provider, conn = call.provider, call.conn
    retention = provider.retention(conn)
    key_fresh = retention is None or (effect["age_seconds"] or 0) < retention
    if provider.supports_lookup(conn):
        found = _lookup(call, effect)
        if found is not None:
            _settle_found(call, effect, found, by="reconcile")
            return {**effect, "state": EffectState.SETTLED, "result": found.result}
        if provider.supports_key(conn) and key_fresh:
            return _begin_again(call, effect, "not found; repeating the key the provider keeps")
        # Not there *yet* may mean the provider is still making it: trust the miss only
        # once the last call cannot be under way any more.
        wait = call.lease + provider.settle_seconds(conn) - (effect["since_last_call"] or 0)
        if wait > 0:
            raise StepDeferred(max(wait, effects_setting("DEFER_SECONDS")),
                               f"effect {call.key} not found yet; looking again")  # fmt: skip
        return _begin_again(call, effect, "lookup found nothing under the key")
    if provider.supports_key(conn) and key_fresh:
        return _begin_again(call, effect, "the provider honours the key: repeating it")
    if provider.repeatable:
        return _begin_again(call, effect, "the call makes nothing outside: asking again")
    why = (
        "the provider may have forgotten the key (first attempt "
        f"{effect['age_seconds']:.0f} s ago, kept {retention:.0f} s)"
        if provider.supports_key(conn) and retention is not None
        else "the provider has neither idempotency keys nor a lookup"
    )
    raise ParkStep(_to_review(call, effect, f"outcome unknown and {why}: a person must decide"))


def _lookup(call: Call, effect: dict[str, Any]) -> Answer | None:
    try:
        return call.provider.lookup(call.request, effect["external_key"], call.conn)
    except AuthFailed as exc:
        # The credentials cannot even read: the connection is broken, the step waits.
        _mark_broken(call, exc)
        raise _step_failure(call, effect, exc) from exc
    except CallError as exc:
        # Cannot tell yet: the effect stays outcome_unknown; look again later (no attempt
        # spent), and after a few failed looks let a person decide.
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql.LOOKUP_FAILED, {"id": effect["id"]})
            row = fetch_dict(cursor)
        failures = row["lookup_failures"] if row else LOOKUP_FAILURES_BEFORE_REVIEW
        if failures >= LOOKUP_FAILURES_BEFORE_REVIEW:
            why = f"{failures} lookups could not tell whether it was made ({call.scrub(str(exc))})"
            raise ParkStep(_to_review(call, effect, why)) from exc
        after = exc.retry_after if isinstance(exc, RateLimited) and exc.retry_after else None
        wait = after or effects_setting("DEFER_SECONDS") * 2**failures
        message = f"reconciling effect {call.key}: {call.scrub(str(exc))}"
        raise StepDeferred(wait, message) from exc


def _begin_again(call: Call, effect: dict[str, Any], why: str) -> dict[str, Any]:
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        gate = _lock_connection(cursor, call)
        _pass_gate(cursor, call, gate)
        begun = _begin(cursor, call, effect)
        _event(cursor, call.ctx, "effect.reconciled", {"key": call.key, "action": why})
    return begun


def _settle_found(call: Call, effect: dict[str, Any], found: Answer, *, by: str,
                  action: str = "found at the provider: settled with it") -> bool:  # fmt: skip
    """Settle the effect with what a lookup found; False: it moved meanwhile."""
    params: dict[str, Any] = {
        "id": effect["id"], "result": json_or_null(found.result), "by": by,
        "sources": [effect["state"]], "overtaken": RETRY_FOUND,
    }  # fmt: skip
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.SETTLE_FOUND, params)
        if cursor.fetchone() is None:
            return False
        _release_budget(cursor, call, effect["reserved_cost"], spent=found.cost)
        _event(cursor, call.ctx, "effect.reconciled", {"key": call.key, "action": action})
    return True


def _look_before_retry(call: Call, effect: dict[str, Any]) -> dict[str, Any]:
    """A person chose "retry" (nothing known to be made), and the provider can be asked:
    ask first. Found: the first call was made after all, and the retry is not sent. Not
    found, or the lookup fails: the person's word stands, and the call goes out."""
    try:
        found = call.provider.lookup(call.request, effect["external_key"], call.conn)
    except CallError as exc:
        found = None
        logger.info("effect %s: lookup before a person's retry failed: %s", call.key,
                    call.scrub(str(exc)))  # fmt: skip
    if found is not None:
        if _settle_found(call, effect, found, by="lookup", action=RETRY_FOUND):
            return {**effect, "state": EffectState.SETTLED, "result": found.result}
        raise StepDeferred(effects_setting("DEFER_SECONDS"), f"effect {call.key} moved")
    return _begin_again(call, effect, "a person chose retry and a lookup found nothing")


def _to_review(call: Call, effect: dict[str, Any], why: str) -> Park:
    """Park the effect for a person; the park of its step."""
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        params = {"id": effect["id"], "error": why, "sources": sources(EffectState.NEEDS_REVIEW)}
        cursor.execute(sql.TO_REVIEW, params)
        if cursor.fetchone() is not None:
            _event(cursor, call.ctx, "effect.needs_review", {"key": call.key, "why": why})
    return _review_park({**effect, "error": why})


# --- calling ----------------------------------------------------------------------------------


def _make_call(call: Call, effect: dict[str, Any]) -> Answer:
    """Call the provider under the effect claimed for this attempt, and record how it ended."""
    crash_point("effect.before_call")
    if tracing_on():
        provider_called()
    started = time.monotonic()
    try:
        with _lease_kept(call, effect):
            answer = call.provider.call(call.request, effect["external_key"], call.conn)
    except CallError as exc:
        crash_point("effect.after_answer")
        _waiting_out_the_database(call, partial(_record_failure, call, effect, exc))
        raise _step_failure(call, effect, exc) from exc
    except Exception as exc:
        # A bug in a provider, or an error nobody classified: the request may have left.
        logger.exception("effect %s: provider %s raised", call.key, call.provider.name)
        unknown = CallError(call.scrub(f"{type(exc).__name__}: {exc}"))
        _waiting_out_the_database(call, partial(_record_failure, call, effect, unknown))
        raise _step_failure(call, effect, unknown) from exc
    crash_point("effect.after_answer")
    seconds = time.monotonic() - started
    _waiting_out_the_database(call, partial(_record_answer, call, effect, answer, seconds))
    return answer


def _waiting_out_the_database(call: Call, record: Callable[[bool], None]) -> None:
    """Record how a call ended, waiting out a database that went away meanwhile (a restart,
    a failover, a terminated backend) for as long as a worker's settle does
    (WAYMARK_SETTLE_PATIENCE_SECONDS), on a fresh connection each try. What the provider
    answered is known only to this process: dropped, a call with no key to repeat safely
    and no lookup would leave its effect to a person (needs_review) though it was made.
    ``record(retried)``: a try after a failed one may find its own earlier commit (its
    acknowledgement lost with the connection)."""
    give_up = time.monotonic() + float(engine_setting("SETTLE_PATIENCE_SECONDS"))
    tries = 0
    while True:
        try:
            record(tries > 0)
            return
        except Exception as exc:
            if not is_transient(exc) or connection.in_atomic_block:
                raise
            tries += 1
            connection.close()
            pause = min(2.0, 0.05 * 2 ** min(tries - 1, 6))
            if time.monotonic() + pause > give_up:
                raise
            if tries == 1:
                log_failure(logger, exc, "effect %s: its answer waits for the database", call.key)
            time.sleep(pause)


@contextmanager
def _lease_kept(call: Call, effect: dict[str, Any]) -> Iterator[None]:
    """Renew the effect's lease while the call is under way (on a connection of its own,
    opened only if the call outlasts a third of the lease). Stops when the step's own lease
    is lost (taken over, timed out): the effect's lease then lapses and the next attempt
    reconciles."""
    done = threading.Event()

    def renew() -> None:
        db = None
        params = {"id": effect["id"], "token": effect["token"], "lease": call.lease}
        while not done.wait(call.lease / 3) and not call.ctx.lease_lost.is_set():
            try:
                db = db if db is not None and not db.closed else own_connection()
                db.execute(sql.EXTEND_LEASE, params)
            except Exception as exc:
                # A terminated backend or a restart: one line, tried again at the next beat.
                log_failure(logger, exc, "effect %s: could not renew its lease", call.key)
                if db is not None:
                    db.close()
                db = None
        if db is not None:
            db.close()

    renewer = threading.Thread(target=renew, name="effect-lease", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        done.set()


def _record_answer(
    call: Call, effect: dict[str, Any], answer: Answer, seconds: float, retried: bool = False
) -> None:
    params: dict[str, Any] = {
        "id": effect["id"], "token": effect["token"], "result": json_or_null(answer.result),
        "response": json_or_null(dict(answer.response) if answer.response else None),
        "cost": answer.cost,
        # Its own call, also after its lease lapsed (outcome_unknown), a person was asked
        # meanwhile (needs_review), or a person chose a retry not yet begun (failed): the
        # answer is a fact, and it ends the uncertainty.
        "sources": sources(EffectState.SETTLED), "overtaken": RETRY_NOT_SENT,
    }  # fmt: skip
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        _lock_connection_quietly(cursor, call)
        cursor.execute(sql.SETTLE, params)
        row = fetch_dict(cursor)
        if row is None:
            _answered_too_late(cursor, call, effect, answer, retried=retried)
            return
        # A person's retry released the call's reservation already (resolve_effect).
        held = Decimal(0) if row["was"] == EffectState.FAILED else effect["reserved_cost"]
        _release_budget(cursor, call, held, spent=answer.cost)
        if call.conn_id is not None:
            cursor.execute(sql.CIRCUIT_SUCCESS, {"connection_id": call.conn_id})
        detail = {"key": call.key, "calls": effect["calls"], "seconds": round(seconds, 3)}
        if row["was"] == EffectState.FAILED:
            detail["retry"] = RETRY_NOT_SENT  # a person's retry, overtaken by this answer
        _event(cursor, call.ctx, "effect.settled", detail)
        if row["was"] == EffectState.NEEDS_REVIEW:
            from .resolve import wake_parked

            wake_parked(cursor, call.ctx.org_id, f"effect:{effect['id']}",
                        {"settled": "answer arrived"}, "effect_settled", "ledger")  # fmt: skip


def _answered_too_late(
    cursor: Any, call: Call, effect: dict[str, Any], answer: Answer, *, retried: bool = False
) -> None:
    """This call's answer came after the effect moved on without it: another call under the
    key began (its lease lapsed and the key was called again, or a person chose "retry" and
    the retry was sent), or a person resolved it ("done", "fail"). What the effect holds
    stays; the run's history says that this call answered too, so a person can check at the
    provider whether it was made twice. Its result is not kept there: an answer fenced out
    by an erasure (sql.FENCE_IN_FLIGHT) may name the erased person."""
    cursor.execute(sql.EFFECT_CALLS, {"id": effect["id"], "token": effect["token"]})
    now = fetch_dict(cursor)
    if now is None:
        return
    if retried and now["settled_by_this_call"] and now["calls"] == effect["calls"]:
        return  # this call's own answer, recorded by a try whose commit was not acknowledged
    logger.warning("effect %s: answered after the effect moved on without it", call.key)
    call_no, calls = effect["calls"], now["calls"]
    if calls > call_no:
        note = (f"the answer of call {call_no} arrived after call {calls} was sent under the "
                "same key: the effect keeps that call's answer; check at the provider "
                "whether it was made twice")  # fmt: skip
    elif now["state"] in (EffectState.SETTLED, EffectState.FAILED):
        note = (f"the answer of call {call_no} arrived after the effect was {now['state']} "
                f"by {now['resolved_by'] or 'a person'}: it keeps that; check at the "
                "provider what was made")  # fmt: skip
    else:
        return  # fenced out by an erasure, still to be reconciled: nothing to tell yet
    detail = {"key": call.key, "call": call_no, "calls": calls, "note": note}
    _event(cursor, call.ctx, "effect.late_answer", detail)


def _record_failure(
    call: Call, effect: dict[str, Any], exc: CallError, retried: bool = False
) -> None:
    state = EffectState.FAILED if exc.made == "no" else EffectState.OUTCOME_UNKNOWN
    error = call.scrub(str(exc))[:MAX_ERROR_CHARS]
    params: dict[str, Any] = {
        "id": effect["id"], "token": effect["token"], "state": state.value, "error": error,
        "response": json_or_null(exc.response), "sources": [EffectState.IN_FLIGHT.value],
    }  # fmt: skip
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        _lock_connection_quietly(cursor, call)
        cursor.execute(sql.END_ATTEMPT, params)
        if cursor.fetchone() is None:
            return  # taken over meanwhile: the newer attempt records its own ending
        if state == EffectState.FAILED:
            _release_budget(cursor, call, effect["reserved_cost"], spent=None)
        if call.conn_id is not None and exc.counts_against_circuit:
            cursor.execute(sql.CIRCUIT_FAILURE, {
                "connection_id": call.conn_id, "threshold": effects_setting("CIRCUIT_FAILURES"),
                "cooldown": effects_setting("CIRCUIT_COOLDOWN_SECONDS"),
            })  # fmt: skip
        kind = "effect.failed" if state == EffectState.FAILED else "effect.outcome_unknown"
        _event(cursor, call.ctx, kind, {"key": call.key, "error": error[:500],
                                       "class": exc.error_class})  # fmt: skip
    if isinstance(exc, AuthFailed):
        _mark_broken(call, exc)


def _lock_connection_quietly(cursor: Any, call: Call) -> None:
    """The connection's row before the effect's (the one lock order), when there is one."""
    if call.conn_id is not None:
        cursor.execute(sql.LOCK_CONNECTION_ROW, {"connection_id": call.conn_id})


def _mark_broken(call: Call, exc: AuthFailed) -> None:
    """Revoked credentials: the connection is broken, unless its secret was replaced since
    this call read it (the answer then says nothing about the new one)."""
    if call.conn is None or call.conn.id is None:
        return
    reason = call.scrub(f"reconnect {call.conn.name}: {exc}")[:500]
    params: dict[str, Any] = {"connection_id": call.conn.id, "reason": reason,
                              "secret_version": call.conn.secret_version}  # fmt: skip
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.CONNECTION_BROKEN, params)
        if cursor.rowcount:
            _event(cursor, call.ctx, "connection.broken",
                   {"connection": call.conn.name, "reason": reason})  # fmt: skip


def _step_failure(call: Call, effect: dict[str, Any], exc: CallError) -> Exception:
    """What the step does after a call (or a lookup) that did not answer."""
    message = call.scrub(str(exc))
    if isinstance(exc, AuthFailed):
        if call.conn_id is None:  # no connection to repair: the request itself is refused
            return StepFailure(message, retryable=False, error_class="auth")
        return ParkStep(_broken_park(call, f"reconnect {_name(call)!r}: {message}"))
    if isinstance(exc, KeyInUse):
        # The provider is still working on a request with this key: not this step's fault.
        return StepDeferred(effects_setting("DEFER_SECONDS"), message)
    if exc.made == "unknown" and call.ctx.last_attempt:
        # No attempt left to reconcile with: never end the step while its effect is unknown.
        why = f"the last attempt ended without knowing whether it was made ({message})"
        return ParkStep(_to_review(call, effect, why))
    retry_after = exc.retry_after if isinstance(exc, RateLimited) else None
    return StepFailure(message, retryable=exc.retryable, retry_after=retry_after,
                       error_class=exc.error_class)  # fmt: skip


# --- parks --------------------------------------------------------------------------------------
# A repair, a raised budget or a person's decision wakes a parked step at once, also one
# that came while the step was parking (its wake found nothing waiting yet): the park looks
# again, under a lock its waker's write conflicts with (Park.woken_meanwhile for a review,
# whose resolution locks the run; Park.woken_after_park for a connection or a budget, whose
# wakers lock their own row). The step also looks again every RECHECK_SECONDS (no attempt
# spent), a safety net only.


def _broken_park(call: Call, reason: str) -> Park:
    return Park(
        deadline_seconds=effects_setting("RECHECK_SECONDS"), refund_attempt=True,
        detail={"parked_on": f"connection:{call.conn_id}", "connection": _name(call),
                "reason": reason or f"reconnect {_name(call)}"},
        woken_after_park=partial(_repaired_meanwhile, call.conn_id),
    )  # fmt: skip


def _repaired_meanwhile(connection_id: int | None, cursor: Any) -> dict[str, Any] | None:
    """The connection was repaired while its step was parking: the wake repair_connection
    would have sent. Share-locked (sql.CONNECTION_STATUS_SHARED says why that is enough)."""
    cursor.execute(sql.CONNECTION_STATUS_SHARED, {"connection_id": connection_id})
    row = fetch_dict(cursor)
    if row is None or row["status"] != "ok":
        return None  # still broken; or deleted, which wakes nobody
    return {"connection": row["name"], "repaired": "while the step was parking"}


def _raised_meanwhile(org_id: int, amount: Decimal, cursor: Any) -> dict[str, Any] | None:
    """The budget was raised (or removed) while its step was parking so that this call fits:
    the wake budget_raised would have sent. Share-locked (see sql.CONNECTION_STATUS_SHARED)."""
    cursor.execute(sql.BUDGET_SHARED, {"org_id": org_id})
    budget = fetch_dict(cursor)
    if budget is not None and (budget["spent"] >= budget["limit"]
                               or budget["spent"] + amount > budget["limit"]):  # fmt: skip
        return None
    return {"budget": "raised while the step was parking"}


def _review_park(effect: Mapping[str, Any]) -> Park:
    return Park(
        deadline_seconds=effects_setting("RECHECK_SECONDS"), refund_attempt=True,
        detail={"parked_on": f"effect:{effect['id']}", "effect": effect["key"],
                "reason": f"effect needs review: {effect.get('error') or 'outcome unknown'}"},
        woken_meanwhile=partial(_resolved_meanwhile, effect["id"]),
    )  # fmt: skip


def _resolved_meanwhile(effect_id: int, cursor: Any) -> dict[str, Any] | None:
    """The review was resolved while its step was parking: the wake resolve_effect would have
    sent (it holds the run's lock too, so it either found the parked step or came first)."""
    cursor.execute("SELECT key, state, resolution FROM effects_effect WHERE id = %(id)s",
                   {"id": effect_id})  # fmt: skip
    effect = fetch_dict(cursor)
    if effect is None or effect["state"] == EffectState.NEEDS_REVIEW:
        return None
    action = effect["resolution"] or "done"
    return {"resolution": action, "effect": effect["key"], "reason": "resolved while parking"}


# --- small helpers --------------------------------------------------------------------------


def _name(call: Call) -> str:
    return call.conn.name if call.conn else ""


def _release_budget(cursor: Any, call: Call, reserved: Decimal, *, spent: Decimal | None) -> None:
    if reserved or spent:
        cursor.execute(sql.SETTLE_BUDGET, {"org_id": call.ctx.org_id, "reserved": reserved,
                                           "spent": spent or Decimal(0)})  # fmt: skip


def _event(cursor: Any, ctx: StepContext, kind: str, detail: Mapping[str, Any]) -> None:
    insert_events(cursor, [event_row(
        ctx.org_id, ctx.run_id, kind, ctx.step_id, iteration=ctx.iteration,
        attempt=ctx.attempt, worker=f"{ctx.lane}", detail=dict(detail),
    )])  # fmt: skip
