"""A code workflow's input and output: checked against its JSON Schemas, and held to the
size limits every stored value of a run is held to.

``@workflow(input_schema=..., output_schema=...)`` gives the schemas; without one, a
TypedDict annotation of the function's input or return value gives it (``schema_of_type``,
for the types JSON has: no new dependency for a handful of them). The input is checked when
a run starts, before anything is written (``InputDoesNotMatchSchema``, 400
``invalid_input``, as a definition's input check answers); the output when the function
returns (the run fails with ``invalid_output``). A ``ctx.run`` result and the output are
held to ``WAYMARK_MAX_INPUT_BYTES`` and its nesting depth, as a run's input and a signal's
payload are (``result_too_large``, ``output_too_large``).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin, is_typeddict

from jsonschema import Draft202012Validator, SchemaError
from jsonschema.exceptions import ValidationError

from ..errors import InputDoesNotMatchSchema
from .context import CodeFailure, check_json, check_stored_size

Schema = Mapping[str, Any]
MAX_ERRORS = 20  # the most places of a refused input named in one answer


class SchemaProblem(Exception):
    """A schema, or a type hint meant to give one, that cannot be used: ``detail`` says why
    (registration raises it as CodeWorkflowError ``invalid_workflow``)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def checked_schema(schema: object, what: str) -> Schema:
    """``schema`` if it is a valid JSON Schema (draft 2020-12)."""
    if not isinstance(schema, Mapping):
        raise SchemaProblem(f"{what} must be a JSON Schema (a dict), not {type(schema).__name__}")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise SchemaProblem(f"{what} is not a valid JSON Schema: {exc.message}") from None
    return schema


def hinted_schemas(
    function: Callable[..., Any], *, of_input: bool, of_output: bool
) -> tuple[Schema | None, Schema | None]:
    """The input and output schemas the function's TypedDict hints give, of those asked
    (None where the hint is not a TypedDict)."""
    try:
        parameters = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):  # a callable whose signature Python cannot tell
        parameters = []
    input_hint = _hint(function, parameters[1]) if of_input and len(parameters) > 1 else None
    output_hint = _hint(function, "return") if of_output else None
    return (
        schema_of_type(input_hint, "input") if is_typeddict(input_hint) else None,
        schema_of_type(output_hint, "output") if is_typeddict(output_hint) else None,
    )


def _hint(function: Callable[..., Any], name: str) -> Any:
    """One annotation of the function, resolved in its module (the others are not read: the
    ``ctx`` hint may name a class imported for type checkers only). One that cannot be
    resolved is an error, not a schema silently left out."""
    annotations = getattr(function, "__annotations__", None) or {}
    if name not in annotations:
        return None
    one = types.SimpleNamespace(__annotations__={name: annotations[name]})
    try:
        return typing.get_type_hints(one, globalns=getattr(function, "__globals__", {}),
                                     include_extras=True)[name]  # fmt: skip
    except (NameError, TypeError, SyntaxError) as exc:
        where = "the return value" if name == "return" else f"the input ({name})"
        raise SchemaProblem(
            f"the hint of {where}, {annotations[name]!r}, cannot be read at registration "
            f"({exc}): define it at module level, or give input_schema=/output_schema="
        ) from None


def schema_of_type(hint: Any, where: str) -> dict[str, Any]:
    """The JSON Schema of a type hint made of the types JSON has: str, int, float, bool,
    None, Any, list[...], dict[str, ...], Literal[...], unions (``X | None``) and TypedDicts
    (their required and optional keys; keys they do not name are allowed)."""
    if hint is Any or hint is object:
        return {}
    if hint is None or hint is type(None):
        return {"type": "null"}
    for python, json_type in ((str, "string"), (bool, "boolean"), (int, "integer"),
                              (float, "number")):  # fmt: skip
        if hint is python:
            return {"type": json_type}
    if is_typeddict(hint):
        return _typeddict_schema(hint, where)
    origin, args = get_origin(hint), get_args(hint)
    if origin in (typing.Required, typing.NotRequired, typing.Annotated):
        return schema_of_type(args[0], where)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        return {"anyOf": [schema_of_type(arg, where) for arg in args]}
    if hint is list or origin in (list, Sequence):
        items = {"items": schema_of_type(args[0], f"{where}[]")} if args else {}
        return {"type": "array", **items}
    if hint is dict or origin in (dict, Mapping):
        if args and args[0] is not str:
            raise SchemaProblem(f"{where}: a JSON object's keys are strings, not {args[0]!r}")
        values = {"additionalProperties": schema_of_type(args[1], f"{where}.*")} if args else {}
        return {"type": "object", **values}
    raise SchemaProblem(
        f"{where}: {hint!r} has no JSON Schema here; give the schema with "
        "input_schema=/output_schema= instead"
    )


def _typeddict_schema(hint: Any, where: str) -> dict[str, Any]:
    fields = typing.get_type_hints(hint, include_extras=True)
    properties = {name: schema_of_type(field, f"{where}.{name}") for name, field in fields.items()}
    required = sorted(name for name, field in fields.items() if _required(hint, name, field))
    return {"type": "object", "properties": properties, "required": required}


# --- checks -----------------------------------------------------------------------------------


def problems(schema: Schema, value: Any, root: str) -> dict[str, list[str]]:
    """Each place of ``value`` that fails ``schema`` (``input.items.0``), with its messages."""
    found: dict[str, list[str]] = {}
    errors = sorted(Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))
    for error in errors[:MAX_ERRORS]:
        found.setdefault(_place(root, error), []).append(error.message)
    return found


def _place(root: str, error: ValidationError) -> str:
    return ".".join([root, *(str(part) for part in error.absolute_path)])


def check_start_input(schema: Schema | None, run_input: Any) -> None:
    """A start's input against the workflow's input schema (a start guard calls it)."""
    if schema is None:
        return
    found = problems(schema, run_input, "input")
    if found:
        place, messages = next(iter(found.items()))
        raise InputDoesNotMatchSchema(reason=f"{place}: {messages[0]}", errors=found)


def check_output(schema: Schema | None, output: Any) -> None:
    """What the function returned: JSON, within the size limit, matching the output schema."""
    check_json("output", output)
    check_stored_size("output", output, "output_too_large", "The workflow's output")
    if schema is None:
        return
    found = problems(schema, output, "output")
    if found:
        detail = "; ".join(f"{place}: {', '.join(messages)}" for place, messages in found.items())
        raise CodeFailure("invalid_output", f"the output does not match its schema: {detail}")


def _required(typed_dict: Any, name: str, field: Any) -> bool:
    """Whether a TypedDict's key is required. Its ``__required_keys__`` misses a
    ``NotRequired[...]`` written as a string (``from __future__ import annotations``), so
    the resolved hint says it first."""
    marker = get_origin(field)
    if marker is typing.NotRequired:
        return False
    if marker is typing.Required:
        return True
    return name in getattr(typed_dict, "__required_keys__", {name})
