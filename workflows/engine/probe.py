"""The `probe` step type, for the crash and fencing tests and the benchmarks only.

It runs on the io lane and can sleep, fail, or kill its own worker on chosen attempts. It is
registered only when WAYMARK_ENABLE_PROBE_STEPS is true (the test settings turn it on): a
production automation can never contain a step that kills workers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from ..definitions.registry import StepReport, StepType, registry
from .executors import StepFailure, StepResult, current_attempt, lease_lost, register_executor

FIELDS = {"sleep_seconds", "sleep_attempts", "fail_attempts", "crash_attempts", "output"}


def _validate(step: Mapping[str, Any], report: StepReport) -> None:
    for name in step:
        if name not in FIELDS | {"id", "type", "next", "name", "retry", "on_failure"}:
            report.error(name, f"unknown field {name!r}")
    sleep = step.get("sleep_seconds", 0)
    if not isinstance(sleep, int | float) or not 0 <= sleep <= 120:
        report.error("sleep_seconds", "must be a number from 0 to 120")
    for name in ("sleep_attempts", "fail_attempts", "crash_attempts"):
        value = step.get(name, 0)
        if not isinstance(value, int) or value < 0:
            report.error(name, "must be a non-negative integer")


def run_probe(step: Mapping[str, Any], context: Mapping[str, Any]) -> StepResult:
    attempt = current_attempt()
    if attempt <= step.get("crash_attempts", 0):
        os._exit(137)  # as if the worker were SIGKILLed mid-step
    if attempt <= step.get("sleep_attempts", attempt):
        # Sleep in slices and stop early once the lease is lost, as a long step should.
        deadline = time.monotonic() + step.get("sleep_seconds", 0)
        while time.monotonic() < deadline and not lease_lost():
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    if attempt <= step.get("fail_attempts", 0):
        raise StepFailure(f"probe failure on attempt {attempt}")
    return StepResult(
        output={"pid": os.getpid(), "attempt": attempt, **step.get("output", {})}, outcome="ok"
    )


PROBE = StepType(name="probe", lane="io", validate=_validate, built=True, app="workflows")


def register_probe() -> None:
    registry.register(PROBE)
    register_executor("probe", run_probe)
