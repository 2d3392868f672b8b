"""Templates and conditions of the definition language: the sandboxed Jinja environment, and
rendering in this process with no CPU or memory budget.

The public API, which renders under the budget, is :mod:`workflows.definitions.expressions`;
this module is its lower half, shared with :mod:`workflows.definitions.sandbox` (whose
rendering processes call the ``*_here`` functions) and imported by both, so neither imports
the other's caller.

Templates are Jinja2 strings (``"Hello {{ input.name }}"``); conditions are bare Jinja2
expressions (``"input.tier == 'gold'"``). Both run in a sandbox built on
``jinja2.sandbox.ImmutableSandboxedEnvironment`` with ``StrictUndefined``:
* the context holds plain data only (see :func:`build_context`): ``input``, ``vars``,
  ``steps.<id>.output``, ``run.id``, ``run.started_at``;
* no globals at all (no ``range``, ``cycler``, ``namespace``, ``lipsum`` ...), no loader, so
  ``include`` / ``import`` / ``extends`` cannot reach files;
* the sandbox refuses private and internal attributes (``__class__``, ``__globals__``,
  ``mro``, ``func_code`` ...) and any method that mutates a list, dict or set;
* an undefined name or key raises instead of rendering as an empty string;
* the rendered output is capped (``MAX_OUTPUT_BYTES``), and the cheap ways of building huge
  values inside a template (``'x' * 10**9``, ``10 ** 100000000``, ``'%999999999s'``,
  ``'x'.ljust(10**9)``, ``'x'|center(10**9)`` ...) are refused before they allocate;
* only data becomes text: a method, a macro or a generator is never rendered (its repr
  carries a heap address); filters that return generators give lists.

Every failure while rendering or evaluating becomes an :class:`ExpressionError` with a stable
``code``, whatever the underlying exception was, so the engine can fail the step with a
readable message that carries no Python internals.
"""

from __future__ import annotations

import functools
import json
import re
import string
import sys
from collections.abc import (
    Callable,
    ItemsView,
    Iterable,
    Iterator,
    KeysView,
    Mapping,
    ValuesView,
)
from datetime import date, datetime
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, Undefined, UndefinedError, nodes
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from workflows.definitions.storable import UNSTORABLE_REASON, has_unstorable

__all__ = [
    "CONTEXT_NAMES",
    "CONTEXT_PARTS",
    "ENVIRONMENT",
    "MAX_NESTING",
    "MAX_OUTPUT_BYTES",
    "Budget",
    "ContextOnRead",
    "ExpressionError",
    "build_context",
    "collect_rendered",
    "error_for",
    "evaluate_condition_here",
    "finalize",
    "is_template",
    "render_template_here",
    "render_value_here",
    "template_context",
]

#: The largest rendered output (UTF-8 bytes) of one template, or of one ``render_value`` call.
MAX_OUTPUT_BYTES = 64 * 1024
#: The only top-level names a template or condition may use.
CONTEXT_NAMES = frozenset({"input", "vars", "steps", "run", "compensating"})
# The same names, in the order a context holds them.
CONTEXT_PARTS = ("input", "vars", "steps", "run", "compensating")
#: How deeply a value holding templates (``values``, ``request.body`` ...) may nest.
MAX_NESTING = 64

_COMPILE_CACHE_SIZE = 2048
_PADDING_METHODS = frozenset({"center", "ljust", "rjust", "zfill"})
_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")
FORBIDDEN_NODES = (nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_PLAIN = str | int | float | bool | None


class ExpressionError(Exception):
    """A template or condition could not be rendered or evaluated.

    ``code`` is stable (see docs/reference/definitions.md); the text is ``"<code>: <message>"``, the
    form the step's and the run's ``error`` show. It never carries Python's own wording where
    that names interpreter internals (a ``sys.`` function, a heap address).
    """

    def __init__(
        self, message: str, *, code: str = "render_failed", retryable: bool = False
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        # True when the template itself is not at fault (no renderer was free): a retry of
        # the step may render it. Anything the template did fails the same way every time.
        self.retryable = retryable


# --- size guards ----------------------------------------------------------------------------


def _too_large(size: int) -> ExpressionError:
    return ExpressionError(
        f"the result would be larger than {MAX_OUTPUT_BYTES} bytes ({size})", code="too_large"
    )


def _check_size(size: object) -> None:
    if isinstance(size, int) and not isinstance(size, bool) and size > MAX_OUTPUT_BYTES:
        raise _too_large(size)


def _check_width_digits(digits: str | None) -> None:
    if digits and digits != "*" and (len(digits) > 9 or int(digits) > MAX_OUTPUT_BYTES):
        raise ExpressionError(f"a format width of {digits[:12]} is too large", code="too_large")


def _check_printf(fmt: str, values: object) -> None:
    """Refuses ``'%999999999s' % x`` and ``'%*s' % (10**9, x)``."""
    star = False
    for match in _PRINTF_SPEC.finditer(fmt):
        for group in match.groups():
            star = star or group == "*"
            _check_width_digits(group)
    if star:
        items = values if isinstance(values, tuple) else (values,)
        for item in items:
            _check_size(item)


def _check_str_format(fmt: str, args: Iterable[object], kwargs: Mapping[str, object]) -> None:
    """Refuses ``'{:>999999999}'.format(x)`` and nested widths taken from huge arguments."""
    for _, _, spec, _ in string.Formatter().parse(fmt):
        if not spec:
            continue
        for digits in re.findall(r"\d+", spec):
            _check_width_digits(digits)
        if "{" in spec:
            for value in (*args, *kwargs.values()):
                _check_size(value)


def _check_binop(operator: str, left: object, right: object) -> None:
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(times, int):
                _check_size(len(seq) * times)
    elif operator == "**":
        if (
            isinstance(left, int)
            and isinstance(right, int)
            and abs(left) > 1
            and right > 0
            and left.bit_length() * right > 8 * MAX_OUTPUT_BYTES
        ):
            raise ExpressionError(
                f"the number {left} ** {right} is too large", code="number_too_large"
            )
    elif operator == "%" and isinstance(left, str):
        _check_printf(left, right)


def _check_call(func: object, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Bounds the string methods that can multiply their input's size."""
    target = getattr(func, "__wrapped__", func)
    owner = getattr(target, "__self__", None)
    if not isinstance(owner, str):
        return
    name = getattr(target, "__name__", "")
    if name in _PADDING_METHODS:
        for value in (*args, *kwargs.values()):
            _check_size(value)
    elif name == "expandtabs":
        for value in (*args, *kwargs.values()):
            if isinstance(value, int):
                _check_size(len(owner) + owner.count("\t") * value)
    elif name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        if isinstance(old, str) and isinstance(new, str):
            hits = owner.count(old) if old else len(owner) + 1
            _check_size(len(owner) + hits * max(0, len(new) - len(old)))
    elif name == "format":
        _check_str_format(owner, args, kwargs)
    elif name == "format_map" and args and isinstance(args[0], Mapping):
        _check_str_format(owner, (), args[0])


def _guard_filters(filters: dict[str, Callable[..., Any]]) -> None:
    """Wraps the built-in filters that can pad a string to an arbitrary width."""
    center: Callable[..., str] = filters["center"]
    indent: Callable[..., str] = filters["indent"]
    fmt: Callable[..., str] = filters["format"]

    @functools.wraps(center)
    def safe_center(value: Any, width: int = 80) -> str:
        _check_size(width)
        return center(value, width)

    @functools.wraps(indent)
    def safe_indent(s: Any, width: int | str = 4, *args: Any, **kwargs: Any) -> str:
        pad = width if isinstance(width, int) else len(str(width))
        _check_size(len(str(s)) + pad * (str(s).count("\n") + 1))
        return indent(s, width, *args, **kwargs)

    @functools.wraps(fmt)
    def safe_format(value: Any, *args: Any, **kwargs: Any) -> str:
        if isinstance(value, str):
            _check_printf(value, kwargs or tuple(args))
        return fmt(value, *args, **kwargs)

    filters.update(center=safe_center, indent=safe_indent, format=safe_format)


# --- values that must never become text -----------------------------------------------------


class Method:
    """A method read from the data (``input.s.upper``), callable only through the sandbox.

    As text it would be its repr, with a heap address (``<built-in method upper of str
    object at 0x7f…>``), so every way to text (``{{ }}``, ``~``, ``|string``, ``%``,
    ``format``) refuses it with a clear error instead.
    """

    __slots__ = ("_func", "_name")

    def __init__(self, func: Callable[..., Any], name: str) -> None:
        self._func = func
        self._name = name

    def unwrap(self) -> Callable[..., Any]:
        return self._func

    def refusal(self) -> ExpressionError:
        return ExpressionError(
            f'"{self._name}" is a method, it cannot be rendered: call it, as in {self._name}()',
            code="not_renderable",
        )

    def __str__(self) -> str:
        raise self.refusal()

    def __repr__(self) -> str:
        raise self.refusal()

    def __format__(self, spec: str) -> str:
        raise self.refusal()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self.refusal()  # only the sandbox's call() calls the method, unwrapped


def _wrap_callable(value: Any, name: object) -> Any:
    if callable(value) and not isinstance(value, Undefined | Method):
        return Method(value, str(name))
    return value


def _materialising(func: Callable[..., Any]) -> Callable[..., Any]:
    """map, select, unique, batch, reverse … return generators, whose text is
    ``<generator object … at 0x…>``: give their items as a list, which renders as data."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs)
        return list(result) if isinstance(result, Iterator) else result

    return wrapper


def _not_renderable(value: Any) -> ExpressionError | None:
    if isinstance(value, Method):
        return value.refusal()
    if isinstance(value, Iterator):
        return ExpressionError("a generator cannot be rendered: add |list", code="not_renderable")
    if callable(value):
        return ExpressionError(
            "a macro or function cannot be rendered: call it", code="not_renderable"
        )
    return None


def finalize(value: Any) -> Any:
    """Every ``{{ }}`` value passes here before it becomes text: data renders; a method, a
    macro or a generator, alone or inside a list or object, is refused (its repr would show
    a heap address). Undefined values raise their own error when rendered."""
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if isinstance(item, _PLAIN | Undefined) or seen > MAX_OUTPUT_BYTES:
            continue  # more items than output bytes: the budget refuses the render anyway
        if isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset | KeysView | ValuesView | ItemsView):
            stack.extend(item)
        else:
            problem = _not_renderable(item)
            if problem is not None:
                raise problem
    return value


class _Sandbox(ImmutableSandboxedEnvironment):
    """The one environment every template and condition runs in."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self) -> None:
        super().__init__(
            undefined=StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
            finalize=finalize,
        )
        # No globals: range, dict, cycler, joiner, namespace and lipsum are all gone.
        self.globals.clear()
        _guard_filters(self.filters)
        for name, func in list(self.filters.items()):
            self.filters[name] = _materialising(func)

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Method):
            raise obj.refusal()
        # Plain data first: `input.items` is the key "items", not the dict method.
        if isinstance(obj, dict):
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
        return _wrap_callable(super().getattr(obj, attribute), attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if isinstance(obj, Method):
            raise obj.refusal()
        # `input.s['upper']` falls back to the attribute, so it is wrapped the same way.
        return _wrap_callable(super().getitem(obj, argument), argument)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, Method):
            obj = obj.unwrap()
        _check_call(obj, args, kwargs)
        return super().call(context, obj, *args, **kwargs)


ENVIRONMENT = _Sandbox()


# --- compiling --------------------------------------------------------------------------


def is_template(text: str) -> bool:
    """True when ``text`` contains Jinja markup; other strings are used as they are."""
    return "{" in text


@functools.lru_cache(maxsize=_COMPILE_CACHE_SIZE)
def _compile_template(text: str) -> Any:
    return ENVIRONMENT.from_string(text)


@functools.lru_cache(maxsize=_COMPILE_CACHE_SIZE)
def _compile_condition(expr: str) -> Any:
    return ENVIRONMENT.compile_expression(expr, undefined_to_none=False)


# --- rendering ------------------------------------------------------------------------------


class Budget:
    def __init__(self, max_bytes: int) -> None:
        self.left = max_bytes
        self.max_bytes = max_bytes

    def take(self, chunk: str) -> None:
        # Characters <= UTF-8 bytes, so the cheap length check catches most overflows.
        if len(chunk) > self.left:
            self._exceeded()
        self.left -= len(chunk.encode("utf-8", "surrogatepass"))
        if self.left < 0:
            self._exceeded()

    def _exceeded(self) -> None:
        raise ExpressionError(
            f"the rendered output is larger than {self.max_bytes} bytes", code="too_large"
        )


def _clean(exc: BaseException) -> str:
    """Python's message, first line only, without heap addresses, bounded."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _ADDRESS.sub("", text)[:200]


def error_for(exc: Exception) -> ExpressionError:
    """A stable code and a clean message for whatever rendering raised."""
    if isinstance(exc, SecurityError):
        return ExpressionError(_clean(exc), code="not_allowed")
    if isinstance(exc, UndefinedError):
        return ExpressionError(exc.message or "undefined", code="undefined_value")
    if isinstance(exc, TemplateSyntaxError):
        return ExpressionError(exc.message or "invalid syntax", code="invalid_syntax")
    if isinstance(exc, RecursionError):
        return ExpressionError("recursion too deep", code="too_deep")
    if isinstance(exc, ValueError) and "int_max_str_digits" in str(exc):
        # Python's text names sys.set_int_max_str_digits(): an interpreter knob, not ours.
        limit = sys.get_int_max_str_digits()
        return ExpressionError(
            f"number too large to render (more than {limit} digits)", code="number_too_large"
        )
    if isinstance(exc, OverflowError):
        return ExpressionError("number too large", code="number_too_large")
    if isinstance(exc, ZeroDivisionError):
        return ExpressionError("division by zero", code="division_by_zero")
    if isinstance(exc, TypeError | ValueError | LookupError | AttributeError):
        return ExpressionError(_clean(exc), code="invalid_operation")
    return ExpressionError(f"could not be rendered ({type(exc).__name__})")


def _render(text: str, context: Mapping[str, Any], budget: Budget) -> str:
    if not isinstance(text, str):
        raise ExpressionError(
            f"a template must be a string, not {type(text).__name__}", code="invalid_template"
        )
    if not is_template(text):
        budget.take(text)
        return text
    return collect_rendered(lambda: _compile_template(text).generate(dict(context)), budget)


def collect_rendered(chunks: Callable[[], Iterable[str]], budget: Budget) -> str:
    """The text a renderer yields (``chunks`` makes it: compiling, or walking the tree on
    the fast path), taken chunk by chunk against the output budget, refused if unstorable;
    any other failure becomes an ExpressionError with its stable code."""
    parts: list[str] = []
    try:
        for chunk in chunks():
            budget.take(chunk)
            if has_unstorable(chunk):
                raise ExpressionError(f"the rendered text {UNSTORABLE_REASON}", code="unstorable")
            parts.append(chunk)
    except ExpressionError:
        raise
    except Exception as exc:
        raise error_for(exc) from exc
    return "".join(parts)


def render_template_here(
    text: str, context: Mapping[str, Any], *, max_bytes: int = MAX_OUTPUT_BYTES
) -> str:
    """render_template in this process, without a CPU or memory budget."""
    return _render(text, context, Budget(max_bytes))


def render_value_here(
    value: Any, context: Mapping[str, Any], *, max_bytes: int = MAX_OUTPUT_BYTES
) -> Any:
    """render_value in this process, without a CPU or memory budget."""
    return _rendered(value, 0, context, Budget(max_bytes))


def _rendered(item: Any, depth: int, context: Mapping[str, Any], budget: Budget) -> Any:
    """``item`` with every string in it rendered. (Not a closure over its own name: that is
    a reference cycle, left for the garbage collector, on every step whose fields render.)"""
    if isinstance(item, str):
        return _render(item, context, budget)
    if isinstance(item, Mapping | list | tuple):
        if depth >= MAX_NESTING:
            raise ExpressionError(
                f"the value nests deeper than {MAX_NESTING} levels", code="too_deep"
            )
        if isinstance(item, Mapping):
            return {
                key: _rendered(child, depth + 1, context, budget) for key, child in item.items()
            }
        return [_rendered(child, depth + 1, context, budget) for child in item]
    return item


def evaluate_condition_here(expr: str, context: Mapping[str, Any]) -> bool:
    """evaluate_condition in this process, without a CPU or memory budget."""
    if not isinstance(expr, str):
        raise ExpressionError(
            f"a condition must be a string, not {type(expr).__name__}", code="invalid_template"
        )
    try:
        compiled = _compile_condition(expr)
        return bool(compiled(dict(context)))
    except ExpressionError:
        raise
    except Exception as exc:
        raise error_for(exc) from exc


# --- context --------------------------------------------------------------------------------


def _json_default(value: object) -> object:
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def _plain(value: Any) -> Any:
    """A deep copy of ``value`` made of dict, list, str, int, float, bool and None only."""
    return json.loads(json.dumps(value, default=_json_default))


_SCALARS = frozenset({str, int, float, bool, type(None)})


def plain_copy(value: Any) -> Any:
    """``value`` as plain data that shares nothing with it, exactly as a JSON round trip
    gives it back: what a workflow's own code is handed, so no change it makes reaches the
    run's values, and a value the run holds as it was returned reads as it reads once
    stored. JSON's own values are copied as they are (several times quicker than a round
    trip; a scalar is its own copy); anything else (a tuple, a key that is not a string, a
    date) makes the round trip."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        # (A scalar item is copied here, without a call: most are; a code run's every turn
        # copies its input.)
        copied = {}
        for key, item in value.items():
            if type(key) is not str:
                return _plain(value)
            copied[key] = item if type(item) in _SCALARS else plain_copy(item)
        return copied
    if kind is list:
        return [item if type(item) in _SCALARS else plain_copy(item) for item in value]
    if kind is datetime or kind is date:  # (a run's start time, in every step's context)
        return value.isoformat()  # what the round trip gives back (_json_default)
    return _plain(value)


_CONTEXT_DEFAULTS: dict[str, Any] = dict.fromkeys(
    ("variables", "step_outputs", "run_id", "started_at", "compensating")
)


class ContextOnRead(Mapping[str, Any]):
    """``build_context(**arguments)``, each of its names copied from the run when a step
    first reads it: a step that reads nothing of the run's data (a noop, a step whose fields
    hold no template) copies none of it, and one that reads ``input`` does not copy every
    step's output, where a worker copied the whole run for every step it ran. What a step
    reads is exactly what build_context gives for the same arguments (``dict()`` of it is
    that dict). Handed only to a type that declares ``context_on_read`` (it reads the context
    as a Mapping or copies it with ``dict()``); any other type's executor gets the dict
    itself, as it always did."""

    __slots__ = ("_arguments", "_parts")

    def __init__(self, **arguments: Any) -> None:
        # build_context's keyword arguments, its defaults for those not given
        self._arguments = {**_CONTEXT_DEFAULTS, **arguments}
        self._parts: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        try:
            return self._parts[key]
        except KeyError:
            if key not in CONTEXT_PARTS:
                raise
        part = self._parts[key] = _CONTEXT_PART[key](self._arguments)
        return part

    def __contains__(self, key: object) -> bool:
        return key in CONTEXT_PARTS

    def __iter__(self) -> Iterator[str]:
        return iter(CONTEXT_PARTS)

    def __len__(self) -> int:
        return len(CONTEXT_PARTS)


def template_context(on_read: bool, **arguments: Any) -> Mapping[str, Any]:
    """The context a step's ``execute`` is handed, from build_context's arguments: made on
    read (ContextOnRead) when its type declares ``context_on_read``, else the dict, now."""
    return ContextOnRead(**arguments) if on_read else build_context(**arguments)


def build_context(
    *,
    run_input: Any,
    variables: Mapping[str, Any] | None = None,
    step_outputs: Mapping[str, Any] | None = None,
    run_id: object = None,
    started_at: datetime | str | None = None,
    compensating: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The template context of a run, as plain data only.

    ``step_outputs`` maps step id -> that step's output; templates read it as
    ``steps.<id>.output``. ``compensating``: in a compensation step, the execution it undoes
    (``step``, ``iteration``, ``output``); null in every other step. Datetimes become ISO 8601
    strings; other non-JSON values strings.
    """
    arguments = {
        "run_input": run_input, "variables": variables, "step_outputs": step_outputs,
        "run_id": run_id, "started_at": started_at, "compensating": compensating,
    }  # fmt: skip
    return {name: part(arguments) for name, part in _CONTEXT_PART.items()}


def _steps(outputs: Mapping[str, Any] | None) -> dict[str, Any]:
    return {str(step_id): {"output": output} for step_id, output in (outputs or {}).items()}


# How each name of a run's template context is made from build_context's arguments: a copy of
# the run's data as a JSON round trip gives it back (JSON's own values copied as they are,
# plain_copy), in CONTEXT_PARTS's order. ContextOnRead makes each when it is first read.
_CONTEXT_PART: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "input": lambda a: plain_copy(a["run_input"]),
    "vars": lambda a: plain_copy(dict(a["variables"] or {})),
    "steps": lambda a: plain_copy(_steps(a["step_outputs"])),
    "run": lambda a: plain_copy(
        {"id": None if a["run_id"] is None else str(a["run_id"]), "started_at": a["started_at"]}
    ),
    "compensating": lambda a: plain_copy(a["compensating"]),
}
