"""The engine's SQL transitions use only the sources declared in workflows/states.py."""

from __future__ import annotations

import re

import pytest

from workflows.engine import sql
from workflows.states import (
    RUN_TRANSITIONS,
    STEP_TRANSITIONS,
    RunStatus,
    StepStatus,
    run_sources,
    step_sources,
)

GUARD = re.compile(r"status\s*(?:=\s*'(\w+)'|IN\s*\(([^)]*)\))", re.IGNORECASE)


def guarded_sources(statement: str) -> set[str]:
    where = statement[statement.upper().rindex("WHERE") :]
    found: set[str] = set()
    for single, many in GUARD.findall(where):
        found |= {single} if single else {v.strip().strip("'") for v in many.split(",")}
    return found


@pytest.mark.parametrize(
    ("statement", "target"),
    [
        (sql.SETTLE_DONE, StepStatus.DONE),
        (sql.SETTLE_FAILED, StepStatus.FAILED),
        (sql.SETTLE_RETRY, StepStatus.READY),
        (sql.RELEASE, StepStatus.READY),
        (sql.CLAIM, StepStatus.RUNNING),
    ],
)
def test_step_transitions_use_declared_sources(statement: str, target: StepStatus) -> None:
    sources = guarded_sources(statement)
    assert sources, "every transition must guard on the current status"
    assert sources <= set(step_sources(target))


def test_run_finish_uses_declared_sources() -> None:
    for target in (RunStatus.SUCCEEDED, RunStatus.FAILED):
        assert guarded_sources(sql.UPDATE_RUN) == {"running"} <= set(run_sources(target))


def test_finished_states_are_final() -> None:
    for table in (RUN_TRANSITIONS, STEP_TRANSITIONS):
        for status, targets in table.items():
            if status in {"succeeded", "failed", "cancelled", "done"}:
                assert targets == frozenset(), status
