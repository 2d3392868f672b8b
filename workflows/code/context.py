"""Replay: a code workflow's function run from the top against the run's recorded steps.

Each ``ctx.<step>`` call is matched, in call order, with the run's next recorded step: the
same id and type give back its recorded result; another id or type is a run whose code
took a different path than its history (``nondeterministic_workflow``). The first call
with no recorded step stops the function (``Suspended``, carrying the step to enter). Each
call builds the step exactly as a definition would write it and checks it with its step
type's own validator, so a code workflow reaches the same step types, fields and
guarantees as a definition.

The exceptions that stop the function derive from BaseException: a workflow's own
``except Exception`` cannot swallow them.
"""

from __future__ import annotations

import json
import random as _random
import uuid as _uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from ..definitions.fields import is_step_id
from ..definitions.registry import StepReport, registry
from ..definitions.storable import UNSTORABLE_REASON, unstorable_path
from ..states import StepStatus
from .budget import outside_budget

DECIDER_ID = "decide"  # the step that runs the function (steptypes.CODE); no call may use it
RESULT_TYPE = "code_result"  # the step that records what ctx.run's function returned

# The ids of the steps that record what ctx.now(), ctx.uuid(), ctx.random() and
# ctx.patched() answered (code_result steps, one iteration per call). A dot is not allowed
# in a step id a workflow calls (is_step_id), so they never meet a call's own id.
NOW_ID = "ctx.now"
UUID_ID = "ctx.uuid"
RANDOM_ID = "ctx.random"
PATCH_ID = "ctx.patched"


@dataclass(frozen=True)
class Recorded:
    """One step the run entered, as replay reads it (history.py), in call order."""

    step_id: str
    iteration: int
    type: str
    status: str
    output: Any
    outcome: str | None = None  # what it ended with, when its step type has outcomes


class Stop(BaseException):
    """The function stops here (see the module's note on BaseException)."""


class Suspended(Stop):
    """The function called a step with no recorded result: ``step`` is to be entered."""

    def __init__(self, step: dict[str, Any]) -> None:
        super().__init__(step["id"])
        self.step = step


class RunsOnWorker(Stop):
    """The function called ``ctx.run`` with no recorded result in a turn that runs inline in
    a settle (``Context(calls_functions=False)``): the host's function is not called under
    the run's lock; a worker's turn calls it (steptypes.decide)."""


class CodeFailure(Stop):
    """The run fails: ``code`` and ``detail`` say why (nondeterministic_workflow, an
    invalid step call, ctx.fail)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class StepOutcome:
    """What ``ctx.step_result`` gives back: the step's output and the outcome it ended with
    (the names a definition's mapped ``next`` chooses between: an email's ``ok`` or
    ``suppressed``, a signal wait's ``received`` or ``timed_out``, ...), or None for a step
    type without outcomes."""

    output: Any
    outcome: str | None


@dataclass(frozen=True)
class SignalResult:
    """What ``ctx.wait_signal`` gives back: the signal's payload, or that it timed out."""

    timed_out: bool
    payload: Any = None
    identity: Any = None


class Context:
    """What a code workflow's function is given: its run, its input, and the steps it may
    call. Every method that enters a step takes the step's id first (unique per call site;
    calling the same id again enters its next iteration)."""

    def __init__(
        self, *, run_id: int, history: Sequence[Recorded], calls_functions: bool = True
    ) -> None:
        self.run_id = run_id
        self._history = history
        self._calls_functions = calls_functions  # False: a turn inline in a settle
        self._position = 0
        self._patches: dict[str, bool] = {}  # each patch's answer, once asked in this replay

    # --- values recorded once ------------------------------------------------------------------

    def now(self) -> datetime:
        """The current time (UTC), recorded the first time: a replay gives back the same."""
        return datetime.fromisoformat(
            self._recorded_value(NOW_ID, lambda: datetime.now(UTC).isoformat())
        )

    def uuid(self) -> _uuid.UUID:
        """A random UUID (version 4), recorded the first time: a replay gives back the same."""
        return _uuid.UUID(self._recorded_value(UUID_ID, lambda: str(_uuid.uuid4())))

    def random(self) -> float:
        """A random float in [0, 1), recorded the first time: a replay gives back the same."""
        return float(self._recorded_value(RANDOM_ID, _random.random))

    def patched(self, patch: str) -> bool:
        """Whether this run takes the code of ``patch`` at this point: True for a run that
        reaches it for the first time on code that calls this (the answer is recorded),
        False for a run whose history was recorded here before the patch existed (its
        history has another step at this point). The first answer holds for the rest of
        the run's replay, wherever the same patch is asked again."""
        if not isinstance(patch, str) or not is_step_id(patch.replace("-", "_")):
            raise CodeFailure(
                "invalid_code_step",
                f"patch {patch!r}: a lowercase letter, then up to 62 lowercase letters, "
                "digits, hyphens or underscores",
            )
        if patch in self._patches:
            return self._patches[patch]
        if self._position >= len(self._history):  # new work: this run takes the patch
            raise Suspended({"id": PATCH_ID, "type": RESULT_TYPE, "output": {"patch": patch}})
        recorded = self._history[self._position]
        marker = recorded.output if (recorded.step_id, recorded.type) == (
            PATCH_ID, RESULT_TYPE) else None  # fmt: skip
        taken = isinstance(marker, Mapping) and marker.get("patch") == patch
        if taken:
            self._replayed(PATCH_ID, RESULT_TYPE)
        self._patches[patch] = taken
        return taken

    def _recorded_value(self, step_id: str, make: Callable[[], Any]) -> Any:
        """The value this call recorded, or a new one, recorded as a step of its own."""
        recorded = self._replayed(step_id, RESULT_TYPE)
        if recorded is not None:
            return recorded.output
        raise Suspended({"id": step_id, "type": RESULT_TYPE, "output": make()})

    # --- steps -------------------------------------------------------------------------------

    def step(self, step_id: str, step_type: str, **fields: Any) -> Any:
        """Enter a step of any registered type, with the fields a definition's step of that
        type has (docs/definitions.md); its recorded output once it has one."""
        return self.step_result(step_id, step_type, **fields).output

    def step_result(self, step_id: str, step_type: str, **fields: Any) -> StepOutcome:
        """``step``, giving back the step's outcome with its output."""
        recorded = self._replayed(step_id, step_type)
        if recorded is not None:
            return StepOutcome(recorded.output, recorded.outcome)
        raise Suspended(_checked_step(step_id, step_type, fields))

    def run(self, step_id: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``function(*args, **kwargs)`` as a step: on a worker, once its result is
        recorded never again for this run (at least once: a worker lost before the record
        commits calls it again). The result must be a JSON value."""
        recorded = self._replayed(step_id, RESULT_TYPE)
        if recorded is not None:
            return recorded.output
        _check_call(step_id, RESULT_TYPE)
        if not self._calls_functions:
            raise RunsOnWorker(step_id)
        with outside_budget():  # the function's time is the lane's step timeout's
            output = function(*args, **kwargs)
        check_json(step_id, output)
        raise Suspended({"id": step_id, "type": RESULT_TYPE, "output": output})

    def sleep(self, step_id: str, duration: str) -> None:
        """Wait ``duration`` ("90s", "15m", "2d", ...) without holding a worker: the wait
        step of definitions, woken by the timer sweep."""
        self.step(step_id, "wait", duration=duration)

    def http(
        self,
        step_id: str,
        *,
        method: str,
        url: str,
        connection: str | None = None,
        headers: Mapping[str, str] | None = None,
        body: Any = None,
    ) -> Any:
        """An http effect step (through the effect ledger, keyed run/step/iteration): its
        recorded output."""
        request: dict[str, Any] = {"method": method, "url": url}
        if headers is not None:
            request["headers"] = dict(headers)
        if body is not None:
            request["body"] = body
        fields: dict[str, Any] = {"request": request}
        if connection is not None:
            fields["connection"] = connection
        return self.step(step_id, "http", **fields)

    def wait_signal(
        self, step_id: str, *, signal: str, correlation: str = "", timeout: str | None = None
    ) -> SignalResult:
        """Wait for the signal ``signal`` (with ``correlation``) without holding a worker,
        until ``timeout``."""
        fields: dict[str, Any] = {"signal": signal}
        if correlation:
            fields["correlation"] = correlation
        if timeout is not None:
            fields["timeout"] = timeout
        ended = self.step_result(step_id, "wait_signal", **fields)
        output = ended.output
        if ended.outcome is not None:
            timed_out = ended.outcome == "timed_out"
        else:  # a step ended before outcomes were recorded: the output tells
            timed_out = not isinstance(output, Mapping) or "signal" not in output
        if timed_out or not isinstance(output, Mapping):
            return SignalResult(timed_out=True)
        return SignalResult(False, output.get("payload"), output.get("identity"))

    def fail(self, reason: str) -> NoReturn:
        """End the run as failed, with ``reason`` in its error."""
        raise CodeFailure("workflow_failed", str(reason))

    # --- replay ------------------------------------------------------------------------------

    def _replayed(self, step_id: str, step_type: str) -> Recorded | None:
        """The recorded step this call replays, or None when the call is new work."""
        if self._position >= len(self._history):
            return None
        recorded = self._history[self._position]
        if (recorded.step_id, recorded.type) != (step_id, step_type):
            raise CodeFailure(
                "nondeterministic_workflow",
                f"the history has step {recorded.step_id!r} ({recorded.type}) at call "
                f"{self._position + 1}, but the code called {step_id!r} ({step_type})",
            )
        if recorded.status != StepStatus.DONE:
            raise CodeFailure(
                "nondeterministic_workflow",
                f"step {step_id!r} is {recorded.status} in the history, and the code went on",
            )
        self._position += 1
        return recorded

    def returned(self) -> None:
        """The function returned: every recorded step must have been called again."""
        if self._position < len(self._history):
            left = self._history[self._position]
            raise CodeFailure(
                "nondeterministic_workflow",
                f"the history has step {left.step_id!r} ({left.type}) at call "
                f"{self._position + 1}, but the code returned before calling it",
            )


def _check_call(step_id: str, step_type: str) -> None:
    if not is_step_id(step_id):
        raise CodeFailure(
            "invalid_code_step",
            f"{step_id!r} is not a valid step id (a lowercase letter, then up to 62 "
            "lowercase letters, digits or underscores)",
        )
    if step_id == DECIDER_ID:
        raise CodeFailure("invalid_code_step", f"step id {DECIDER_ID!r} is reserved")
    known = registry.get(step_type)
    if known is None or not known.built:
        raise CodeFailure("invalid_code_step", f"step {step_id!r}: no step type {step_type!r}")
    if known.forks or known.joins or known.decides:
        raise CodeFailure(
            "invalid_code_step", f"step {step_id!r}: a {step_type} step cannot be called from code"
        )


def _checked_step(step_id: str, step_type: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The step as a definition would hold it, checked by its type's validator."""
    _check_call(step_id, step_type)
    for reserved in ("id", "type", "next", "on_failure", "compensate"):
        if reserved in fields:
            raise CodeFailure("invalid_code_step", f"step {step_id!r}: {reserved!r} is not a field")
    step = {"id": step_id, "type": step_type, **fields}
    check_json(step_id, step)
    report = StepReport(step_id)
    step_type_obj = registry.get(step_type)
    assert step_type_obj is not None
    step_type_obj.validate(step, report)
    if report.issues:
        problems = "; ".join(
            f"{field} {message} ({code})" for code, field, message in report.issues
        )
        raise CodeFailure("invalid_code_step", f"step {step_id!r}: {problems}")
    return step


def check_json(step_id: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CodeFailure("unserialisable_result", f"step {step_id!r}: not JSON: {exc}") from None
    if unstorable_path(value) is not None:
        raise CodeFailure("unserialisable_result", f"step {step_id!r}: {UNSTORABLE_REASON}")
