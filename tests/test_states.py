"""The engine's SQL transitions use only the sources declared in workflows/states.py."""

from __future__ import annotations

import re

import pytest

from workflows.engine import sql
from workflows.engine.sql import migration as migration_sql
from workflows.states import (
    RUN_FINISHED,
    RUN_TRANSITIONS,
    STEP_TRANSITIONS,
    RunStatus,
    StepStatus,
    run_sources,
    step_sources,
)

GUARD = re.compile(r"status\s*(?:=\s*'(\w+)'|(NOT )?IN\s*\(([^)]*)\))", re.IGNORECASE)


def sources_in(guard: str) -> set[str]:
    found: set[str] = set()
    for single, negated, many in GUARD.findall(guard):
        listed = {single} if single else {v.strip().strip("'") for v in many.split(",")}
        found |= set(StepStatus.values) - listed if negated else listed
    return found


# The claim's UPDATE names what it excludes (see sql.CLAIM): ready or running.
CLAIM_GUARD = "s.status NOT IN ('waiting', 'done', 'failed', 'cancelled')"


def test_the_claim_guard_means_ready_or_running() -> None:
    assert sources_in(CLAIM_GUARD) == {"ready", "running"}


# (statement, target status, the guard its transition UPDATE carries)
STEP_CHANGES = [
    (sql.CLAIM, StepStatus.RUNNING, CLAIM_GUARD),
    (sql.CLAIM, StepStatus.WAITING, CLAIM_GUARD),  # run paused
    (sql.CLAIM, StepStatus.CANCELLED, CLAIM_GUARD),  # run ended
    (sql.CLAIM_AFTER_HOPS, StepStatus.RUNNING, CLAIM_GUARD),
    (sql.CLAIM_AFTER_HOPS, StepStatus.WAITING, CLAIM_GUARD),
    (sql.CLAIM_AFTER_HOPS, StepStatus.CANCELLED, CLAIM_GUARD),
    (sql.CLAIM_SUSPECT, StepStatus.RUNNING, CLAIM_GUARD),
    (sql.CLAIM_SUSPECT, StepStatus.WAITING, CLAIM_GUARD),
    (sql.CLAIM_SUSPECT, StepStatus.CANCELLED, CLAIM_GUARD),
    (sql.SETTLE_DONE, StepStatus.DONE, "status = 'running'"),
    (sql.SETTLE_FAILED, StepStatus.FAILED, "status = 'running'"),
    (sql.SETTLE_DONE_LOCKED, StepStatus.DONE, "status = 'running'"),
    (sql.SETTLE_FAILED_LOCKED, StepStatus.FAILED, "status = 'running'"),
    (sql.SETTLE_RETRY, StepStatus.WAITING, "status = 'running'"),
    (sql.SETTLE_PARK, StepStatus.WAITING, "status = 'running'"),
    (sql.PROMOTE_DUE_RETRIES, StepStatus.READY, "s.status = 'waiting'"),
    (sql.WAKE_DONE, StepStatus.DONE, "status = 'waiting'"),
    (sql.FAIL_WAITING, StepStatus.FAILED, "status = 'waiting'"),
    (sql.WAKE_READY, StepStatus.READY, "status = 'waiting'"),
    (sql.WAKE_READY, StepStatus.WAITING, "status = 'waiting'"),  # run paused: stays parked
    (sql.RELEASE, StepStatus.READY, "s.status = 'running'"),
    (sql.CANCEL_LIVE_STEPS, StepStatus.CANCELLED, "status IN ('ready', 'running', 'waiting')"),
    (sql.PARK_READY_STEPS, StepStatus.WAITING, "status = 'ready'"),
    (sql.UNPARK_STEPS, StepStatus.READY, "status = 'waiting'"),
    (sql.RETRY_FAILED_STEPS, StepStatus.READY, "status = 'failed'"),
    (sql.FAIL_STEP_AND_RUN, StepStatus.FAILED, "status = 'running'"),
    (
        sql.CANCEL_LIVE_STEPS_LOGGED,
        StepStatus.CANCELLED,
        "status IN ('ready', 'running', 'waiting')",
    ),
    (sql.CANCEL_FORK, StepStatus.CANCELLED, "status IN ('ready', 'running', 'waiting')"),
    # A batch of timers (waits.wake_steps_together): its steps woken, its ended runs' ended.
    (sql.LOCK_RUNS_WAKE_DONE, StepStatus.DONE, "s.status = 'waiting'"),
    (
        sql.CANCEL_LIVE_STEPS_OF_RUNS_LOGGED,
        StepStatus.CANCELLED,
        "status IN ('ready', 'running', 'waiting')",
    ),
    # Compensation begins: the run's live forward steps end (engine/compensation.py).
    (
        sql.CANCEL_FORWARD_STEPS,
        StepStatus.CANCELLED,
        "status IN ('ready', 'running', 'waiting')",
    ),
    (sql.JOIN_ARRIVE, StepStatus.DONE, "status = 'waiting'"),
    # A migration between versions: a removed step's wait ends (move_to), never a running one.
    (migration_sql.CANCEL_MOVED_STEPS, StepStatus.CANCELLED, "status IN ('ready', 'waiting')"),
]


@pytest.mark.parametrize(("statement", "target", "guard"), STEP_CHANGES)
def test_step_transitions_use_declared_sources(
    statement: str, target: StepStatus, guard: str
) -> None:
    # (sql._compact, which sends the claim, drops the space after each comma)
    compact = guard.replace(", ", ",")
    assert guard in statement or compact in statement, "every transition must guard on its status"
    assert sources_in(guard) <= set(step_sources(target))


def test_every_statement_that_sets_a_step_status_is_checked() -> None:
    checked = {statement for statement, _, _ in STEP_CHANGES}
    for module, name in [(m, n) for m in (sql, migration_sql) for n in dir(m)]:
        if name.startswith("_"):
            continue  # fragments, checked as part of the statements that use them
        statement = getattr(module, name)
        if isinstance(statement, str) and re.search(
            r"UPDATE workflows_step( \w+)?\s+SET (status|wait_detail) =", statement
        ):
            assert statement in checked, name


def test_the_heartbeat_extends_only_running_steps() -> None:
    assert "s.status = 'running'" in sql.HEARTBEAT.split("extended AS")[0]
    assert "s.status = 'running'" in sql.HEARTBEAT.split("extended AS")[1]


def test_run_status_changes_use_declared_sources() -> None:
    walk_guard = "status IN ('running', 'paused')"
    assert walk_guard in sql.UPDATE_RUN
    for target in (RunStatus.SUCCEEDED, RunStatus.FAILED):
        assert sources_in(walk_guard) <= set(run_sources(target))
    assert "r.status IN ('running', 'paused')" in sql.FAIL_STEP_AND_RUN
    assert "r.status IN ('running', 'paused')" in sql.UPDATE_RUNS  # a batch of timers' walks
    # Run control passes its sources from workflows.states (services/control.py).
    assert "status = ANY(%(sources)s)" in sql.SET_RUN_STATUS


def test_finished_states_are_final_except_an_operators_retry_or_re_run() -> None:
    for status, targets in STEP_TRANSITIONS.items():
        if status in {"done", "cancelled"}:
            assert targets == frozenset(), status
    assert STEP_TRANSITIONS[StepStatus.FAILED] == {StepStatus.READY}
    # A finished run runs again only by an operator's hand: a retry, or a re-run from a step.
    for finished in RUN_FINISHED:
        assert RUN_TRANSITIONS[finished] == {RunStatus.RUNNING}, finished


def test_a_re_run_guards_on_the_declared_finished_sources() -> None:
    from workflows.services.rerun import RERUN_SOURCES

    assert "status = ANY(%(sources)s)" in sql.RERUN_RUN
    assert set(RERUN_SOURCES) == {s.value for s in RUN_FINISHED}
    assert set(RERUN_SOURCES) <= set(run_sources(RunStatus.RUNNING))


def test_every_statement_is_short_enough_for_psycopgs_parse_cache() -> None:
    """Past PSYCOPG_CACHED_LENGTH characters psycopg parses a statement's placeholders again
    at every execution (the claim did, on every claim)."""
    import importlib

    for module in (
        "workflows.engine.sql", "workflows.engine.sql.migration", "timers.sql", "effects.sql",
    ):  # fmt: skip
        statements = vars(importlib.import_module(module))
        for name, statement in statements.items():
            if isinstance(statement, str) and not name.startswith("__"):
                assert len(statement) <= sql.PSYCOPG_CACHED_LENGTH, f"{module}.{name}"
