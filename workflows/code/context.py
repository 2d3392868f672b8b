"""Replay: a code workflow's function run from the top against the run's recorded steps.

Each ``ctx.<step>`` call is matched, in call order, with the run's next recorded step: the
same id and type give back its recorded result; another id or type is a run whose code
took a different path than its history (``nondeterministic_workflow``). The first call
with no recorded step stops the function (``Suspended``, carrying the step to enter). Each
call builds the step exactly as a definition would write it and checks it with its step
type's own validator, so a code workflow reaches the same step types, fields and
guarantees as a definition.

The exceptions that stop the function derive from BaseException: a workflow's own
``except Exception`` cannot swallow them. ``StepFailed``, a step that failed for good, is an
ordinary exception: the function may catch it and go on. A bare ``except:``, an ``except
BaseException`` or a ``finally`` around a call does see the stop; the turn still ends with
it: every later call of the same turn raises it again, and a function that returns after it
(the stop swallowed) is stopped by it all the same (``Stop``, ``Context._entry``). So a
``finally``'s own calls run in the turn where the block really ends, as the code reads.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import random as _random
import re
import threading
import uuid as _uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple, NoReturn, Protocol

from ..definitions.fields import is_step_id
from ..definitions.registry import StepReport, StepType, registry
from ..definitions.rendering import plain_copy
from ..definitions.sagas import irreversible_problem
from ..definitions.step_checks import StepChecks
from ..definitions.storable import (
    UNSTORABLE_REASON,
    has_unstorable,
    storable_text,
    unstorable_path,
)
from ..engine.decided import COMPENSATION_RECORD, branch_decider_id
from ..engine.executors import message_of
from ..engine.lanes import engine_setting
from ..engine.walk import ERROR_KEPT, step_failed_error
from ..errors import InvalidInput, PayloadTooLarge
from ..services.runs import MAX_INPUT_DEPTH, check_json_value
from ..states import StepStatus
from .budget import outside_budget
from .people_and_time import PeopleAndTime

DECIDER_ID = "decide"  # the step that runs the function (steptypes.CODE); no call may use it
CODE_TYPE = "code"  # its type's name
RESULT_TYPE = "code_result"  # the step that records what ctx.run's function returned

# The ids of the steps that record what ctx.now(), ctx.uuid(), ctx.random() and
# ctx.patched() answered (code_result steps, one iteration per call). A dot is not allowed
# in a step id a workflow calls (is_step_id), so they never meet a call's own id.
NOW_ID = "ctx.now"
UUID_ID = "ctx.uuid"
RANDOM_ID = "ctx.random"
PATCH_ID = "ctx.patched"
COMPENSATE_ID = COMPENSATION_RECORD  # what ctx.compensate_with records (engine/decided.py)

# ctx.run's retry policy: the fields of a definition's ``retry``, and their bounds.
RETRY_FIELDS = ("max_attempts",)
MOST_ATTEMPTS = 100

# ctx.parallel: the engine's own fork and join (engine/forks.py), its branches each decided
# by a decider of their own (engine/decided.py). Its id leaves room, within a step id's 63
# characters, for its branches' deciders' ids and its join's (``<id>.join``).
PARALLEL_TYPE = "parallel"
MAX_STEP_ID = 63  # a step row's step_id (models.Step)
MAX_PARALLEL_ID = 56
MAX_BRANCHES = 100


class Recorded(NamedTuple):
    """One step the run entered, as replay reads it (history.py), in call order. A named
    tuple: each turn of a code run makes one or two, which cost a frozen dataclass several
    times as much to make and to copy with a change."""

    step_id: str
    iteration: int
    type: str
    status: str
    output: Any
    outcome: str | None = None  # what it ended with, when its step type has outcomes
    error: str = ""  # why it failed, when it failed for good


# The live ctx.parallel ids and branch numbers from a replay's level down to the branch its
# turn decides (a branch's decider's ``within``, engine/decided.py).
Deciding = tuple[tuple[str, int], ...]


class JoinState(Protocol):
    @property
    def status(self) -> str: ...  # its join row's: done once the branches have met


class Forks(Protocol):
    """What a replay reads of every place of the run (history.History): the top level's
    steps and each ``ctx.parallel`` branch's, by (join row id, branch)."""

    @property
    def joins(self) -> Mapping[int, JoinState]: ...  # by join row id

    @property
    def returned(self) -> Mapping[tuple[int | None, int | None], Any]: ...  # each branch's

    @property
    def deciding_at(self) -> tuple[int | None, int | None]: ...  # the deciding turn's place

    def of(self, where: tuple[int | None, int | None]) -> list[Recorded]: ...

    @property
    def places(self) -> Mapping[tuple[int | None, int | None], list[Recorded]]: ...


class Stop(BaseException):
    """The function stops here (see the module's note on BaseException). The first one a
    turn makes is kept as its stop (``_TURN``, Context.raise_stop): caught by the code, it
    ends the turn all the same."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        stops: list[Stop] | None = getattr(_TURN, "stops", None)
        if stops is not None and not stops:
            stops.append(self)


# This thread's turn: the list its stop goes to (Context.__init__ sets it for a replay's top
# level; its branches share it).
_TURN = threading.local()


class Suspended(Stop):
    """The function called a step with no recorded result: ``step`` is to be entered. In a
    dry replay, also a call whose recorded step has not ended (``recorded``: the run is at
    it, it is not new work)."""

    def __init__(self, step: dict[str, Any], *, recorded: bool = False) -> None:
        super().__init__(step["id"])
        self.step = step
        self.recorded = recorded


class BranchReturned(Stop):
    """A branch's function returned ``value``: its decider ends the branch (it arrives at
    its join)."""

    def __init__(self, value: Any) -> None:
        super().__init__("returned")
        self.value = value


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


class BranchStepFailed(Stop):
    """A step of a ctx.parallel branch failed for good and the branch did not catch its
    StepFailed: the branch's decider fails with the step's own error, as the top level's turn
    does (``step '<id>' failed: ...``). A stop, not the StepFailed: the code around the
    ctx.parallel may not catch it."""


class RetryCall(Stop):
    """A ``ctx.run`` function raised with attempts left: the turn fails retryably, and the
    engine runs it again after its lane's backoff (the decider's own retry schedule)."""

    def __init__(self, step_id: str, attempt: int, most: int, error: str) -> None:
        super().__init__(f"step {step_id!r} attempt {attempt} of {most}: {error}")


class StepFailed(Exception):
    """A step the function called failed for good (its attempts used up, or refused): raised
    at the call, on the turn after it failed and on every later replay. ``step_id`` and
    ``iteration`` name it; ``error`` is the step's error as its row keeps it, ``code`` the
    code it begins with (``max_age_exceeded: ...``, ``ValueError: ...``), or
    ``step_failed`` when it begins with none. Not caught, it fails the run with
    ``step '<id>' failed: <error>`` (after compensating, docs/reference/code-workflows.md)."""

    def __init__(self, step_id: str, iteration: int, error: str) -> None:
        super().__init__(step_failed_error(step_id, error))
        self.step_id = step_id
        self.iteration = iteration
        self.error = error
        head = error.split(":", 1)[0].strip() if ":" in error else ""
        self.code = head if head.isidentifier() else "step_failed"


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

    def __bool__(self) -> bool:
        # Always true as a dataclass: `if signal:` read a timeout as a signal.
        raise TypeError("SignalResult is neither true nor false: test result.timed_out")


class Context(PeopleAndTime):
    """What a code workflow's function is given: its run, its input, and the steps it may
    call. Every method that enters a step takes the step's id first (unique per call site;
    calling the same id again enters its next iteration). Approvals, tasks, sleeps and
    waits until a moment are PeopleAndTime's (people_and_time.py)."""

    def __init__(
        self,
        *,
        run_id: int,
        history: Sequence[Recorded],
        forks: Forks | None = None,
        deciding: Deciding | None = None,
        at: tuple[int, ...] = (),
        attempts_used: int = 1,
        lost_claims_allowed: int = 1,
        dry: bool = False,
        calls_functions: bool = True,
        within: Context | None = None,
    ) -> None:
        self.run_id = run_id
        self._history = history
        # A dry replay (a migration's check of another version's code against the history)
        # stops at the first new work without calling a ctx.run function.
        self._dry = dry
        self._calls_functions = calls_functions  # False: a turn inline in a settle
        self._position = 0
        self._patches: dict[str, bool] = {}  # each patch's answer, once asked in this replay
        self._forks = forks  # every place's history (history.py), for ctx.parallel
        # Set when this replay decides a branch: the live ctx.parallel ids and branch
        # numbers down to it, from this context's level. This level then only replays up to
        # the first of them, and must not do new work of its own.
        self._deciding = deciding
        # The ctx.parallel whose branch this replay is running now, when it runs one: a call
        # on this context from inside the branch is a call on the wrong context.
        self._running_branch_of: str | None = None
        # The branch this context is, as branch numbers from the top level down (ctx.parallel
        # gives each branch its own): the top level's is empty.
        self._at = at
        # This turn's attempt (a ctx.run's retries are the turn's), and how many attempts a
        # turn may take whose claims never settled (its worker died) before it gives up.
        self._attempts_used = attempts_used
        self._lost_claims_allowed = lost_claims_allowed
        self.attempts_allowed = lost_claims_allowed  # the new call's (ctx.run's retry raises it)
        self._last: Recorded | None = None  # the workflow's own call replayed last
        self._compensated: set[tuple[str, int]] = set()  # executions given a compensation
        # Each step id's type (step_type_conflict): as the history holds it in every place
        # (a branch's new call meets a sibling branch's steps, which this turn never
        # replays), then as this replay calls it.
        self._types: dict[str, str] = {} if forks is None else _types_recorded(forks)
        # The turn's stop, once a call raised one, and the ctx.run function running now, if
        # one is (no step is called from inside it): a branch's are its replay's (``within``).
        if within is None:
            self._stopped: list[Stop] = []
            self._in_function: list[str] = []
            _TURN.stops = self._stopped
        else:
            self._stopped, self._in_function = within._stopped, within._in_function

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
        if self._stopped or self._in_function:
            self._entry("ctx.patched")
        _check_patch(patch)
        if patch in self._patches:
            if self._patch_recorded_next(patch):
                # A branch's own record of it, made before a branch shared the answer of the
                # replay around it: the branch took the patch then, and its history says so.
                self._replayed(PATCH_ID, RESULT_TYPE)
                return True
            return self._patches[patch]
        if self._position >= len(self._history):  # new work: this run takes the patch
            self._new_work(PATCH_ID)
            raise Suspended({"id": PATCH_ID, "type": RESULT_TYPE, "output": {"patch": patch}})
        taken = self._patch_recorded_next(patch)
        if taken:
            self._replayed(PATCH_ID, RESULT_TYPE)
        self._patches[patch] = taken
        return taken

    def deprecate_patch(self, patch: str) -> None:
        """Retire ``patch`` once every run that takes its old path has ended: the code keeps
        only the new path and calls this where it called ``patched(patch)``. A run that
        recorded the patch replays past its record; a run that reaches this point with
        nothing recorded records nothing. Remove this call too once no run that recorded the
        patch can be replayed. A run whose history took the old path fails at its next
        recorded step (``nondeterministic_workflow``), as it would without the patch."""
        if self._stopped or self._in_function:
            self._entry("ctx.deprecate_patch")
        _check_patch(patch)
        self._patches[patch] = True  # ``patched(patch)`` asked later in this replay agrees
        if self._patch_recorded_next(patch):
            self._replayed(PATCH_ID, RESULT_TYPE)

    def _patch_recorded_next(self, patch: str) -> bool:
        """Whether the history's next step is the record of ``patch`` (``patched``'s)."""
        if self._position >= len(self._history):
            return False
        recorded = self._history[self._position]
        marker = recorded.output if (recorded.step_id, recorded.type) == (
            PATCH_ID, RESULT_TYPE) else None  # fmt: skip
        return isinstance(marker, Mapping) and marker.get("patch") == patch

    def _recorded_value(self, step_id: str, make: Callable[[], Any]) -> Any:
        """The value this call recorded, or a new one, recorded as a step of its own."""
        recorded = self._replayed(step_id, RESULT_TYPE)
        if recorded is not None:
            return recorded.output
        raise Suspended({"id": step_id, "type": RESULT_TYPE, "output": make()})

    # --- steps -------------------------------------------------------------------------------

    def step(self, step_id: str, step_type: str, **fields: Any) -> Any:
        """Enter a step of any registered type, with the fields a definition's step of that
        type has (docs/reference/definitions.md); its recorded output once it has one."""
        # Without making the outcome's object (the call workflows make most).
        return self._entered(step_id, step_type, fields).output

    def step_result(self, step_id: str, step_type: str, **fields: Any) -> StepOutcome:
        """``step``, giving back the step's outcome with its output."""
        recorded = self._entered(step_id, step_type, fields)
        return StepOutcome(recorded.output, recorded.outcome)

    def _entered(self, step_id: str, step_type: str, fields: Mapping[str, Any]) -> Recorded:
        """The call's recorded step; with none, the turn stops here, asking for it."""
        recorded = self._replayed(step_id, step_type)
        if recorded is None:
            raise Suspended(_checked_step(step_id, step_type, fields))
        return recorded

    def run(
        self,
        step_id: str,
        function: Callable[..., Any],
        *args: Any,
        retry: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call ``function(*args, **kwargs)`` as a step: on a worker, once its result is
        recorded never again for this run (at least once: a worker lost before the record
        commits calls it again). The result must be a JSON value. ``retry``
        (``{"max_attempts": N}``, a definition's ``retry``): a function that raises is called
        again after the engine's backoff, up to N times in all; then (and at once without
        ``retry``) the call raises ``StepFailed``."""
        recorded = self._replayed(step_id, RESULT_TYPE)
        if recorded is not None:
            return recorded.output
        _check_call(step_id, RESULT_TYPE)
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            # Called, it would only make a coroutine (never awaited, a warning in the log).
            raise CodeFailure(
                "invalid_code_step",
                f"ctx.run {step_id!r}: an async function; ctx.run calls plain functions "
                "(run it with asyncio.run inside one)",
            )
        most = _max_attempts(step_id, retry)
        if self._dry:
            raise Suspended({"id": step_id, "type": RESULT_TYPE})
        if not self._calls_functions:
            raise RunsOnWorker(step_id)
        attempt = self._attempts_used
        self.attempts_allowed = max(most, self._lost_claims_allowed)
        if attempt > self.attempts_allowed:  # its earlier attempts' workers died in the call
            self.attempts_allowed = attempt  # recorded as failed, for the code to be told
            self._failed(step_id, f"attempts exhausted: {attempt - 1} attempt(s) never settled")
        try:
            with outside_budget():  # the function's time is the lane's step timeout's
                self._in_function.append(step_id)
                try:
                    output = function(*args, **kwargs)
                finally:
                    self._in_function.pop()
        except Exception as exc:  # the function's own failure: retried, then told to the code
            error = f"{type(exc).__name__}: {message_of(exc)}"
            if attempt < most:
                raise RetryCall(step_id, attempt, most, error) from None
            # Its last attempt: of those it allows, or later, after attempts whose worker
            # died in the call (which the io lane's attempts allow more of).
            self._failed(step_id, f"{error} (attempt {attempt} of {max(attempt, most)})")
        check_json(step_id, output)
        within_stored_limits(step_id, output, "result_too_large", f"The result of step {step_id!r}")
        raise Suspended({"id": step_id, "type": RESULT_TYPE, "output": output})

    @staticmethod
    def _failed(step_id: str, error: str) -> NoReturn:
        """Record ``step_id`` as failed for good: the next turn raises StepFailed here."""
        # Stored in the turn's output (jsonb, which refuses a NUL), as the exception read.
        failed = storable_text(error)[:ERROR_KEPT]
        raise Suspended({"id": step_id, "type": RESULT_TYPE, "failed": failed})

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
        fields = _http_fields(method, url, connection, headers, body)
        return self.step(step_id, "http", **fields)

    # --- sagas -------------------------------------------------------------------------------

    def compensate_with(self, step_id: str, step_type: str, **fields: Any) -> None:
        """Register the step that undoes the call just before this one (its execution: a
        call in a loop registers one per iteration). If the run fails afterwards, the engine
        enters the registered steps, latest first, as a definition's compensations
        (docs/reference/sagas.md, "Sagas and compensation"); the run then ends ``compensated``.
        Recorded as a step of its own (``ctx.compensate``), so every replay and every
        worker after a crash finds it."""
        target = self._last
        if target is None or target.status != StepStatus.DONE:
            what = "no step" if target is None else f"step {target.step_id!r}, which failed,"
            raise CodeFailure(
                "invalid_code_step",
                f"compensate_with({step_id!r}) follows {what}: it must follow the completed "
                "step it undoes",
            )
        # Its id names one step of one type too: a plan enters it as any other step.
        _check_type(step_id, step_type, self._types.get(step_id))
        self._types[step_id] = step_type
        execution = (target.step_id, target.iteration)
        if execution in self._compensated:
            raise CodeFailure(
                "invalid_code_step",
                f"step {target.step_id!r} #{target.iteration} has a compensation already",
            )
        self._compensated.add(execution)
        if self._replayed(COMPENSATE_ID, RESULT_TYPE) is not None:
            return
        call = _checked_step(step_id, step_type, fields)
        record = {"compensates": target.step_id, "iteration": target.iteration, "call": call}
        raise Suspended({"id": COMPENSATE_ID, "type": RESULT_TYPE, "output": record})

    def compensate_with_http(
        self,
        step_id: str,
        *,
        method: str,
        url: str,
        connection: str | None = None,
        headers: Mapping[str, str] | None = None,
        body: Any = None,
    ) -> None:
        """``compensate_with`` an http effect step, with ``ctx.http``'s fields."""
        fields = _http_fields(method, url, connection, headers, body)
        self.compensate_with(step_id, "http", **fields)

    def wait_signal(
        self, step_id: str, *, signal: str, correlation: str = "", timeout: str | None = None
    ) -> SignalResult:
        """Wait for the signal ``signal`` (with ``correlation``) without holding a worker,
        until ``timeout``."""
        fields: dict[str, Any] = {"signal": signal}
        if correlation != "":  # (0 is a correlation the step type refuses as not a string)
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

    def parallel(
        self, step_id: str, *branches: Callable[[Context], Any], complete: str | int = "all"
    ) -> list[Any]:
        """Run ``branches`` at the same time, each a function given a context of its own
        (``branch(c)``) that calls steps on it, and go on once they have met: every one
        (``complete="all"``), the first (``"first"``) or ``N`` of them. The list of what each
        returned, in branch order; None for a branch its join did not wait for (cancelled
        as a definition's branches are). A branch may call ``parallel`` on its own context:
        parallels nest, as a definition's do."""
        if self._stopped or self._in_function:
            self._entry("ctx.parallel")
        _check_parallel(step_id, branches, complete)
        recorded = self._replayed(step_id, PARALLEL_TYPE)
        if recorded is None:
            ids = [branch_decider_id(step_id, n, self._at) for n in range(len(branches))]
            _check_branch_ids(step_id, ids)
            raise Suspended(
                {"id": step_id, "type": PARALLEL_TYPE, "branches": ids, "complete": complete}
            )
        output = recorded.output if isinstance(recorded.output, Mapping) else {}
        join_row, names = output.get("join_row"), output.get("branches")
        if not isinstance(names, list) or len(names) != len(branches):
            raise CodeFailure(
                "nondeterministic_workflow",
                f"ctx.parallel {step_id!r} has {len(names or [])} branches in the history, "
                f"but the code called it with {len(branches)}",
            )
        recorded_complete = output.get("complete", complete)
        if recorded_complete != complete:  # (a bool is refused above: True is not 1 here)
            raise CodeFailure(
                "nondeterministic_workflow",
                f"ctx.parallel {step_id!r} waits for {_complete_words(recorded_complete)} in "
                f"the history, but the code called it with complete={complete!r}",
            )
        forks = self._forks
        assert forks is not None and isinstance(join_row, int), "a replay reads its forks"
        join = forks.joins.get(join_row)
        if join is not None and join.status == StepStatus.DONE:
            return [forks.returned.get((join_row, number)) for number in range(len(branches))]
        if self._dry:  # the branches have not met: each must fit its own history too
            self._dry_branches(step_id, branches, join_row)
            raise Suspended({"id": step_id, "type": PARALLEL_TYPE})
        if not self._deciding or self._deciding[0][0] != step_id:
            raise CodeFailure(
                "nondeterministic_workflow",
                f"the code went on past ctx.parallel {step_id!r} before its branches met",
            )
        (_, number), *inner = self._deciding
        self._decide_branch(step_id, branches, join_row, number, tuple(inner))

    def _dry_branches(
        self, step_id: str, branches: Sequence[Callable[[Context], Any]], join_row: int
    ) -> None:
        """A dry replay (a migration's check) of each branch against its own history, up to
        its first new work or the step it is at: a misfit raises CodeFailure."""
        assert self._forks is not None
        for number, branch_function in enumerate(branches):
            # Each branch a replay of its own (its stop is its own, met here), then this one's
            # again.
            branch = Context(run_id=self.run_id, history=self._forks.of((join_row, number)),
                             forks=self._forks, at=(*self._at, number), dry=True)  # fmt: skip
            branch._types.update(self._types)
            self._running_branch_of = step_id
            try:
                branch_function(branch)
                branch.returned()
            except Suspended:
                continue  # new work, or the step it is at: it fits up to there
            except Exception as exc:
                try:
                    branch.raise_stop()  # raised after a call stopped it (a finally's raise)
                except Suspended:
                    continue  # as above: the call it stopped at is where it fits up to
                raise failure_of(exc) from None
            finally:
                self._running_branch_of = None
                branch.end_turn()
                _TURN.stops = self._stopped

    def _decide_branch(
        self,
        step_id: str,
        branches: Sequence[Callable[[Context], Any]],
        join_row: int,
        number: int,
        inner: Deciding,
    ) -> NoReturn:
        """Replay branch ``number`` against its own history: the step it asks for next
        (Suspended), or what it returned (BranchReturned). With ``inner`` parallels to go
        through (the deciding branch is nested in this one), the branch replays up to the
        next of them, and so on down."""
        assert self._forks is not None
        if not inner and self._forks.deciding_at != (join_row, number):
            raise CodeFailure(
                "nondeterministic_workflow",
                f"branch {number} is not a branch of the ctx.parallel the code reached",
            )
        branch = Context(run_id=self.run_id, history=self._forks.of((join_row, number)),
                         forks=self._forks, deciding=inner or None, at=(*self._at, number),
                         attempts_used=self._attempts_used,
                         lost_claims_allowed=self._lost_claims_allowed,
                         calls_functions=self._calls_functions, within=self)  # fmt: skip
        branch._types.update(self._types)  # the top level's, replayed up to this parallel
        branch._patches.update(self._patches)  # one answer per patch in the run's replay
        self._running_branch_of = step_id
        try:
            value = branches[number](branch)
            branch.raise_stop()
        except Suspended:
            # The branch's new call sets the turn's attempts (a ctx.run's retry raises them).
            self.attempts_allowed = branch.attempts_allowed
            raise
        except StepFailed as failed:  # not caught by the branch: its decider fails with it
            branch.raise_stop()  # (raised after a call stopped the turn: the stop ends it)
            raise BranchStepFailed(str(failed)) from None
        except Exception as exc:  # kept from the top level's own `except Exception`
            branch.raise_stop()
            raise failure_of(exc) from None
        finally:
            self._running_branch_of = None
        if inner:  # the deciding branch is inside a ctx.parallel this branch never reached
            raise CodeFailure(
                "nondeterministic_workflow",
                f"the code returned before ctx.parallel {inner[0][0]!r}",
            )
        branch.returned()
        decider_id = branch_decider_id(step_id, number, self._at)
        check_json(decider_id, value)
        # Stored in its decider's row, as a ctx.run result is in its own.
        what = f"The value branch {number} of ctx.parallel {step_id!r} returned"
        within_stored_limits(decider_id, value, "result_too_large", what)
        raise BranchReturned(value)

    def fail(self, reason: str) -> NoReturn:
        """End the run as failed, with ``reason`` in its error."""
        if self._stopped or self._in_function:
            self._entry("ctx.fail")
        raise CodeFailure("workflow_failed", str(reason))

    # --- replay ------------------------------------------------------------------------------

    def _replayed(self, step_id: str, step_type: str) -> Recorded | None:
        """The recorded step this call replays, or None when the call is new work."""
        if self._stopped or self._in_function:
            self._entry(f"step {step_id!r} ({_call_of(step_type)})")
        if self._position >= len(self._history):
            _check_type(step_id, step_type, self._types.get(step_id))
            self._new_work(step_id)
            return None
        recorded = self._history[self._position]
        if (recorded.step_id, recorded.type) != (step_id, step_type):
            raise CodeFailure(
                "nondeterministic_workflow",
                f"the history has step {recorded.step_id!r} ({recorded.type}) at call "
                f"{self._position + 1}, but the code called {step_id!r} ({step_type})",
            )
        if recorded.status == StepStatus.FAILED:
            self._position += 1
            self._types[step_id] = step_type
            self._last = recorded
            raise StepFailed(recorded.step_id, recorded.iteration, recorded.error)
        if recorded.status != StepStatus.DONE:
            if self._dry:  # the step the run is at, not ended yet: the history fits up to it
                raise Suspended({"id": step_id, "type": step_type}, recorded=True)
            raise CodeFailure(
                "nondeterministic_workflow",
                f"step {step_id!r} is {recorded.status} in the history, and the code went on",
            )
        self._position += 1
        self._types[step_id] = step_type
        # What the workflow's code is handed is a copy: the history this turn replays is the
        # next turn's too when it is carried (history.Turn), and a change the code makes to
        # a result must not reach the next replay of it, nor the run's values.
        recorded = _handed(recorded)
        if not step_id.startswith("ctx."):  # a value or a record, not a step it undoes
            self._last = recorded
        return recorded

    def _new_work(self, step_id: str) -> None:
        """A call with nothing recorded: refused while deciding a branch (the top level's
        history ends at the branch's ctx.parallel, so the code took another path)."""
        if self._running_branch_of is not None:
            # The branch's function called a step on the context around it (a closure over
            # ``ctx``), not on its own: no path changed, and saying so would mislead.
            raise CodeFailure(
                "invalid_code_step",
                f"{step_id!r} is called on the context around ctx.parallel "
                f"{self._running_branch_of!r} from inside its branch: a branch calls steps on "
                "its own context, the argument its function is given",
            )
        if self._deciding:
            raise CodeFailure(
                "nondeterministic_workflow",
                f"the code called {step_id!r} before reaching ctx.parallel "
                f"{self._deciding[0][0]!r}, whose branch this turn decides",
            )

    def _entry(self, what: str) -> None:
        """A call of the workflow's begins: after the turn's stop, the stop again (the code
        caught it); from inside a ctx.run function, refused."""
        self.raise_stop()
        if self._in_function:
            # Entered from inside, the step would run before the function's own result is
            # recorded, and the next replay would meet it where the code calls ctx.run.
            raise CodeFailure(
                "invalid_code_step",
                f"{what} is called inside the ctx.run function of step "
                f"{self._in_function[-1]!r}: a ctx.run function is plain Python; call steps "
                "from the workflow's own code",
            )

    def end_turn(self) -> None:
        """The turn is over: its stop is let go. Kept, it would hold its traceback's frames
        (this context among them): a cycle for the collector at every turn."""
        self._stopped.clear()
        if getattr(_TURN, "stops", None) is self._stopped:
            _TURN.stops = None

    def raise_stop(self) -> None:
        """The function returned, or a call began, after a call of this turn stopped it (a
        bare ``except``, ``except BaseException`` or ``finally`` around the call saw the
        stop): the turn ends with that stop."""
        if self._stopped:
            raise self._stopped[0]

    def returned(self) -> None:
        """The function returned: every recorded step must have been called again."""
        self.raise_stop()
        if self._position < len(self._history):
            left = self._history[self._position]
            raise CodeFailure(
                "nondeterministic_workflow",
                f"the history has step {left.step_id!r} ({left.type}) at call "
                f"{self._position + 1}, but the code returned before calling it",
            )


def failure_of(exc: Exception) -> CodeFailure:
    """The run's failure for an exception the workflow's code raised: ``workflow_failed``;
    ``invalid_code_step`` when it is a ctx call's own arguments (a keyword it does not take,
    one missing), raised at the code's call, not inside the call."""
    message = message_of(exc)
    called = _WRONG_CALL.match(message) if isinstance(exc, TypeError) else None
    if called is not None and not _raised_inside(exc):
        return CodeFailure("invalid_code_step", f"ctx.{called.group(1)}: {message}")
    return CodeFailure("workflow_failed", f"{type(exc).__name__}: {message}")


# Python's own words for a call whose arguments do not fit (3.10+ name the method's class).
_WRONG_CALL = re.compile(r"^(?:Context|PeopleAndTime)\.(\w+)\(\) (?:got|missing|takes)")
_HERE = os.path.dirname(__file__)


def _raised_inside(exc: BaseException) -> bool:
    """Whether ``exc`` was raised in this package's code (a method's own TypeError), not at
    the workflow's call of it."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == _HERE


def _handed(recorded: Recorded) -> Recorded:
    copied = plain_copy(recorded.output)
    return recorded if copied is recorded.output else recorded._replace(output=copied)


def _http_fields(
    method: str, url: str, connection: str | None, headers: Mapping[str, str] | None, body: Any
) -> dict[str, Any]:
    """An http step's fields (docs/reference/effect-people-code-steps.md, "http") from ctx.http's
    arguments."""
    request: dict[str, Any] = {"method": method, "url": url}
    if headers is not None:
        request["headers"] = dict(headers)
    if body is not None:
        request["body"] = body
    fields: dict[str, Any] = {"request": request}
    if connection is not None:
        fields["connection"] = connection
    return fields


def _max_attempts(step_id: str, retry: Mapping[str, Any] | None) -> int:
    """ctx.run's ``retry``, checked as a definition's ``retry`` is: its attempts in all."""
    if retry is None:
        return 1
    most = retry.get("max_attempts") if isinstance(retry, Mapping) else None
    unknown = sorted(set(retry) - set(RETRY_FIELDS)) if isinstance(retry, Mapping) else []
    if (
        unknown
        or not isinstance(most, int)
        or isinstance(most, bool)
        or not (1 <= most <= MOST_ATTEMPTS)
    ):
        raise CodeFailure(
            "invalid_code_step",
            f'step {step_id!r}: retry must be {{"max_attempts": N}} with N from 1 to '
            f"{MOST_ATTEMPTS}",
        )
    return most


def _types_recorded(forks: Forks) -> dict[str, str]:
    """Each step id's type in the run's history, in the branches of its ctx.parallels,
    compensations registered included (the step a ``ctx.compensate`` record names). The top
    level's need no reading ahead: a turn replays all of them (calls and registrations,
    which record their types) before any new call of its own."""
    types: dict[str, str] = {}
    for where, place in forks.places.items():
        if where == (None, None):
            continue
        for recorded in place:
            types.setdefault(recorded.step_id, recorded.type)
            if recorded.step_id == COMPENSATE_ID and isinstance(recorded.output, Mapping):
                call = recorded.output.get("call")
                if isinstance(call, Mapping):
                    types.setdefault(str(call.get("id")), str(call.get("type")))
    return types


def _check_type(step_id: str, step_type: str, entered_as: str | None) -> None:
    """A step id names one step of one type in a run: its iterations are that step again
    (effect keys, the run page's picture, the history). Another type under the same id is a
    mistake in the code, not a path that changed (nondeterministic_workflow)."""
    if entered_as is not None and entered_as != step_type:
        raise CodeFailure(
            "step_type_conflict",
            f"step {step_id!r} was entered as {_call_of(entered_as)} in this run, and the "
            f"code now calls it as {_call_of(step_type)}: give each step its own id",
        )


def _call_of(step_type: str) -> str:
    return "ctx.run" if step_type == RESULT_TYPE else f"a {step_type} step"


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
    if known.terminal:
        # It would end the run under the function: its output never checked against the
        # output schema, the function's later steps never called, a branch's sibling cut.
        raise CodeFailure(
            "invalid_code_step",
            f"step {step_id!r}: type {step_type!r} ends a run's path and cannot be called "
            "from code: the run ends when the function returns (or calls ctx.fail)",
        )


def _check_parallel(step_id: str, branches: Sequence[Any], complete: Any) -> None:
    if not is_step_id(step_id) or len(step_id) > MAX_PARALLEL_ID:
        raise CodeFailure(
            "invalid_code_step",
            f"{step_id!r} is not a valid ctx.parallel id (a lowercase letter, then up to "
            f"{MAX_PARALLEL_ID - 1} lowercase letters, digits or underscores)",
        )
    if step_id == DECIDER_ID:
        raise CodeFailure("invalid_code_step", f"step id {DECIDER_ID!r} is reserved")
    if not 1 <= len(branches) <= MAX_BRANCHES or not all(callable(b) for b in branches):
        raise CodeFailure(
            "invalid_code_step", f"ctx.parallel {step_id!r}: 1 to {MAX_BRANCHES} branch functions"
        )
    if isinstance(complete, bool) or not (
        complete in ("all", "first") or (isinstance(complete, int) and complete >= 1)
    ):
        raise CodeFailure("invalid_code_step", f'ctx.parallel {step_id!r}: complete must be '
                          '"all", "first" or a number of branches (1 or more)')  # fmt: skip
    if isinstance(complete, int) and complete > len(branches):
        raise CodeFailure("invalid_code_step", f"ctx.parallel {step_id!r}: complete is more "
                          f"than its {len(branches)} branches")  # fmt: skip


def _complete_words(complete: Any) -> str:
    """How many branches a recorded ``complete`` waits for, in words."""
    if complete == "all":
        return "all its branches"
    if complete == "first":
        return "its first branch"
    return f"{complete!r} of its branches"


def _check_patch(patch: Any) -> None:
    if not isinstance(patch, str) or not is_step_id(patch.replace("-", "_")):
        raise CodeFailure(
            "invalid_code_step",
            f"patch {patch!r}: a lowercase letter, then up to 62 lowercase letters, "
            "digits, hyphens or underscores",
        )


def _check_branch_ids(step_id: str, ids: Sequence[str]) -> None:
    """A nested ctx.parallel's branch deciders' ids name the branches around it too, and must
    still fit a step id's length."""
    longest = max(ids, key=len)
    if len(longest) > MAX_STEP_ID:
        raise CodeFailure(
            "invalid_code_step",
            f"ctx.parallel {step_id!r}: nested too deep for its branches' ids ({longest!r} is "
            f"{len(longest)} characters, at most {MAX_STEP_ID}): shorten the ids of the "
            "parallels around it, or nest fewer",
        )


def _checked_step(step_id: str, step_type: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The step as a definition would hold it, checked by its type's validator."""
    known = registry.get(step_type)
    key = _call_key(step_id, step_type, fields)
    if key is not None:
        seen = _checked_calls.get(key)
        if seen is not None and seen[0] is known:
            return dict(seen[1])
    step = _checked_anew(step_id, step_type, fields)
    if key is not None:
        if len(_checked_calls) >= MOST_CALLS_KEPT:
            _checked_calls.clear()
        _checked_calls[key] = (known, step)
    return dict(step)


# The calls found valid, by their id, type and fields, when every field is a plain scalar:
# a workflow makes the same calls run after run (a replay only checks the call it stops
# at, but every turn stops at one), and a check of the same call against the same step type
# (the object registered now: a type registered again is checked again) finds the same.
_checked_calls: dict[tuple[Any, ...], tuple[Any, dict[str, Any]]] = {}
MOST_CALLS_KEPT = 4096
_KEY_SCALARS = (str, int, bool, type(None))


def _call_key(step_id: str, step_type: str, fields: Mapping[str, Any]) -> tuple[Any, ...] | None:
    if not fields:
        return (step_id, step_type)
    if len(fields) > 8 or not all(type(value) in _KEY_SCALARS for value in fields.values()):
        return None
    return (step_id, step_type, *sorted((key, type(value), value) for key, value in fields.items()))


def _checked_anew(step_id: str, step_type: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    _check_call(step_id, step_type)
    for reserved in ("id", "type", "next", "on_failure", "compensate"):
        if reserved in fields:
            raise CodeFailure("invalid_code_step", f"step {step_id!r}: {reserved!r} is not a field")
    step = {"id": step_id, "type": step_type, **fields}
    check_json(step_id, step, "invalid_code_step")  # what the code called it with
    within_stored_limits(step_id, step, "invalid_code_step", f"The call of step {step_id!r}")
    report = StepReport(step_id)
    step_type_obj = registry.get(step_type)
    assert step_type_obj is not None
    _check_generic_fields(step, step_type_obj, report)
    step_type_obj.validate(step, report)
    if report.issues:
        problems = "; ".join(
            f"{field} {message} ({code})" for code, field, message in report.issues
        )
        raise CodeFailure("invalid_code_step", f"step {step_id!r}: {problems}")
    return step


def _check_generic_fields(step: dict[str, Any], step_type: StepType, report: StepReport) -> None:
    """The fields every step may have, whatever its type (``name``, ``retry``,
    ``irreversible``), checked as the definition validator checks them: the engine reads
    them as it reads a definition's (a retry's attempts, for one)."""
    checks = StepChecks(registry, {}, lambda code, _sid, _index, field, message: report.issue(
        code, field or "", message))  # fmt: skip
    checks.check_name(0, step["id"], step)
    checks.check_retry(0, step["id"], step, step_type)
    wrong = irreversible_problem(step)
    if wrong is not None:
        report.issue("invalid_field", "irreversible", wrong)


def within_stored_limits(label: str, value: Any, code: str, what: str) -> None:
    """``check_stored_size``, checked exactly only when the quick look (the value's JSON's
    length and brackets, read in C) cannot tell it is within the limits: most calls,
    results and outputs are a few fields. (json.dumps writes ASCII with spaces: never
    shorter than the stored, compact UTF-8 text; and a value cannot nest deeper than it has
    brackets.) ``value`` has passed ``check_json``."""
    try:
        written = json.dumps(value)
    except RecursionError:  # nested deeper than json.dumps goes: the exact check says how
        check_stored_size(label, value, code, what)
        raise
    too_long = len(written) > int(engine_setting("MAX_INPUT_BYTES"))
    if too_long or written.count("{") + written.count("[") > MAX_INPUT_DEPTH:
        check_stored_size(label, value, code, what)


def check_json(step_id: str, value: Any, code: str = "unserialisable_result") -> None:
    """``value`` (a result, an output; with ``code`` ``invalid_code_step``, a call's fields)
    is JSON that PostgreSQL can keep as it is: CodeFailure with ``code`` otherwise."""
    if _plain_json(value):  # (every call of a turn is checked: most are plain JSON)
        return
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:  # (RecursionError: nested too deep)
        raise CodeFailure(code, f"step {step_id!r}: not JSON: {exc}") from None
    if unstorable_path(value) is not None:
        raise CodeFailure(code, f"step {step_id!r}: {UNSTORABLE_REASON}")
    collision = colliding_keys(value)
    if collision is not None:
        first, second = collision
        raise CodeFailure(
            code,
            f"step {step_id!r}: not JSON: the keys {first!r} and {second!r} of one dict are "
            f"both {json_key(first)!r} in JSON, and one of the two values would be lost",
        )


def json_key(key: Any) -> str:
    """What a dict key becomes in JSON (json.dumps writes 1 as "1", True as "true")."""
    return key if isinstance(key, str) else json.dumps(key)


def colliding_keys(value: Any) -> tuple[Any, Any] | None:
    """Two keys of one dict in ``value`` that JSON writes the same (1 and "1"): stored, the
    value would keep only the last of the two. None when there are none. Called only for a
    value that json.dumps writes, so every key is a string, a number, a boolean or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if not all(type(key) is str for key in item):
                seen: dict[str, Any] = {}
                for key in item:
                    earlier = seen.setdefault(json_key(key), key)
                    if earlier is not key:
                        return earlier, key
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


_JSON_SCALARS = frozenset({str, int, bool, type(None)})
# An integer of at most this many bits (about 300 digits) is within the digits Python writes
# and reads (sys.get_int_max_str_digits, 4300 by default, and not less than 640).
_SURE_INT_BITS = 1000


def _plain_json(value: Any) -> bool:
    """Whether ``value`` is made only of what JSON holds as it is (dicts with string keys,
    lists, strings, integers, finite floats, booleans, None) and PostgreSQL stores: what
    ``check_json`` accepts, found without writing the JSON out. False says only "not sure":
    the full check decides, with its message."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            if has_unstorable(item):
                return False
        elif kind is dict:
            for key in item:
                if type(key) is not str or has_unstorable(key):
                    return False
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind is int:
            if item.bit_length() > _SURE_INT_BITS:  # past 4300 digits, json.dumps refuses it
                return False
        elif kind not in _JSON_SCALARS:
            return False
    return True


def check_stored_size(label: str, value: Any, code: str, what: str) -> None:
    """``value`` within the limits a run's input is held to (WAYMARK_MAX_INPUT_BYTES, 32
    levels of nesting): a ``ctx.run`` result and a workflow's output are stored in the
    run's rows as its input is."""
    try:
        check_json_value(value, label, what)
    except (PayloadTooLarge, InvalidInput) as exc:
        raise CodeFailure(code, exc.detail) from None
