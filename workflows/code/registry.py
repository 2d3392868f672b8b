"""The code workflows of this process, by name and version: ``@workflow`` fills it."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug

from ..definitions.personal_data import declaration_problems
from ..definitions.registry import Registry
from ..definitions.validator import validate_definition
from .schemas import SchemaProblem, checked_schema
from .type_hints import hinted_schemas

MAX_NAME = 63  # an automation's slug: a code workflow is published under its name

WorkflowFunction = Callable[..., Any]
F = TypeVar("F", bound=WorkflowFunction)


class CodeWorkflowError(Exception):
    """A code workflow cannot be registered (or published) as asked: ``code`` says why."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


ALL = "all"  # organisations=: every organisation the host publishes it for


@dataclass(frozen=True)
class CodeWorkflow:
    name: str
    version: int
    function: WorkflowFunction
    organisations: frozenset[str] | None = None  # the slugs it may run for; None: all
    input_schema: Mapping[str, Any] | None = None  # JSON Schemas (schemas.py); None: none
    output_schema: Mapping[str, Any] | None = None
    # Which values of a run name its person and are their data (a definition's
    # ``personal_data``, docs/reference/definitions.md): its versions hold it.
    personal_data: Mapping[str, Any] | None = None
    # A definition's run budget (``limits``: max_steps, max_age) and its timers' spread
    # (``timer_spread``): its versions hold them, and its runs are held to them alike.
    limits: Mapping[str, Any] | None = None
    timer_spread: str | None = None

    def allows(self, org_slug: str) -> bool:
        return self.organisations is None or org_slug in self.organisations


_workflows: dict[tuple[str, int], CodeWorkflow] = {}
_lock = threading.Lock()


def workflow(
    name: str,
    *,
    version: int | None = None,
    organisations: str | Iterable[str] = ALL,
    input_schema: Mapping[str, Any] | None = None,
    output_schema: Mapping[str, Any] | None = None,
    personal_data: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    timer_spread: str | None = None,
) -> Callable[[F], F]:
    """Register the decorated function as the code workflow ``name`` at ``version``. It is
    called as ``function(ctx, input)`` with a ``Context`` and the run's input, and returns
    the run's output (a JSON value). ``organisations``: ``"all"``, or the slugs of the
    organisations it may be published for and started in (publish_code_workflow, and every
    start of its runs, refuse the others: ``workflow_not_allowed``). ``input_schema`` and
    ``output_schema``: JSON Schemas the input and output must match; without one, a
    TypedDict hint of the input or the return value gives it (schemas.py).
    ``personal_data``: which values of a run name its person and are their data, and what
    erasing the person does to a live run, as a definition declares it (docs/reference/
    definitions.md, "Personal data"); its published versions hold it. ``limits``
    (``{"max_steps": N, "max_age": "30d"}``) and ``timer_spread`` (``"10m"``): a
    definition's run budget and its timers' spread, held by its published versions too."""
    if callable(name):  # a bare @workflow: the function came as the name
        raise CodeWorkflowError(
            "invalid_workflow",
            f"@workflow on {getattr(name, '__name__', name)!r} needs a name and a version: "
            '@workflow("order-fulfilment", version=1)',
        )
    if version is None:
        raise CodeWorkflowError(
            "invalid_workflow", f'{name!r}: a version is required: @workflow("{name}", version=1)'
        )
    _check_name(name, version)
    allowed = _organisations(name, organisations)
    _check_personal_data(name, personal_data)
    _check_run_settings(name, limits, timer_spread)

    def register(function: F) -> F:
        _check_function(name, function)
        given_in, given_out = _schemas(name, function, input_schema, output_schema)
        with _lock:
            existing = _workflows.get((name, version))
            if existing is not None:
                raise CodeWorkflowError(
                    "workflow_already_registered",
                    f"{name!r} version {version} is already registered "
                    f"({_where(existing.function)}), and {_where(function)} registers it "
                    "again: give the new code another version",
                )
            _workflows[(name, version)] = CodeWorkflow(
                name, version, function, allowed, given_in, given_out,
                None if personal_data is None else dict(personal_data),
                None if limits is None else dict(limits), timer_spread,
            )  # fmt: skip
        return function

    return register


def registered(name: str, version: int) -> CodeWorkflow | None:
    return _workflows.get((name, version))


def unregister(name: str, version: int) -> None:
    """Forget one registration (tests that register workflows of their own)."""
    with _lock:
        _workflows.pop((name, version), None)


# Set while the host publishes a code workflow: only then may a definition hold a ``code``
# step (steptypes.validate_code). A tenant's definition naming a host's workflow would run
# the host's code, with input the tenant chose, in the tenant's organisation.
_host_publishing: ContextVar[bool] = ContextVar("waymark_host_publishing", default=False)


@contextmanager
def host_publishing() -> Iterator[None]:
    """Definitions validated meanwhile, in this thread, may hold a ``code`` step."""
    token = _host_publishing.set(True)
    try:
        yield
    finally:
        _host_publishing.reset(token)


def publishing_as_host() -> bool:
    return _host_publishing.get()


def _check_name(name: object, version: object) -> None:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME:
        raise CodeWorkflowError("invalid_workflow", f"name {name!r}: 1 to {MAX_NAME} characters")
    try:
        validate_slug(name)
    except ValidationError:
        raise CodeWorkflowError(
            "invalid_workflow", f"name {name!r}: letters, digits, hyphens or underscores"
        ) from None
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CodeWorkflowError("invalid_workflow", f"{name!r}: version must be an integer >= 1")


def _organisations(name: str, organisations: object) -> frozenset[str] | None:
    """The slugs a workflow may run for (None: all), from ``"all"`` or a list of slugs."""
    if organisations == ALL:
        return None
    if isinstance(organisations, str) or not isinstance(organisations, Iterable):
        raise CodeWorkflowError(
            "invalid_workflow", f"{name!r}: organisations must be {ALL!r} or a list of slugs"
        )
    slugs = list(organisations)
    for slug in slugs:
        try:
            if not isinstance(slug, str):
                raise TypeError(slug)
            validate_slug(slug)
        except (ValidationError, TypeError):
            raise CodeWorkflowError(
                "invalid_workflow", f"{name!r}: organisation {slug!r} is not a slug"
            ) from None
    if not slugs:
        raise CodeWorkflowError("invalid_workflow", f"{name!r}: organisations is empty")
    return frozenset(slugs)


def _schemas(
    name: str, function: WorkflowFunction, given_in: object, given_out: object
) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """The input and output schemas: as given, else from the function's TypedDict hints."""
    try:
        hinted_in, hinted_out = hinted_schemas(
            function, of_input=given_in is None, of_output=given_out is None
        )
        return (
            checked_schema(given_in, "input_schema") if given_in is not None else hinted_in,
            checked_schema(given_out, "output_schema") if given_out is not None else hinted_out,
        )
    except SchemaProblem as problem:
        raise CodeWorkflowError("invalid_workflow", f"{name!r}: {problem.detail}") from None


def _check_personal_data(name: str, personal_data: object) -> None:
    if personal_data is None:
        return
    problems = declaration_problems(personal_data)
    if problems:
        raise CodeWorkflowError(
            "invalid_workflow", f"{name!r}: " + "; ".join(message for _, _, message in problems)
        )


def _check_run_settings(name: str, limits: object, timer_spread: object) -> None:
    """``limits`` and ``timer_spread`` as the definition validator checks a definition's:
    its own messages, raised at registration (``invalid_workflow``)."""
    probe: dict[str, Any] = {"start": "end", "steps": [{"id": "end", "type": "end"}]}
    if limits is not None:
        probe["limits"] = limits
    if timer_spread is not None:
        probe["timer_spread"] = timer_spread
    if len(probe) == 2:
        return
    # An empty registry: the probe's step is not what is checked, only the run's settings.
    problems = [issue.message for issue in validate_definition(probe, registry=Registry())
                if (issue.field or "").split(".")[0] in ("limits", "timer_spread")]  # fmt: skip
    if problems:
        raise CodeWorkflowError("invalid_workflow", f"{name!r}: " + "; ".join(problems))


def _check_function(name: str, function: object) -> None:
    """A function the engine can call as ``function(ctx, input)`` and replay: a plain one
    (an ``async def`` would hand back a coroutine, a generator function a generator, and
    neither would run its body), taking those two."""
    if not callable(function):
        raise CodeWorkflowError("invalid_workflow", f"{name!r}: not a function")
    # An object called as a function: what runs is its class's __call__.
    call = function if inspect.isroutine(function) else type(function).__call__
    if inspect.isgeneratorfunction(call):
        raise CodeWorkflowError(
            "invalid_workflow",
            f"{name!r}: a generator function (it yields); a workflow returns its output",
        )
    if any(inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f)
           for f in (function, call)):  # fmt: skip
        raise CodeWorkflowError(
            "invalid_workflow",
            f"{name!r}: an async function; a workflow is a plain function (def), replayed "
            "step by step on a worker",
        )
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a callable Python cannot describe: called as it is
        return
    try:
        signature.bind(None, None)
    except TypeError:
        raise CodeWorkflowError(
            "invalid_workflow",
            f"{name!r}: called as function(ctx, input), but it takes {signature}",
        ) from None


def _where(function: WorkflowFunction) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', '?')}"
