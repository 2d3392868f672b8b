"""The step-type registry: how apps plug their step kinds into the engine.

A step type is one object: its validation, its lane, whether it waits, and what runs when a
step of it executes (``execute``). `workflows` knows no step type of another app. Each app
(and a host project: see ``workflows.plugins``) declares its types and registers them from
``AppConfig.ready()``; the validator, the walk and the workers look them up here by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

INLINE = "inline"  # run in the walk, inside its transaction; no worker
WORKER_LANES = ("io", "slow", "human")
LANES = (INLINE, *WORKER_LANES)


class StepReport:
    """Collects the problems one step type finds in one step's own fields.

    A validator calls ``error(field, message)`` for a malformed field (code
    ``invalid_field``) or ``issue(code, field, message)`` for any other issue code;
    ``field`` is a dotted path inside the step (``"request.url"``, ``"values.greeting"``) so
    the message can name it.
    """

    # Whether the step is a definition's (the validator's IssueReport), not a call a code
    # workflow makes (workflows/code): a type only the engine writes is refused in the first.
    of_definition = False

    def __init__(self, step_id: str) -> None:
        self.step_id = step_id
        self.issues: list[tuple[str, str, str]] = []  # (code, field, message)

    def error(self, field_path: str, message: str) -> None:
        self.issue("invalid_field", field_path, message)

    def issue(self, code: str, field_path: str, message: str) -> None:
        self.issues.append((code, field_path, message))


StepValidator = Callable[[Mapping[str, Any], StepReport], None]
OutcomeFn = Callable[[Mapping[str, Any]], frozenset[str]]
# (step definition, the run's template context, workflows.engine.executors.StepContext)
#   -> workflows.engine.executors.StepResult, or raises StepFailure
Execute = Callable[[Mapping[str, Any], Mapping[str, Any], Any], Any]


@dataclass(frozen=True)
class RetryPolicy:
    """How a step type retries its own failures, beside its lane's defaults.

    Backoff is exponential with full jitter, uniform(0, min(cap, base * 2**(n-1))), kept as
    the step's durable ``wake_at`` (no worker sleeps through it); a failure's own
    ``retry_after`` (a provider's Retry-After) wins over it. A failure whose ``error_class``
    is in ``non_retryable`` is not retried at all. None fields take the lane's value."""

    max_attempts: int | None = None
    base_seconds: float | None = None
    cap_seconds: float | None = None
    non_retryable: frozenset[str] = frozenset()


@dataclass(frozen=True)
class StepType:
    """One kind of step.

    name      the ``type`` value in a definition.
    lane      where its work runs: inline (in the walk, in its transaction: touches nothing
              outside the database), or a worker lane: io, slow, human.
    execute   what runs when a step of this type executes; None while not built.
    validate  checks the type's own fields (not ``id``, ``type`` or ``next``).
    outcomes  the outcome names ``next`` may map from; None when ``next`` is one step id.
    success_outcomes  of ``outcomes``, those that mean the step did what it was asked (an
              effect's "ok", an approval's "approved"): a compensation step ending with
              another (rejected, timed out, suppressed) has not undone anything, and the run
              ends compensation_failed. None: every outcome is a success (a type with no
              outcomes, or a plugin's that says nothing).
    waits     True when the step parks the run on time or on the outside world; a loop
              through such a step cannot spin, so it needs no explicit step limit.
    terminal  True when the step ends its path (``next`` is not allowed).
    built     False while the engine cannot execute it yet (no ``execute``): definitions
              using it validate, but publishing them is refused.
    app       the Django app label that registered it (for docs and error messages).
    retry     its RetryPolicy; None: the lane's.
    pure      (inline types) its ``execute`` reads only the step's definition and the run's
              template context and writes nothing: no statement, no outside call, no clock.
              A walk computed before its transaction (a settle's hop, the one-statement start,
              workflows/engine/speculative.py) may run it. False, the default and what a
              plugin's type gets without saying anything: such a walk hands the hop to the
              ordinary walk, which enters the step inside the run's locked transaction.
              (worker types) the same promise: a code run's turn on a worker that asks such
              a step of that worker's own lane has it run in the turn's settle and written
              done with it, instead of as an attempt of its own (engine/walk.py
              Walk._ran_with_turn). Any other worker step runs only from its written row.
    forks     (inline types) entered by the walk itself, never by ``execute``: it starts each
              step of the step's ``branches`` field and, when its ``next`` names a step of a
              ``joins`` type, opens that join's waiting row first (engine/forks.py). The
              engine's `parallel`.
    joins     (inline types) where a forking step's branches meet: its waiting row is opened
              when the fork is entered and each branch arrives at it (engine/forks.py); only
              entered outside a fork does its ``execute`` run. The engine's `join`.
    context_on_read  its ``execute`` reads the run's template context only as
              a Mapping (``context[name]``, ``name in context``, ``dict(context)``, handing it
              to ``render``), never as a dict (``json.dumps(context)``, an assignment into it):
              a worker, or the walk for an inline type, then hands it a context whose
              names are copied from the run as the step first reads them
              (rendering.ContextOnRead), so a step that reads none of it (a noop, an end
              with no output, fields with no template) pays no copy of the whole run.
              False, the default and a plugin's that says nothing: the dict, copied before
              ``execute``.
    decides   (worker types) the one step of a definition whose steps are decided as the run
              goes (engine/decided.py): its result names the step to enter next (a whole
              step, ``{"call": {...}}``) or ends the run. A code workflow's (workflows/code).
    """

    name: str
    lane: str
    validate: StepValidator
    execute: Execute | None = field(default=None, compare=False)
    outcomes: OutcomeFn | None = None
    success_outcomes: frozenset[str] | None = None
    waits: bool = False
    terminal: bool = False
    built: bool = False
    app: str = ""
    retry: RetryPolicy | None = None
    pure: bool = False
    forks: bool = False
    joins: bool = False
    decides: bool = False
    context_on_read: bool = False
    references: Callable[[Mapping[str, Any]], dict[str, str]] = field(
        default=lambda step: {}, compare=False
    )
    """Step ids this type refers to outside ``next`` (e.g. parallel branches), by field path."""

    def succeeded_with(self, outcome: str | None) -> bool:
        """Whether a step of this type that ended with ``outcome`` did what it was asked."""
        return self.success_outcomes is None or outcome in self.success_outcomes

    def runs_ahead(self) -> bool:
        """Whether a walk with no transaction yet (speculative.py) may enter a step of this
        type: a worker lane's (the walk only writes its row) or a pure inline type's."""
        return self.lane != INLINE or self.pure

    def __post_init__(self) -> None:
        if self.lane not in LANES:
            raise ValueError(f"step type {self.name!r}: unknown lane {self.lane!r}")
        if self.built and self.execute is None:
            raise ValueError(f"step type {self.name!r} is built but has nothing to execute")
        if (self.forks or self.joins) and self.lane != INLINE:
            raise ValueError(f"step type {self.name!r}: only an inline type forks or joins")
        if self.decides and self.lane == INLINE:
            raise ValueError(f"step type {self.name!r}: only a worker type decides")


class Registry:
    def __init__(self) -> None:
        self._types: dict[str, StepType] = {}

    def register(self, step_type: StepType) -> None:
        existing = self._types.get(step_type.name)
        if existing is not None and existing != step_type:
            raise ValueError(f"step type {step_type.name!r} is already registered")
        self._types[step_type.name] = step_type

    def get(self, name: str) -> StepType | None:
        return self._types.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def __iter__(self) -> Iterator[StepType]:
        return iter(sorted(self._types.values(), key=lambda t: t.name))

    def names(self) -> list[str]:
        return sorted(self._types)

    def forking(self, name: str) -> bool:
        """Whether the step type ``name`` declares ``forks`` (its row names the join row its
        branches meet at)."""
        found = self._types.get(name)
        return found is not None and found.forks

    def joining(self) -> list[str]:
        """The names of the types that declare ``joins``: the types of join rows."""
        return [t.name for t in self if t.joins]


registry = Registry()
