"""The tests' `probe` step type, for the crash, fencing and race tests.

It runs on the io lane and can sleep, hang (ignore being told to stop), fail, park (wait for
a wake or a deadline), or kill its own worker on chosen attempts. It lives here, with the
tests, and not in the engine: a production installation cannot contain a step that kills
workers. It registers itself when this module is imported, which a process does at start-up
when ``WAYMARK_EXTRA_STEP_MODULES`` names it: the test settings
(waymark_config/settings_test.py) and the engine processes the tests start
(tests/processes.py) do.

Fields (all optional):

sleep_seconds   sleep this long (0 to 120) before finishing, stopping early on lease_lost.
sleep_attempts  sleep only while the attempt number is at most this (default: every one).
fail_attempts   fail (retryably) while the attempt number is at most this.
crash_attempts  kill the worker process (os._exit) while the attempt number is at most this.
hang_seconds    with hang_attempts: sleep this long (0 to 3600) deaf to being told to stop.
hang_attempts   hang while the attempt number is at most this.
park_seconds    park (wait without a worker) until woken, or until this many seconds pass.
park_outcome    the outcome taken when the park's deadline passes; without it the step
                becomes ready and runs again.
output          an object merged into the output {"pid": ..., "attempt": ...}.
clock           true: the output carries "clock", this process's time.time() as it finished
                (the clock-skew tests compare it with the database's).
lock_wait_attempts  while the attempt number is at most this, wait for its run's row lock
                with a lock_timeout of 100 ms, as a step's own statement waits behind a slow
                transaction (a test holding the lock makes it fail with LockNotAvailable).

No outcomes of its own: ``next`` is one step id.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from django.db import connection, transaction

from workflows.plugins import (
    Park,
    StepContext,
    StepFailure,
    StepReport,
    StepResult,
    StepType,
    register_step_type,
)

FIELDS = {
    "sleep_seconds", "sleep_attempts", "fail_attempts", "crash_attempts", "output",
    "park_seconds", "park_outcome", "hang_seconds", "hang_attempts", "clock",
    "lock_wait_attempts",
}  # fmt: skip


def _validate(step: Mapping[str, Any], report: StepReport) -> None:
    for name in step:
        if name not in FIELDS | {"id", "type", "next", "name", "retry", "on_failure"}:
            report.error(name, f"unknown field {name!r}")
    sleep = step.get("sleep_seconds", 0)
    if not isinstance(sleep, int | float) or not 0 <= sleep <= 120:
        report.error("sleep_seconds", "must be a number from 0 to 120")
    park = step.get("park_seconds")
    if park is not None and (not isinstance(park, int | float) or not 0 <= park <= 86_400):
        report.error("park_seconds", "must be a number of seconds from 0 to 86400")
    if not isinstance(step.get("park_outcome", ""), str):
        report.error("park_outcome", "must be a string")
    hang = step.get("hang_seconds", 0)
    if not isinstance(hang, int | float) or not 0 <= hang <= 3600:
        report.error("hang_seconds", "must be a number from 0 to 3600")
    for name in ("sleep_attempts", "fail_attempts", "crash_attempts", "hang_attempts",
                 "lock_wait_attempts"):  # fmt: skip
        value = step.get(name, 0)
        if not isinstance(value, int) or value < 0:
            report.error(name, "must be a non-negative integer")


def run_probe(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext) -> StepResult:
    attempt = ctx.attempt
    if "park_seconds" in step and ctx.woken_with is None:
        # Wait for a wake (wake_step) or the deadline; a wake to ready runs it again.
        return StepResult(
            output={"parked_by": os.getpid()},
            park=Park(
                deadline_seconds=step["park_seconds"],
                on_deadline=step.get("park_outcome"),
                detail={"probe": True},
            ),
        )
    if attempt <= step.get("crash_attempts", 0):
        os._exit(137)  # as if the worker were SIGKILLed mid-step
    if attempt <= step.get("hang_attempts", 0):
        time.sleep(step.get("hang_seconds", 0))  # deaf to lease_lost: a hung executor
    if attempt <= step.get("sleep_attempts", attempt):
        # Sleep in slices and stop early once the lease is lost, as a long step should.
        deadline = time.monotonic() + step.get("sleep_seconds", 0)
        while time.monotonic() < deadline and not ctx.lease_lost.is_set():
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    if attempt <= step.get("lock_wait_attempts", 0):
        _wait_for_run_lock(ctx.run_id)
    if attempt <= step.get("fail_attempts", 0):
        raise StepFailure(f"probe failure on attempt {attempt}")
    output = {"pid": os.getpid(), "attempt": attempt, **step.get("output", {})}
    if step.get("clock"):
        output["clock"] = time.time()
    return StepResult(output=output, outcome="ok")


def _wait_for_run_lock(run_id: int) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '100ms'")
        cursor.execute("SELECT 1 FROM workflows_run WHERE id = %s FOR UPDATE", [run_id])


PROBE = StepType(
    name="probe", lane="io", validate=_validate, execute=run_probe, built=True, app="tests"
)

register_step_type(PROBE)  # a module constant: importing this again registers nothing new
