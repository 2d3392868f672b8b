"""What each built step type does when it runs, registered by type name.

Quick types (lane "inline") run inline in the walk, inside its transaction: they touch nothing
outside the database. Lane types run in a worker, outside any transaction. An executor is
called with the step's definition, the run's template context and a StepContext (who and
which attempt it is, its effect key, its deadline), and returns a StepResult, which may park
the step, or raises StepFailure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..definitions.registry import registry
from ..definitions.storable import storable_text


@dataclass(frozen=True)
class Park:
    """Returned by an executor (in ``StepResult.park``) to make its step wait.

    The step then holds no worker slot and no lease until it is woken through
    ``workflows.engine.waits.wake_step`` (a signal, a decision, a timer), or until
    ``deadline_seconds`` pass: then it ends with ``on_deadline`` as its outcome, or becomes
    ready to run again when ``on_deadline`` is None. ``detail`` says what it waits for (a
    signal name and correlation key, an approval id); it is stored and shown to operators.
    """

    deadline_seconds: float | None  # None: no deadline of its own (a timer row wakes it)
    on_deadline: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    # True when the park is not the step's doing (a broken connection, an exhausted budget):
    # the attempt that parked does not count against max_attempts.
    refund_attempt: bool = False
    # What the step waits for may happen between the executor's return and the park's commit
    # (a person resolves the effect in review): its wake then finds no parked step. Asked in
    # the park's transaction, under the run's lock, this returns the wake's payload when it
    # already happened (the step is woken at once), else None. The other side must lock the
    # run before it looks for parked steps, so one of the two always sees the other.
    woken_meanwhile: Callable[[Any], dict[str, Any] | None] | None = field(
        default=None, compare=False
    )
    # The same question for a wait whose wakers do not lock the run (a connection repaired,
    # a budget raised: they wake every step parked on a row of their own). Asked once the
    # park has committed, in a transaction of its own that holds no lock of the run yet; it
    # must read the awaited row with a lock that the waker's write conflicts with (FOR SHARE
    # against the waker's UPDATE), so that either the waker's search for parked steps comes
    # after the park's commit (and finds the step), or this read waits for the waker's
    # commit (and sees its change). A payload: the step is woken at once.
    woken_after_park: Callable[[Any], dict[str, Any] | None] | None = field(
        default=None, compare=False
    )


@dataclass
class StepResult:
    output: Any = None
    outcome: str | None = None  # picks the branch of a mapped `next`
    vars: dict[str, Any] = field(default_factory=dict)  # merged into the run's vars
    finish: str | None = None  # "succeeded" / "failed": this step ends the run
    park: Park | None = None  # the step waits instead of finishing (see Park)
    # What a decider's turn knew of its run when it asked for its step (the history it
    # replayed), handed to the run's next turn when that runs inline in the same walk
    # (Walk.carried); never stored.
    carried: Any = field(default=None, compare=False)


class StepFailure(Exception):
    """The step did not succeed. ``retryable=False`` skips the remaining attempts.

    ``retry_after`` (seconds) replaces the backoff before the next attempt (a provider's
    Retry-After wins over the schedule); ``error_class`` names the kind of failure
    ("rate_limited", "unavailable", "auth", ...) for the step type's retry policy."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = True,
        retry_after: float | None = None,
        error_class: str = "",
    ) -> None:
        # Stored as the step's and the run's error: a message made of what code raised (a
        # workflow's ctx.fail reason, an exception's text) may hold a NUL, which text refuses.
        super().__init__(storable_text(message))
        self.retryable = retryable
        self.retry_after = retry_after
        self.error_class = error_class


def message_of(exc: BaseException) -> str:
    """What ``exc`` says. An exception of the host's whose ``__str__`` raises (it reads an
    attribute its ``__init__`` never set, say) is named without it: raised from the handler
    that tells a step's failure (a worker's, a code run's), it would escape as the engine's
    own error, with a traceback."""
    try:
        return str(exc)
    except Exception as broken:
        return f"(its message cannot be read: {type(broken).__name__})"


class NotInline(Exception):
    """Raised by the executor of a worker type that a walk offered to run inline (a
    decider's turn, Walk.decide_inline): not here after all. The walk enters the step for a
    worker of its lane instead, as it would have without the offer; nothing it did counts."""


class StepDeferred(Exception):
    """Not now, and not the step's fault: run it again after ``seconds`` without counting
    this attempt (a connection at its concurrency cap, an open circuit breaker, an effect
    another attempt still holds). The wait is durable (the step's ``wake_at``).

    ``reason`` is for people; ``code`` (a stable word, e.g. ``workflow_version_missing``) and
    ``detail`` (JSON values) are for what reads the deferral back: both go in the step's
    ``step.deferred`` event beside the reason, so a check matches them, never the text."""

    def __init__(
        self,
        seconds: float,
        reason: str,
        *,
        code: str = "",
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(reason)
        self.seconds = max(0.0, seconds)
        self.reason = reason
        self.code = code
        self.detail: dict[str, Any] = dict(detail or {})


class _NeverLost(threading.Event):
    """The lease of a step run inline in the walk: no heartbeat watches it and nothing takes
    it over, so one event, never set, serves every such step (an Event of its own per
    inline step was a measurable part of a code run's turn)."""

    def set(self) -> None:
        raise RuntimeError("a step run inline in the walk has no lease to lose")


INLINE_LEASE: threading.Event = _NeverLost()


# Not frozen: made for every step a worker runs and every step run inline (several per
# settle of a code run), where a frozen dataclass's __init__ costs three times as much
# (object.__setattr__ per field). Nothing changes one once made.
@dataclass(slots=True)
class StepContext:
    """What an executor is told about the step execution it performs.

    ``effect_key`` identifies this step execution, not the attempt: ``run/step/iteration``,
    the same on every retry and after a crash, different for each pass of a loop. Outside
    calls are keyed by it so a retry finds the first attempt's effect; a loop's second pass
    is a real second send. (Wake-up message ids are the opposite: they include the attempt.)
    """

    org_id: int
    run_id: int
    step_id: str
    iteration: int
    attempt: int  # the fencing token; grows with every claim
    lane: str
    # When this attempt must be done (time.monotonic() clock); None inline in the walk.
    deadline: float | None = None
    # Set by the worker's heartbeat when the step was taken over, cancelled or timed out:
    # a long executor should stop at its next safe point, since its result will be dropped.
    lease_lost: threading.Event = field(default_factory=threading.Event, compare=False)
    # Why a woken step runs again (the wake's payload), when it was parked and woken ready.
    woken_with: Mapping[str, Any] | None = None
    # No attempt is left after this one: a retryable failure now fails the step for good.
    last_attempt: bool = False
    # Which attempt of its series this is, counting those that ran or died running (not the
    # fencing token: hand-backs and deferrals do not count). A code run's ``ctx.run`` retries.
    attempts_used: int = 1
    # The version of the automation the run runs (what a trace names: engine/tracing.py).
    version_id: int | None = None
    # A decider's turn run inline: what the run's previous turn, in the same walk, knew
    # (StepResult.carried), or None.
    carried: Any = field(default=None, compare=False)
    # Run inline in a walk ahead of its transaction (a hop's): the executor reads nothing,
    # and raises speculative.NeedsTransaction for what it would have to read.
    ahead: bool = False
    # Where a step run inline in the walk is entered (its join row and branch, inside a
    # parallel): its row is written after it ran, so a decider's turn (workflows/code) that
    # reads the run's rows learns its own place here.
    fork_join: int | None = None
    branch: int | None = None
    # The run's entered steps (step id -> iterations entered) as its row was at the claim,
    # on a worker; None inline. A decider's first turn learns from it that the run has no
    # history to read (workflows/code).
    run_entered: Mapping[str, int] | None = field(default=None, compare=False)

    @property
    def effect_key(self) -> str:
        return f"{self.run_id}/{self.step_id}/{self.iteration}"

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


Executor = Callable[[Mapping[str, Any], Mapping[str, Any], StepContext], StepResult]


def executor_for(type_name: str) -> Executor:
    """What runs a step of ``type_name``: its step type's ``execute`` (one object per type)."""
    step_type = registry.get(type_name)
    if step_type is None or step_type.execute is None:
        raise StepFailure(f"no executor for step type {type_name!r}", retryable=False)
    return step_type.execute
