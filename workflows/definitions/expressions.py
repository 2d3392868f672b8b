"""Templates and conditions of the definition language: check them, and render them under a
budget.

What a template may do, and how it fails, is :mod:`workflows.definitions.rendering` (the
sandboxed Jinja environment: plain data only, no globals, no private attributes, capped
output, every failure an :class:`ExpressionError` with a stable ``code``).

The sandbox is not a budget. The budget is :mod:`workflows.definitions.sandbox`: the public
``render_template``, ``render_value`` and ``evaluate_condition`` render in this process only
templates whose parsed tree proves them cheap, and every other one in a rendering process
under hard CPU-time, memory and wall-clock limits (``template_limit``).
``check_template`` and ``check_condition`` parse under size, token and depth limits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jinja2 import TemplateSyntaxError, meta, nodes

from workflows.definitions import sandbox
from workflows.definitions.registry import StepReport
from workflows.definitions.rendering import (
    CONTEXT_NAMES,
    ENVIRONMENT,
    FORBIDDEN_NODES,
    MAX_NESTING,
    MAX_OUTPUT_BYTES,
    ExpressionError,
    build_context,
    error_for,
    is_template,
)

__all__ = [
    "CONTEXT_NAMES",
    "MAX_OUTPUT_BYTES",
    "ExpressionError",
    "build_context",
    "check_condition",
    "check_template",
    "check_templates_in",
    "evaluate_condition",
    "is_template",
    "render_template",
    "render_value",
]


# --- checking -------------------------------------------------------------------------------


def check_template(text: object) -> str | None:
    """None when ``text`` is a usable template, else a short message saying why not.

    Parses under the limits of :mod:`workflows.definitions.sandbox` (bytes, tokens, depth);
    a message about a limit names it."""
    if not isinstance(text, str):
        return "must be a string"
    if not is_template(text):
        return None

    def parsed() -> tuple[nodes.Node, Iterable[str]]:
        tree = sandbox.parse_template(text)
        if next(tree.find_all(_SCOPING_NODES), None) is None:
            return tree, (n.name for n in tree.find_all(nodes.Name) if n.ctx == "load")
        return tree, meta.find_undeclared_variables(tree)

    return _parse_problem(text, parsed)


def check_condition(expr: object) -> str | None:
    """None when ``expr`` is a usable condition expression, else a short message."""
    if not isinstance(expr, str):
        return "must be a string"
    if not expr.strip():
        return "is empty"
    if expr.lstrip().startswith(("{{", "{%")):
        return "must be a bare expression such as input.total > 100, without {{ }}"

    def parsed() -> tuple[nodes.Node, Iterable[str]]:
        tree = sandbox.parse_condition(expr)
        found = (tree, *tree.find_all(nodes.Name))  # find_all skips the root: `x` alone
        names = (node.name for node in found if isinstance(node, nodes.Name) and node.ctx == "load")
        return tree, names

    return _parse_problem(expr, parsed)


def _parse_problem(text: str, parsed: Callable[[], tuple[nodes.Node, Iterable[str]]]) -> str | None:
    """What is wrong with a template or condition, as check_template and check_condition
    report it: parsed under the limits, then its names and filters checked."""
    try:
        tree, names = parsed()
        return _tree_problem(tree, names)
    except sandbox.AlreadyReported:
        return None
    except sandbox.TemplateTooLarge as exc:
        return str(exc)
    except TemplateSyntaxError as exc:
        return _syntax_message(exc, text)
    except RecursionError:
        return "is nested too deeply"
    except Exception as exc:
        return f"cannot be compiled: {error_for(exc).message}"


def check_templates_in(value: Any, field_path: str, report: StepReport) -> None:
    """Reports every malformed template string inside ``value`` with its exact field path.

    ``value`` may be a string, a number, or nested dicts and lists; paths read
    ``values.greeting`` or ``request.body.items.0``. Walks iteratively.
    """
    stack: list[tuple[str, Any, int]] = [(field_path, value, 0)]
    while stack:
        path, item, depth = stack.pop()
        if isinstance(item, str):
            problem = check_template(item)
            if problem:
                report.issue("malformed_template", path, f"is not a valid template: {problem}")
        elif isinstance(item, Mapping | list | tuple):
            if depth >= MAX_NESTING:
                report.issue("invalid_field", path, f"nests deeper than {MAX_NESTING} levels")
                continue
            pairs = item.items() if isinstance(item, Mapping) else enumerate(item)
            children = [(f"{path}.{key}", child, depth + 1) for key, child in pairs]
            stack.extend(reversed(children))


def _syntax_message(exc: TemplateSyntaxError, source: str) -> str:
    message = exc.message or "invalid syntax"
    if "\n" in source.strip() and exc.lineno:
        return f"{message} (line {exc.lineno})"
    return message


def _unknown_names(names: Iterable[str]) -> str | None:
    unknown = sorted(set(names) - CONTEXT_NAMES)
    if not unknown:
        return None
    available = ", ".join(sorted(CONTEXT_NAMES))
    return f'uses unknown name "{unknown[0]}" (available: {available})'


_SCOPING_NODES = (
    nodes.For, nodes.Assign, nodes.AssignBlock, nodes.Macro, nodes.CallBlock, nodes.With,
    nodes.Scope, nodes.OverlayScope, nodes.Block, nodes.FilterBlock,
)  # fmt: skip


def _tree_problem(tree: nodes.Node, names: Iterable[str]) -> str | None:
    """What compiling would refuse, read from the parsed tree (compiling costs a millisecond
    or more per template, and a definition may hold thousands)."""
    if next(tree.find_all(FORBIDDEN_NODES), None) is not None:
        return "cannot extend, include or import other templates"
    problem = _unknown_names(names)
    if problem:
        return problem
    for node in (tree, *tree.find_all((nodes.Filter, nodes.Test))):
        if not isinstance(node, nodes.Filter | nodes.Test):
            continue
        is_filter = isinstance(node, nodes.Filter)
        if node.name not in (ENVIRONMENT.filters if is_filter else ENVIRONMENT.tests):
            return f"No {'filter' if is_filter else 'test'} named {node.name!r}."
    return None


# --- rendering under the budget -------------------------------------------------------------


def render_template(
    text: str, context: Mapping[str, Any], *, max_bytes: int = MAX_OUTPUT_BYTES
) -> str:
    """Renders one template string under the budget (see :mod:`.sandbox`); raises
    ExpressionError on any failure, with code ``template_limit`` past a limit."""
    return str(sandbox.render("template", text, context, max_bytes))


def render_value(
    value: Any, context: Mapping[str, Any], *, max_bytes: int = MAX_OUTPUT_BYTES
) -> Any:
    """Renders every string inside ``value`` (dict values and list items, recursively),
    under the budget (see :mod:`.sandbox`).

    Keys, numbers, booleans and null are kept as they are. ``max_bytes`` bounds the total
    output of all the strings together.
    """
    return sandbox.render("value", value, context, max_bytes)


def evaluate_condition(expr: str, context: Mapping[str, Any]) -> bool:
    """Evaluates a condition to a bool under the budget (see :mod:`.sandbox`); raises
    ExpressionError on any failure.

    An undefined name or key raises (use ``is defined`` to test for optional data).
    """
    return bool(sandbox.render("condition", expr, context, MAX_OUTPUT_BYTES))
