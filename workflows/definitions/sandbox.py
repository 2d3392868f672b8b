"""Rendering processes: where a template that could be costly runs, under a hard budget.

The Jinja sandbox (:mod:`workflows.definitions.rendering`) keeps templates away from
Python's internals, but it is no budget: a template can loop (``{% for %}`` inside
``{% for %}``), double a string with ``~`` in a ``{% set %}`` loop, or join, replace, wrap,
indent or multiply its way to gigabytes. A list of known tricks is never complete, so every
template that is not provably cheap (see ``_fast_plan``) is rendered here, in a
child process, where the operating system bounds it whatever it does:

* **memory**: the child runs under ``RLIMIT_AS`` (its address space after start-up plus
  ``TEMPLATE_MEMORY_MB``); an allocation past it fails (``MemoryError``), the call fails
  with ``template_limit`` and the child exits and is replaced;
* **CPU**: the parent measures the child's CPU time (``/proc/<pid>/stat``) while it waits and
  kills it (SIGKILL) once the call has used ``TEMPLATE_CPU_SECONDS``; long C calls
  (``str.join`` of a huge list, a big-integer product) cannot delay a SIGKILL. As a backstop
  for an orphaned child the child's own ``RLIMIT_CPU`` soft limit is set, before each call,
  to its usage so far plus the budget plus one second (SIGXCPU then ends it);
* **time**: the caller never waits more than ``TEMPLATE_WAIT_SECONDS`` in all (for a free
  renderer, then for the answer), even when the machine is so loaded the child gets no CPU.

Why child processes started with ``subprocess`` (``python -I -c ...``), not
``multiprocessing``: a fresh interpreter inherits no database connection, no thread, no lock
and no file descriptor (``close_fds``) of the engine process, and, unlike the ``spawn`` and
``forkserver`` contexts, it does not re-import the caller's ``__main__`` (manage.py, pytest,
the web server). It gets a minimal environment (no secrets: no database password, no secret
key), imports only Jinja2 and the rendering module, never Django. Requests and answers are
JSON frames on its stdin/stdout, never pickles: a child that rendered a hostile template
cannot make the engine process unpickle anything.

Each engine process has one :class:`RenderPool` of at most ``TEMPLATE_PROCESSES`` children,
started on first use and replaced when one overruns; after a ``fork`` the child process makes
a pool of its own.
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import operator
import os
import resource
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from jinja2 import nodes
from jinja2.lexer import Token, TokenStream
from jinja2.parser import Parser

from workflows.definitions import rendering as _expr
from workflows.definitions.rendering import ExpressionError

__all__ = [
    "LIMIT_MARK",
    "AlreadyReported",
    "TemplateLimits",
    "TemplateTooLarge",
    "definition_budget",
    "parse_condition",
    "parse_template",
    "render",
    "render_in_pool",
    "template_limits",
]

_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding `workflows`
_HEADER = struct.Struct(">I")
_MAX_FRAME = 256 * 1024 * 1024
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_CHILD_CODE = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from workflows.definitions.sandbox import child_main; child_main()"
)


@dataclass(frozen=True)
class TemplateLimits:
    """The WAYMARK settings that bound templates and conditions (docs/reference/definitions.md)."""

    max_template_bytes: int = 16_384
    max_condition_bytes: int = 2_048
    max_branch_conditions: int = 64
    max_template_tokens: int = 2_000
    max_template_depth: int = 40
    max_definition_template_tokens: int = 50_000
    cpu_seconds: float = 1.0
    memory_mb: int = 256
    wait_seconds: float = 10.0
    processes: int = 2


_SETTING_NAMES = {
    "max_template_bytes": "MAX_TEMPLATE_BYTES",
    "max_condition_bytes": "MAX_CONDITION_BYTES",
    "max_branch_conditions": "MAX_BRANCH_CONDITIONS",
    "max_template_tokens": "MAX_TEMPLATE_TOKENS",
    "max_template_depth": "MAX_TEMPLATE_DEPTH",
    "max_definition_template_tokens": "MAX_DEFINITION_TEMPLATE_TOKENS",
    "cpu_seconds": "TEMPLATE_CPU_SECONDS",
    "memory_mb": "TEMPLATE_MEMORY_MB",
    "wait_seconds": "TEMPLATE_WAIT_SECONDS",
    "processes": "TEMPLATE_PROCESSES",
}
_DEFAULTS = TemplateLimits()


def template_limits() -> TemplateLimits:
    """The configured limits (``settings.WAYMARK``), or the defaults outside Django."""
    try:
        from django.conf import settings

        waymark = dict(getattr(settings, "WAYMARK", None) or {})
    except Exception:  # Django absent or not configured (a rendering child, a script)
        waymark = {}
    values: dict[str, Any] = {}
    for attr, name in _SETTING_NAMES.items():
        default = getattr(_DEFAULTS, attr)
        values[attr] = type(default)(waymark.get(name, default))
    return TemplateLimits(**values)


def _limit_error(message: str) -> ExpressionError:
    return ExpressionError(message, code="template_limit")


# --- parsing under limits -------------------------------------------------------------------

#: Every message about a template limit contains this, so the validator can give it its own
#: issue code (``template_too_large``) whoever reports it.
LIMIT_MARK = "(limit "


class TemplateTooLarge(Exception):
    """A template or condition is over one of the validation limits (the message names it)."""


class AlreadyReported(TemplateTooLarge):
    """The definition's token budget was spent, and reported by the check that spent it:
    the checks after it parse nothing and report nothing."""


_DEFINITION_TOKENS: ContextVar[list[int] | None] = ContextVar(
    "waymark_definition_template_tokens", default=None
)


@contextmanager
def definition_budget(tokens: int) -> Iterator[None]:
    """While validating one definition: all its templates and conditions together may hold
    at most ``tokens`` tokens; once spent, the first check over it reports the limit and
    the following ones parse nothing (the definition is refused anyway)."""
    handle = _DEFINITION_TOKENS.set([tokens])
    try:
        yield
    finally:
        _DEFINITION_TOKENS.reset(handle)


def _counted(tokens: Iterator[Token], limit: int) -> Iterator[Token]:
    shared = _DEFINITION_TOKENS.get()
    for count, token in enumerate(tokens, 1):
        if count > limit:
            raise TemplateTooLarge(
                f"has more than {limit} tokens {LIMIT_MARK}MAX_TEMPLATE_TOKENS: {limit})"
            )
        if shared is not None:
            shared[0] -= 1
            if shared[0] < 0:
                total = template_limits().max_definition_template_tokens
                raise TemplateTooLarge(
                    f"is past the {total} tokens all the templates and conditions of a "
                    f"definition may hold together {LIMIT_MARK}MAX_DEFINITION_TEMPLATE_TOKENS: "
                    f"{total})"
                )
        yield token


def _limited_parser(source: str, state: str | None, limits: TemplateLimits) -> Parser:
    parser = Parser(_expr.ENVIRONMENT, source, state=state)
    lexer = _expr.ENVIRONMENT.lexer
    raw = lexer.wrap(lexer.tokeniter(source, None, None, state), None, None)
    parser.stream = TokenStream(_counted(raw, limits.max_template_tokens), None, None)
    return parser


def _check_depth(tree: nodes.Node, limit: int) -> None:
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise TemplateTooLarge(
                f"nests more than {limit} levels deep {LIMIT_MARK}MAX_TEMPLATE_DEPTH: {limit})"
            )
        stack.extend((child, depth + 1) for child in node.iter_child_nodes())


def _parse(source: str, condition: bool, limits: TemplateLimits) -> nodes.Node:
    """Parse under the limits: the size first (nothing else is read past it), then the
    tokens while lexing, then the depth. Raises TemplateTooLarge or TemplateSyntaxError."""
    size = len(source.encode("utf-8", "surrogatepass"))
    limit = limits.max_condition_bytes if condition else limits.max_template_bytes
    if size > limit:
        name = "MAX_CONDITION_BYTES" if condition else "MAX_TEMPLATE_BYTES"
        raise TemplateTooLarge(f"is {size} bytes long {LIMIT_MARK}{name}: {limit})")
    shared = _DEFINITION_TOKENS.get()
    if shared is not None and shared[0] < 0:
        raise AlreadyReported  # the check that spent the budget reported it
    try:
        if condition:
            parser = _limited_parser(source, "variable", limits)
            tree: nodes.Node = parser.parse_expression()
            if not parser.stream.eos:
                raise _expr.TemplateSyntaxError(
                    f"has unexpected text after the expression: {parser.stream.current.value!r}",
                    parser.stream.current.lineno,
                )
        else:
            tree = _limited_parser(source, None, limits).parse()
    except RecursionError:
        raise TemplateTooLarge(
            f"nests too deeply {LIMIT_MARK}MAX_TEMPLATE_DEPTH: {limits.max_template_depth})"
        ) from None
    _check_depth(tree, limits.max_template_depth)
    return tree


def parse_template(text: str, limits: TemplateLimits | None = None) -> nodes.Template:
    tree = _parse(text, False, limits or template_limits())
    assert isinstance(tree, nodes.Template)
    return tree


def parse_condition(expr: str, limits: TemplateLimits | None = None) -> nodes.Expr:
    tree = _parse(expr, True, limits or template_limits())
    assert isinstance(tree, nodes.Expr)
    return tree


# --- the fast path: templates that cannot blow up, rendered in-process -----------------------
#
# A template or condition renders in the calling process, without a child, only when its
# parsed tree proves its cost is bounded by (its own size) + (a few passes over the run's
# data) + (the 64 KiB output budget, which streams):
#
# * only output, `{% if %}`/`elif`/`else`, and expressions built from: names, `.attr` and
#   `[key]` lookups, constants (and lists/tuples of constants), comparisons (`==`, `<`, `in`
#   ...), `and`/`or`/`not`, `a if b else c`, unary minus, tests (`is defined`, `is number`
#   ...), a short list of filters, and arithmetic on two such lookups or constants;
# * no loops, no `{% set %}`, no macros, no calls (so no methods), no `~`, no slices: nothing
#   that repeats work or lets a value grow step by step;
# * arithmetic only between two leaves (lookups or constants): one `*`/`**` is already bounded
#   by the sandbox's size checks, `+` of two data values is at most their size, and `%` only
#   with a number constant on the right (printf with data on both sides can repeat a key:
#   `'%(a)s%(a)s…' % {'a': big}`);
# * filters that never make their input larger (`length`, `first`, `default`, `trim`, `int`
#   ...), chained freely, and at most one filter that may (`upper`, `string`, `tojson` ...)
#   on any chain: chaining those multiplies (`s|list|string|list|string` grows 5x a link);
#   no filter arguments except for `default`, whose arguments are leaves;
# * at most FAST_MAX_OPERATIONS operations (comparisons, tests, filters, arithmetic), each
#   at most linear in the data it reads.
#
# Everything else goes to a rendering child. The fast path does not compile: it walks the
# tree with the sandbox's own getattr/getitem/binop/finalize and Jinja's filter and test
# functions, so it renders exactly what Jinja renders (tests/test_template_budget.py
# compares both on a corpus).

FAST_MAX_OPERATIONS = 32
_FAST_CACHE_SIZE = 4096
_LEAF_NODES = (nodes.Name, nodes.Getattr, nodes.Getitem, nodes.Const)
_SAME_SIZE_FILTERS = frozenset(
    {"length", "count", "first", "last", "trim", "default", "d", "int", "float", "abs",
     "min", "max", "sort", "reverse", "unique"}
)  # fmt: skip
_GROWING_FILTERS = frozenset(
    {"lower", "upper", "title", "capitalize", "string", "tojson", "e", "escape"}
)
_ARGUMENT_FILTERS = frozenset({"default", "d"})
_FAST_TESTS = frozenset(
    {"defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number",
     "string", "mapping", "iterable", "sequence", "odd", "even", "lower", "upper",
     "divisibleby", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=",
     "gt", "greaterthan", ">", "ge", ">=", "in"}
)  # fmt: skip
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq, "ne": operator.ne, "gt": operator.gt, "gteq": operator.ge,
    "lt": operator.lt, "lteq": operator.le,
    "in": lambda a, b: a in b, "notin": lambda a, b: a not in b,
}  # fmt: skip
_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "/": operator.truediv, "//": operator.floordiv,
}  # fmt: skip


class _NotFast(Exception):
    pass


class _Shape:
    """Walks a tree once: is it on the fast path? Counts operations."""

    def __init__(self) -> None:
        self.operations = 0

    def operation(self) -> None:
        self.operations += 1
        if self.operations > FAST_MAX_OPERATIONS:
            raise _NotFast

    def leaf(self, node: nodes.Node) -> None:
        if isinstance(node, nodes.Const):
            return
        if isinstance(node, nodes.Name) and node.ctx == "load":
            return
        if isinstance(node, nodes.Getattr) and node.ctx == "load":
            self.leaf(node.node)
            return
        if isinstance(node, nodes.Getitem) and node.ctx == "load":
            if isinstance(node.arg, nodes.Slice):
                raise _NotFast
            self.leaf(node.node)
            self.leaf(node.arg)
            return
        raise _NotFast

    def expr(self, node: nodes.Node) -> bool:
        """Checks an expression; True when its value may be larger than the data it read
        (a growing filter ran on it)."""
        if isinstance(node, _LEAF_NODES):
            self.leaf(node)
            return False
        if isinstance(node, nodes.List | nodes.Tuple):
            if not all(isinstance(item, nodes.Const) for item in node.items):
                raise _NotFast
            return False
        if isinstance(node, nodes.And | nodes.Or):
            return self.expr(node.left) | self.expr(node.right)
        if isinstance(node, nodes.Not):
            self.expr(node.node)
            return False
        if isinstance(node, nodes.Neg | nodes.Pos):
            self.leaf(node.node)
            return False
        if isinstance(node, nodes.CondExpr):
            if node.expr2 is None:
                raise _NotFast
            self.expr(node.test)
            return self.expr(node.expr1) | self.expr(node.expr2)
        if isinstance(node, nodes.Compare):
            self.operation()
            self.expr(node.expr)
            for operand in node.ops:
                self.expr(operand.expr)
            return False
        if isinstance(node, nodes.BinExpr):  # arithmetic (And/Or are handled above)
            self.operation()
            if node.operator not in (*_ARITHMETIC, "*", "**", "%"):
                raise _NotFast
            self.leaf(node.left)
            self.leaf(node.right)
            if node.operator == "%" and not (
                isinstance(node.right, nodes.Const) and isinstance(node.right.value, int | float)
            ):
                raise _NotFast
            return False
        if isinstance(node, nodes.Test):
            self.operation()
            if node.name not in _FAST_TESTS or node.kwargs or node.dyn_args or node.dyn_kwargs:
                raise _NotFast
            for arg in node.args:
                self.leaf(arg)
            self.expr(node.node)
            return False
        if isinstance(node, nodes.Filter):
            self.operation()
            if node.node is None or node.dyn_args or node.dyn_kwargs or node.kwargs:
                raise _NotFast
            if node.args and node.name not in _ARGUMENT_FILTERS:
                raise _NotFast
            for arg in node.args:
                self.leaf(arg)
            grown = self.expr(node.node)
            if node.name in _SAME_SIZE_FILTERS:
                return grown  # `default`'s arguments are leaves: data, not grown
            if node.name in _GROWING_FILTERS and not grown:
                return True
        raise _NotFast

    def statements(self, body: list[nodes.Node]) -> None:
        for node in body:
            if isinstance(node, nodes.Output):
                for child in node.nodes:
                    if not isinstance(child, nodes.TemplateData):
                        self.expr(child)
            elif isinstance(node, nodes.If):
                self.expr(node.test)
                self.statements(node.body)
                for elif_ in node.elif_:
                    self.statements([elif_])
                self.statements(node.else_)
            else:
                raise _NotFast


def _fast(tree: nodes.Node, condition: bool) -> bool:
    shape = _Shape()
    try:
        if condition:
            shape.expr(tree)
        else:
            assert isinstance(tree, nodes.Template)
            shape.statements(tree.body)
    except _NotFast:
        return False
    return True


@functools.lru_cache(maxsize=_FAST_CACHE_SIZE)
def _fast_template(text: str) -> nodes.Template | None:
    """The parsed template when it may render in-process, else None (the pool renders it,
    and reports any syntax error)."""
    try:
        tree = parse_template(text, template_limits())
    except Exception:
        return None
    return tree if _fast(tree, condition=False) else None


@functools.lru_cache(maxsize=_FAST_CACHE_SIZE)
def _fast_condition(expr: str) -> nodes.Expr | None:
    try:
        tree = parse_condition(expr, template_limits())
    except Exception:
        return None
    return tree if _fast(tree, condition=True) else None


def _eval(node: nodes.Node, ctx: Mapping[str, Any]) -> Any:
    env = _expr.ENVIRONMENT
    if isinstance(node, nodes.Const):
        return node.value
    if isinstance(node, nodes.Name):
        if node.name in ctx:
            return ctx[node.name]
        return env.undefined(name=node.name)
    if isinstance(node, nodes.Getattr):
        return env.getattr(_eval(node.node, ctx), node.attr)
    if isinstance(node, nodes.Getitem):
        return env.getitem(_eval(node.node, ctx), _eval(node.arg, ctx))
    if isinstance(node, nodes.List):
        return [_eval(item, ctx) for item in node.items]
    if isinstance(node, nodes.Tuple):
        return tuple(_eval(item, ctx) for item in node.items)
    if isinstance(node, nodes.And):
        return _eval(node.left, ctx) and _eval(node.right, ctx)
    if isinstance(node, nodes.Or):
        return _eval(node.left, ctx) or _eval(node.right, ctx)
    if isinstance(node, nodes.Not):
        return not _eval(node.node, ctx)
    if isinstance(node, nodes.Neg):
        return -_eval(node.node, ctx)
    if isinstance(node, nodes.Pos):
        return +_eval(node.node, ctx)
    if isinstance(node, nodes.CondExpr):
        chosen = node.expr1 if _eval(node.test, ctx) else node.expr2
        assert chosen is not None  # _Shape refuses `a if b` without else
        return _eval(chosen, ctx)
    if isinstance(node, nodes.Compare):
        left = _eval(node.expr, ctx)
        for operand in node.ops:  # chained like Python: a < b < c
            right = _eval(operand.expr, ctx)
            if not _COMPARE[operand.op](left, right):
                return False
            left = right
        return True
    if isinstance(node, nodes.BinExpr):
        left, right = _eval(node.left, ctx), _eval(node.right, ctx)
        if node.operator in env.intercepted_binops:
            return env.call_binop(None, node.operator, left, right)  # type: ignore[arg-type]
        return _ARITHMETIC[node.operator](left, right)
    if isinstance(node, nodes.Filter):
        assert node.node is not None  # _Shape refuses filter blocks
        value = _eval(node.node, ctx)
        args = [_eval(arg, ctx) for arg in node.args]
        return env.call_filter(node.name, value, args)
    if isinstance(node, nodes.Test):
        value = _eval(node.node, ctx)
        args = [_eval(arg, ctx) for arg in node.args]
        return env.call_test(node.name, value, args)
    raise AssertionError(f"not a fast node: {type(node).__name__}")  # _Shape refused it


def _generate(body: list[nodes.Node], ctx: Mapping[str, Any]) -> Iterator[str]:
    for node in body:
        if isinstance(node, nodes.Output):
            for child in node.nodes:
                if isinstance(child, nodes.TemplateData):
                    yield child.data
                else:
                    yield str(_expr.finalize(_eval(child, ctx)))
        else:
            assert isinstance(node, nodes.If)
            branches = [(node.test, node.body), *((e.test, e.body) for e in node.elif_)]
            for test, branch in branches:
                if _eval(test, ctx):
                    yield from _generate(branch, ctx)
                    break
            else:
                yield from _generate(node.else_, ctx)


def _render_fast(tree: nodes.Template, context: Mapping[str, Any], budget: Any) -> str:
    return _expr.collect_rendered(lambda: _generate(tree.body, context), budget)


def _fast_value(value: Any, depth: int, trees: dict[str, nodes.Template]) -> bool:
    """True when every template inside ``value`` is on the fast path (collects them)."""
    stack = [(value, depth)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, str):
            if item in trees or not _expr.is_template(item):
                continue
            tree = _fast_template(item)
            if tree is None:
                return False
            trees[item] = tree
        elif isinstance(item, Mapping | list | tuple):
            if level >= _expr.MAX_NESTING:
                return False  # the child reports too_deep
            children = item.values() if isinstance(item, Mapping) else item
            stack.extend((child, level + 1) for child in children)
    return True


def render(op: str, source: Any, context: Mapping[str, Any], max_bytes: int) -> Any:
    """Render ``source`` (op "template", "value" or "condition") in this process when it is
    on the fast path, else in a rendering child under the CPU, memory and time budget."""
    if op == "condition":
        if isinstance(source, str):
            expression = _fast_condition(source)
            if expression is not None:
                try:
                    return bool(_eval(expression, context))
                except ExpressionError:
                    raise
                except Exception as exc:
                    raise _expr.error_for(exc) from exc
        else:
            return _expr.evaluate_condition_here(source, context)
    elif op == "template":
        if not isinstance(source, str) or not _expr.is_template(source):
            return _expr.render_template_here(source, context, max_bytes=max_bytes)
        tree = _fast_template(source)
        if tree is not None:
            return _render_fast(tree, context, _expr.Budget(max_bytes))
    else:
        trees: dict[str, nodes.Template] = {}
        if _fast_value(source, 0, trees):
            return _rendered_fast(source, trees, context, _expr.Budget(max_bytes))
    return render_in_pool(op, source, context, max_bytes)


def _rendered_fast(
    item: Any, trees: Mapping[str, nodes.Template], context: Mapping[str, Any], budget: Any
) -> Any:
    """A value on the fast path, each of its templates (``trees``) rendered. (Not a closure
    over its own name: that is a reference cycle, left for the garbage collector, on every
    step whose fields render.)"""
    if isinstance(item, str):
        if item in trees:
            return _render_fast(trees[item], context, budget)
        budget.take(item)
        return item
    if isinstance(item, Mapping):
        return {key: _rendered_fast(child, trees, context, budget) for key, child in item.items()}
    if isinstance(item, list | tuple):
        return [_rendered_fast(child, trees, context, budget) for child in item]
    return item


# --- frames ---------------------------------------------------------------------------------


def _encode(payload: object) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
    return _HEADER.pack(len(body)) + body


def _read_exact(stream: IO[bytes], size: int) -> bytes | None:
    """Blocking read (the child's side); None at end of file."""
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


# --- the child ------------------------------------------------------------------------------


def _cpu_seconds_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _address_space() -> int:
    """This process's virtual memory size (bytes), from /proc; 0 when unknown."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def _serve(request: dict[str, Any]) -> Any:
    from workflows.definitions import rendering

    op, source, context = request["op"], request["source"], request["context"]
    if op == "condition":
        return rendering.evaluate_condition_here(source, context)
    if op == "template":
        return rendering.render_template_here(source, context, max_bytes=request["max_bytes"])
    return rendering.render_value_here(source, context, max_bytes=request["max_bytes"])


def child_main() -> None:  # pragma: no cover - runs in the child process
    """The rendering child: answers one JSON request at a time until its stdin closes, or
    until its parent is gone: a parent killed (SIGKILL, a crash) closes the pipe, and the
    child's next answer meets a broken pipe. Nobody is left to answer, so it ends quietly
    (``os._exit``: no traceback in the engine's log, no flush of what cannot be sent)."""
    try:
        _child_loop()
    except BrokenPipeError:
        os._exit(0)


def _child_loop() -> None:  # pragma: no cover - runs in the child process
    from workflows.definitions import rendering  # imported before the memory limit

    rendering.render_template_here("{{ input }}", {"input": 1})  # warm Jinja up
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, never into the protocol
    memory = int(sys.argv[2])
    if memory > 0:
        limit = _address_space() + memory
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)

    def reply(payload: dict[str, Any]) -> None:
        payload["cpu"] = _cpu_seconds_self()
        out.write(_encode(payload))
        out.flush()

    reply({"ready": True})
    while True:
        header = _read_exact(inp, _HEADER.size)
        if header is None:
            return
        body = _read_exact(inp, _HEADER.unpack(header)[0])
        if body is None:
            return
        request = json.loads(body)
        soft = math.ceil(_cpu_seconds_self() + float(request["cpu"])) + 1
        if cpu_hard == resource.RLIM_INFINITY or soft < cpu_hard:
            resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))
        try:
            reply({"ok": _serve(request)})
        except ExpressionError as exc:
            if isinstance(exc.__cause__, MemoryError):
                reply({"memory": True})
                return  # a process that ran out of memory is not trusted again
            reply({"error": [exc.code, exc.message]})
        except MemoryError:
            reply({"memory": True})
            return


# --- the parent -----------------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for name in ("LANG", "LC_ALL", "SYSTEMROOT"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


class _Child:
    """One rendering process and its pipes; used by one caller at a time."""

    def __init__(self, memory_bytes: int, deadline: float) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and code
            [sys.executable, "-I", "-c", _CHILD_CODE, _ROOT, str(memory_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            env=_child_env(),
            cwd=_ROOT,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin = self.proc.stdin
        self.fd = self.proc.stdout.fileno()
        self.cpu = 0.0  # the child's CPU time as of its last answer
        ready = self._receive(deadline)
        if ready is None or not ready.get("ready"):
            self.kill()
            # No template has been sent yet: a machine too loaded to start a Python process
            # in time (or this process stopped meanwhile) is not the template's fault, so a
            # worker's step is retried, as when no renderer is free.
            raise ExpressionError(
                "no template renderer could be started in time", code="renderer_busy",
                retryable=True,
            )  # fmt: skip

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with suppress(OSError):
                    stream.close()

    def close(self) -> None:
        """Ask politely (end of input), then make sure."""
        try:
            self.stdin.close()
            self.proc.wait(timeout=1)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()

    def send(self, frame: bytes) -> None:
        self.stdin.write(frame)
        self.stdin.flush()

    def readable(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        return bool(ready)

    def _read(self, size: int, deadline: float) -> bytes | None:
        data = b""
        while len(data) < size:
            if not self.readable(deadline - time.monotonic()):
                return None
            chunk = os.read(self.fd, size - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def _receive(self, deadline: float) -> dict[str, Any] | None:
        header = self._read(_HEADER.size, deadline)
        if header is None:
            return None
        size = _HEADER.unpack(header)[0]
        if size > _MAX_FRAME:
            return None
        body = self._read(size, deadline)
        if body is None:
            return None
        answer = json.loads(body)
        if not isinstance(answer, dict):
            return None
        self.cpu = float(answer.get("cpu", self.cpu))
        return answer

    def cpu_now(self) -> float | None:
        """The child's CPU time so far (user + system), from /proc; None when unknown."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        except (OSError, ValueError, IndexError):
            return None

    def call(self, frame: bytes, cpu_budget: float, deadline: float) -> Any:
        """Send one request (an encoded frame); wait for its answer within the CPU budget and
        the deadline. On an overrun the child is killed (the caller then drops it)."""
        started, cpu_before = time.monotonic(), self.cpu
        try:
            self.send(frame)
        except OSError:
            self.kill()
            raise _limit_error("the template renderer stopped") from None
        # The child has one thread: its CPU time cannot grow faster than the wall clock, so
        # there is nothing to measure before `cpu_budget` seconds have passed.
        check_at = started + cpu_budget
        while True:
            now = time.monotonic()
            if self.readable(min(check_at, deadline) - now):
                answer = self._receive(deadline)
                break
            now = time.monotonic()
            if now >= deadline:
                self.kill()
                raise _limit_error(f"the template did not finish within {deadline - started:.3g} s")
            cpu = self.cpu_now()
            used = (now - started) if cpu is None else cpu - cpu_before
            if used >= cpu_budget:
                self.kill()
                raise _limit_error(f"the template used more than {cpu_budget:g} s of CPU time")
            check_at = now + max(0.01, cpu_budget - used)
        if answer is None:
            # It died: RLIMIT_CPU (SIGXCPU), an out-of-memory kill, or a crash.
            cpu = self.cpu_now()
            self.kill()
            if cpu is not None and cpu - cpu_before >= cpu_budget:
                raise _limit_error(f"the template used more than {cpu_budget:g} s of CPU time")
            raise _limit_error("the template renderer stopped (memory or CPU limit)")
        if answer.get("memory"):
            self.kill()
            raise _limit_error("the template needed more memory than its limit")
        if "error" in answer:
            code, message = answer["error"]
            raise ExpressionError(str(message), code=str(code))
        return answer.get("ok")


class RenderPool:
    """At most ``processes`` rendering children of this process, lent one caller at a time."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Condition()
        self.idle: list[_Child] = []
        self.count = 0  # children alive or being started
        self.closed = False

    def render(self, op: str, source: Any, context: Any, max_bytes: int) -> Any:
        limits = template_limits()
        deadline = time.monotonic() + max(limits.wait_seconds, limits.cpu_seconds)
        payload = {
            "op": op, "source": source, "context": context, "max_bytes": max_bytes,
            "cpu": limits.cpu_seconds,
        }  # fmt: skip
        try:
            frame = _encode(payload)
        except (TypeError, ValueError) as exc:
            raise ExpressionError(f"the template's data is not plain JSON data ({exc})") from exc
        child = self._checkout(limits, deadline)
        healthy = False
        try:
            result = child.call(frame, limits.cpu_seconds, deadline)
            healthy = True
            return result
        except ExpressionError as exc:
            healthy = exc.code != "template_limit"
            raise
        finally:
            self._checkin(child, healthy and child.alive())

    def _checkout(self, limits: TemplateLimits, deadline: float) -> _Child:
        with self.lock:
            while True:
                if self.idle:
                    return self.idle.pop()
                if self.count < max(1, limits.processes):
                    self.count += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ExpressionError(
                        f"no template renderer was free within {limits.wait_seconds:g} s",
                        code="renderer_busy",
                        retryable=True,
                    )
                self.lock.wait(left)
        try:
            return _Child(limits.memory_mb * 1024 * 1024, deadline)
        except BaseException:
            with self.lock:
                self.count -= 1
                self.lock.notify()
            raise

    def _checkin(self, child: _Child, healthy: bool) -> None:
        with self.lock:
            if healthy and not self.closed:
                self.idle.append(child)
            else:
                self.count -= 1
            self.lock.notify()
        if not healthy:
            child.kill()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, []
            self.count -= len(idle)
        for child in idle:
            child.close()


_POOL: RenderPool | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> RenderPool:
    global _POOL
    pool = _POOL
    if pool is not None and pool.pid == os.getpid():
        return pool
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            # After a fork the parent's children are not ours: start a pool of our own.
            _POOL = RenderPool()
        return _POOL


def render_in_pool(op: str, source: Any, context: Any, max_bytes: int) -> Any:
    """Render in a child process: ``op`` is "template", "value" or "condition". Raises
    ExpressionError, with code ``template_limit`` when a limit was reached."""
    # As plain JSON data: a context made on read (rendering.ContextOnRead) as the dict it is.
    plain = context if isinstance(context, dict) else dict(context)
    return _pool().render(op, source, plain, max_bytes)


@atexit.register
def _close_pool() -> None:
    pool = _POOL
    if pool is not None and pool.pid == os.getpid():
        pool.close()


if __name__ == "__main__":  # pragma: no cover
    child_main()
