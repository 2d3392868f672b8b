"""What people do to effects and connections, and how parked steps go on after.

- A ``needs_review`` effect is resolved by a person: marked done with a result, retried
  with the same key, or failed (and its step with it). Each resolution is recorded in the
  run's history, and wakes the step parked on the effect in the same transaction. A retry
  is not sent when the first call's answer arrives, or a lookup finds it, before the retry
  begins (the ledger settles the effect with it, and says so).
- A broken connection is repaired (a new secret, or a health probe that passes): every step
  parked on it wakes and runs again from the same step.
- A raised model budget wakes the steps parked on it.

A repair or a raise that comes while a step is parking is not missed: each locks its row
before it looks for parked steps, and the park looks again under a conflicting lock once it
has committed (ledger._repaired_meanwhile, ledger._raised_meanwhile).
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from workflows.plugins.audit import Actor, as_actor, record_audit
from workflows.plugins.engine import (
    Wake,
    event_row,
    fetch_dict,
    fetch_dicts,
    insert_events,
    lock_run,
    wake_step,
)
from workflows.plugins.engine import json_or_null as _json

from . import sql
from .models import Connection
from .states import ConnectionStatus, EffectState, sources


class ResolveError(Exception):
    """A resolution that cannot be made (stable ``code`` for API and admin messages)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


DONE, RETRY, FAIL = "done", "retry", "fail"
ACTIONS = (DONE, RETRY, FAIL)


def resolve_effect(effect_id: int, action: str, *, by: Actor | str, result: Any = None,
                   reason: str = "") -> None:  # fmt: skip
    """Resolve a needs_review effect as ``by`` (an Actor, or its label); its parked step
    wakes, and the audit log records it (``effect.resolve``), in the same transaction."""
    if action not in ACTIONS:
        raise ResolveError("invalid_action", f"action must be one of {', '.join(ACTIONS)}")
    actor = as_actor(by)
    label = actor.label
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        # The run first, as every transition does: a step parking on this effect right now
        # is then either parked when we look for it, or sees the resolution as it parks
        # (ledger._resolved_meanwhile, in the park's transaction under the same lock).
        _lock_run_of(cursor, effect_id)
        effect = _locked_effect(cursor, effect_id)
        if effect["state"] != EffectState.NEEDS_REVIEW:
            moved = _last_moved_by(cursor, effect)
            raise ResolveError("not_in_review",
                               f"effect is {effect['state']}, not needs_review{moved}")  # fmt: skip
        params: dict[str, Any] = {"id": effect_id, "by": label}
        if action == DONE:
            params |= {"result": _json(result), "sources": [EffectState.NEEDS_REVIEW.value],
                       "overtaken": ""}  # fmt: skip
            cursor.execute(sql.SETTLE_FOUND, params)
        else:
            # "retry": nothing is known to be made, on a person's word: the step's next
            # attempt calls again under the same key. "fail": the step fails with it. The
            # decision is kept on the effect, so it holds however the step comes back to it.
            why = {RETRY: "a person chose to call again with the same key",
                   FAIL: f"failed by a person: {reason or 'no reason given'}"}[action]  # fmt: skip
            params |= {"error": why, "sources": [EffectState.NEEDS_REVIEW.value],
                       "resolution": action}  # fmt: skip
            cursor.execute(sql.FAIL_REVIEWED, params)
        if effect["reserved_cost"]:  # a model call's reservation: nothing more will settle it
            held = {"org_id": effect["org_id"], "reserved": effect["reserved_cost"], "spent": 0}
            cursor.execute(sql.SETTLE_BUDGET, held)
        detail = {"key": effect["key"], "action": action, "by": label, "reason": reason}
        insert_events(cursor, [event_row(effect["org_id"], effect["run_id"], "effect.resolved",
                                         effect["step_id"], iteration=effect["iteration"],
                                         worker=label, detail=detail)])  # fmt: skip
        # The reason is a person's free text, which may name the run's person: it is kept in
        # the run's history (erasable), and the audit, which an erasure never changes, only
        # says whether one was given.
        record_audit(
            org=effect["org_id"], actor=actor, action="effect.resolve", target_type="effect",
            target_id=effect_id,
            detail={"key": effect["key"], "action": action, "reason_given": bool(reason),
                    "run": effect["run_id"], "step": effect["step_id"]},
        )  # fmt: skip
        payload = {"resolution": action, "effect": effect["key"], "reason": reason}
        wake_parked(
            cursor, effect["org_id"], f"effect:{effect_id}", payload, "effect_resolved", label
        )


def _lock_run_of(cursor: Any, effect_id: int) -> None:
    cursor.execute("SELECT run_id FROM effects_effect WHERE id = %(id)s", {"id": effect_id})
    found = cursor.fetchone()
    if found is not None:  # none: _locked_effect says so
        lock_run(cursor, found[0])


def _locked_effect(cursor: Any, effect_id: int) -> dict[str, Any]:
    cursor.execute(
        "SELECT id, org_id, run_id, step_id, iteration, key, state, reserved_cost "
        "FROM effects_effect "
        "WHERE id = %(id)s FOR UPDATE",
        {"id": effect_id},
    )
    effect = fetch_dict(cursor)
    if effect is None:
        raise ResolveError("not_found", "no such effect")
    return effect


def _last_moved_by(cursor: Any, effect: dict[str, Any]) -> str:
    """Who moved the effect last, from its run's history, for a resolution that came too
    late (another person's, or the provider's own answer that arrived meanwhile): the loser
    is told who won. "" when the history says nothing."""
    cursor.execute(sql.EFFECT_LAST_MOVE, {"run_id": effect["run_id"], "key": effect["key"]})
    event = fetch_dict(cursor)
    if event is None:
        return ""
    detail = event["detail"] or {}
    if event["kind"] == "effect.resolved":
        return f": resolved by {detail.get('by') or event['worker']} ({detail.get('action')})"
    if event["kind"] == "effect.settled":
        return ": settled by the provider's own answer"
    return f": reconciled ({detail.get('action')})"


def repair_connection(conn: Connection, *, by: Actor | str) -> int:
    """Mark the connection working again and wake the steps parked on it; how many woke.
    Audited (``connection.repair``) as ``by`` (an Actor, or its label)."""
    actor = as_actor(by)
    label = actor.label
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        # This UPDATE locks the connection's row until commit: a step parking on it now
        # either is found parked below or sees the repair (sql.CONNECTION_STATUS_SHARED).
        changed = Connection.objects.filter(pk=conn.pk).update(
            status=ConnectionStatus.OK, broken_reason="", broken_at=None,
            circuit="closed", consecutive_failures=0, circuit_until=None,
            updated_at=timezone.now(),
        )  # fmt: skip
        if not changed:
            return 0
        record_audit(org=conn.org_id, actor=actor, action="connection.repair",
                     target_type="connection", target_id=conn.name)  # fmt: skip
        payload = {"connection": conn.name, "repaired_by": label}
        return wake_parked(cursor, conn.org_id, f"connection:{conn.pk}", payload,
                            "connection_repaired", label)  # fmt: skip


def budget_raised(org_id: int, *, by: Actor | str) -> int:
    """Wake the steps parked on the organisation's exhausted model budget (they reserve
    again, and park again if it is still short)."""
    label = as_actor(by).label
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        # The budget's row first, as the repair's UPDATE locks the connection's: a step
        # parking now either is found parked below or sees the budget as this commit leaves
        # it (sql.BUDGET_SHARED), whatever the caller committed before.
        cursor.execute(sql.LOCK_BUDGET, {"org_id": org_id})
        return wake_parked(cursor, org_id, f"budget:{org_id}", {"budget": "raised"},
                            "budget_raised", label)  # fmt: skip


def wake_parked(cursor: Any, org_id: int, parked_on: str, payload: dict[str, Any],
                reason: str, by: str) -> int:  # fmt: skip
    """Wake the steps parked on ``parked_on`` (in the caller's transaction); how many."""
    cursor.execute(sql.PARKED_ON, {"org_id": org_id, "parked_on": parked_on})
    woken = 0
    for row in fetch_dicts(cursor):
        wake = Wake(payload=payload, reason=reason, by=by, actor=by)  # a person's action
        woken += wake_step(step_pk=row["id"], wake=wake)
    return woken


def reconcile_budgets(by: str = "sweep") -> int:
    """Release the reservations of effects whose run ended, and make each budget's
    `reserved` the sum of what its effects hold (the sweep runs this now and then)."""
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.RELEASE_ORPHAN_RESERVATIONS)
        released = int(cursor.rowcount)
        cursor.execute(sql.RECOUNT_RESERVED)
    return released


# How long past its lease an effect of an ended step stays in flight before it is parked: an
# attempt stopped (SIGSTOP, a long pause) past its lease may still come back with the answer.
ORPHAN_AFTER_SECONDS = 60.0
ORPHANED = ("the run's step ended while this call was under way and the attempt making it "
            "stopped before it recorded an answer: the call may have been made; check at "
            "the provider")  # fmt: skip


def park_orphaned_calls(
    by: str = "sweep", *, limit: int = 100, after: float = ORPHAN_AFTER_SECONDS
) -> int:
    """Park for a person the effects left in flight by a step that ended (its run cancelled
    or failed while the attempt calling died): no attempt will come to reconcile them, and
    in flight they would look stuck for ever. A late answer still settles one (its token
    stays). The sweep runs this now and then."""
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.ORPHANED_TO_UNKNOWN, {"after": after, "limit": limit})
        orphaned = fetch_dicts(cursor)
        review = sources(EffectState.NEEDS_REVIEW)
        for effect in orphaned:
            cursor.execute(sql.TO_REVIEW, {"id": effect["id"], "error": ORPHANED,
                                           "sources": review})  # fmt: skip
        insert_events(cursor, [event_row(
            e["org_id"], e["run_id"], "effect.needs_review", e["step_id"],
            iteration=e["iteration"], worker=by, detail={"key": e["key"], "why": ORPHANED},
        ) for e in orphaned])  # fmt: skip
    return len(orphaned)
