"""The declared state machines of effects, connections and their circuit breakers.

Every change of an effect's state is a conditional UPDATE in ``effects/sql.py`` whose WHERE
clause lists the allowed sources from ``EFFECT_TRANSITIONS``; tests check the two agree.
"""

from __future__ import annotations

from django.db import models


class EffectState(models.TextChoices):
    # A call under this key may be under way: its attempt holds the effect's own lease.
    IN_FLIGHT = "in_flight"
    SETTLED = "settled"  # the provider's answer is stored; never called again
    # A call began and nobody knows how it ended (its lease lapsed, or it failed
    # ambiguously): reconciled before any retry, never simply repeated.
    OUTCOME_UNKNOWN = "outcome_unknown"
    NEEDS_REVIEW = "needs_review"  # parked for a person, with what is known
    # The provider refused, so nothing was made (a 4xx, a connection never opened, a
    # revoked token): a later attempt may call again under the same key.
    FAILED = "failed"


EFFECT_TRANSITIONS: dict[EffectState, frozenset[EffectState]] = {
    EffectState.IN_FLIGHT: frozenset(
        {EffectState.SETTLED, EffectState.OUTCOME_UNKNOWN, EffectState.FAILED}
    ),
    # reconciled (found), or called again with the same key / after a lookup found nothing;
    # or parked for a person
    EffectState.OUTCOME_UNKNOWN: frozenset(
        {EffectState.SETTLED, EffectState.IN_FLIGHT, EffectState.NEEDS_REVIEW}
    ),
    # a person: mark done with a result (settled), or retry with the same key / fail the
    # step (failed: nothing known to be made; the step's next attempt calls again, or fails)
    EffectState.NEEDS_REVIEW: frozenset({EffectState.SETTLED, EffectState.FAILED}),
    # called again; or, when a person chose "retry" and the retry is not yet begun, settled
    # by what arrived first: the answer of the call it was to repeat, or a lookup that finds
    # it (the SQL allows this source only with resolution "retry")
    EffectState.FAILED: frozenset({EffectState.IN_FLIGHT, EffectState.SETTLED}),
    EffectState.SETTLED: frozenset(),
}


def sources(target: EffectState) -> list[str]:
    """The states an effect may enter ``target`` from (for the SQL's WHERE clauses)."""
    return sorted(s.value for s, targets in EFFECT_TRANSITIONS.items() if target in targets)


class ConnectionStatus(models.TextChoices):
    OK = "ok"
    # An authorisation failure (401/403, a revoked token): steps that reach it park until a
    # person repairs it; nothing retries against it.
    BROKEN = "broken"


class CircuitState(models.TextChoices):
    CLOSED = "closed"
    OPEN = "open"  # calls wait until circuit_until
    HALF_OPEN = "half_open"  # one probe call is under way (until circuit_until)
