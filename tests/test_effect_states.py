"""The effect state machine: every transition the ledger's SQL makes is declared in
effects/states.py, and nothing leaves `settled`."""

from __future__ import annotations

import re

from effects import sql
from effects.states import EFFECT_TRANSITIONS, EffectState, sources

# (statement, the states it moves from, the state it moves to): hard-coded sources are read
# from the SQL; `ANY(%(sources)s)` ones are what the ledger passes (see effects/ledger.py).
LITERAL = {
    "LAPSED_TO_UNKNOWN": EffectState.OUTCOME_UNKNOWN,
    "ORPHANED_TO_UNKNOWN": EffectState.OUTCOME_UNKNOWN,
}


def test_every_hard_coded_transition_is_declared():
    for name, target in LITERAL.items():
        statement = getattr(sql, name)
        [source] = re.findall(r"state = '(\w+)'", statement.split("WHERE", 1)[1])
        assert target in EFFECT_TRANSITIONS[EffectState(source)], (name, source, target)


def test_sources_lists_exactly_the_declared_predecessors():
    for target in EffectState:
        expected = {s.value for s, targets in EFFECT_TRANSITIONS.items() if target in targets}
        assert set(sources(target)) == expected


def test_the_ledger_settles_only_from_declared_states():
    # _record_answer passes these: an attempt's own call, or one whose lease lapsed meanwhile.
    for source in (EffectState.IN_FLIGHT, EffectState.OUTCOME_UNKNOWN):
        assert EffectState.SETTLED in EFFECT_TRANSITIONS[source]


def test_settled_is_final_and_uncertainty_never_becomes_a_fresh_effect():
    assert EFFECT_TRANSITIONS[EffectState.SETTLED] == frozenset()
    # outcome_unknown never goes to failed (which would allow a fresh call without checking).
    assert EffectState.FAILED not in EFFECT_TRANSITIONS[EffectState.OUTCOME_UNKNOWN]


def test_a_failed_effect_settles_only_when_a_person_chose_retry():
    # failed -> settled is a person's retry overtaken by the first call's answer (or a lookup
    # that finds it): a provider's refusal or a person's "fail" is never settled over.
    assert EffectState.SETTLED in EFFECT_TRANSITIONS[EffectState.FAILED]
    for name in ("SETTLE", "SETTLE_FOUND"):
        guard = getattr(sql, name).split("WHERE", 1)[1]
        retry_only = r"\((e\.)?state <> 'failed' OR (e\.)?resolution = 'retry'\)"
        assert re.search(retry_only, guard), name
