"""JSON Schemas from a code workflow's type hints: a TypedDict annotation of its input or
its return value gives the schema ``@workflow`` would otherwise be given.

Only the types JSON has are turned into a schema (a handful, so no new dependency); any
other, or a hint that cannot be resolved when the workflow registers, is an error at
registration (``SchemaProblem``, raised as ``invalid_workflow``), never a check silently
left out.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin, is_typeddict

from .schemas import Schema, SchemaProblem


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
    if input_hint is not None and not _may_be_an_object(input_hint):
        # The input is always a JSON object (a dict): a dataclass, a model or a str hint
        # would fail the run at its first attribute, not at registration.
        raise SchemaProblem(
            f"the input ({parameters[1]}) is a JSON object (a dict), never {input_hint!r}: "
            "hint it with a TypedDict or dict[str, Any], or give input_schema="
        )
    return (
        schema_of_type(input_hint, "input") if _is_typeddict(input_hint) else None,
        schema_of_type(output_hint, "output") if _is_typeddict(output_hint) else None,
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


def _is_typeddict(hint: Any) -> bool:
    """A TypedDict, typing's or typing_extensions' (a class of its own where it adds to
    typing's, which typing.is_typeddict does not know: its hint gave no schema, silently)."""
    return is_typeddict(hint) or (
        isinstance(hint, type) and issubclass(hint, dict)
        and hasattr(hint, "__required_keys__") and hasattr(hint, "__optional_keys__")
    )  # fmt: skip


def _may_be_an_object(hint: Any) -> bool:
    """Whether a dict may be of the type hint (a construct not read here is given the
    benefit of the doubt: a TypeVar, a Protocol that cannot be checked)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_may_be_an_object(arg) for arg in args)
    if origin in (typing.Annotated, typing.Required, typing.NotRequired):
        return _may_be_an_object(args[0])
    if origin is Literal or hint is None or hint is type(None):
        return False
    kind = origin or hint
    try:
        return not isinstance(kind, type) or isinstance({}, kind)
    except TypeError:
        return True


def schema_of_type(hint: Any, where: str, within: tuple[Any, ...] = ()) -> dict[str, Any]:
    """The JSON Schema of a type hint made of the types JSON has: str, int, float, bool,
    None, Any, list[...], dict[str, ...], Literal[...], unions (``X | None``) and TypedDicts
    (their required and optional keys; keys they do not name are allowed). ``within``: the
    TypedDicts whose fields this hint is in (one that holds itself has no schema here)."""
    if hint is Any or hint is object:
        return {}
    if hint is None or hint is type(None):
        return {"type": "null"}
    for python, json_type in ((str, "string"), (bool, "boolean"), (int, "integer"),
                              (float, "number")):  # fmt: skip
        if hint is python:
            return {"type": json_type}
    if _is_typeddict(hint):
        if hint in within:
            raise SchemaProblem(f"{where}: {hint.__name__} holds itself; give the schema")
        return _typeddict_schema(hint, where, (*within, hint))
    origin, args = get_origin(hint), get_args(hint)
    if origin in (typing.Required, typing.NotRequired, typing.Annotated):
        return schema_of_type(args[0], where, within)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        return {"anyOf": [schema_of_type(arg, where, within) for arg in args]}
    if hint is list or origin in (list, Sequence):
        items = {"items": schema_of_type(args[0], f"{where}[]", within)} if args else {}
        return {"type": "array", **items}
    if hint is dict or origin in (dict, Mapping):
        if args and args[0] is not str:
            raise SchemaProblem(f"{where}: a JSON object's keys are strings, not {args[0]!r}")
        values = (
            {"additionalProperties": schema_of_type(args[1], f"{where}.*", within)} if args else {}
        )
        return {"type": "object", **values}
    raise SchemaProblem(
        f"{where}: {hint!r} has no JSON Schema here; give the schema with "
        "input_schema=/output_schema= instead"
    )


def _typeddict_schema(hint: Any, where: str, within: tuple[Any, ...]) -> dict[str, Any]:
    try:
        fields = typing.get_type_hints(hint, include_extras=True)
    except (NameError, TypeError) as exc:
        raise SchemaProblem(
            f"{where}: the fields of {hint.__name__} cannot be read ({exc})"
        ) from None
    properties = {name: schema_of_type(field, f"{where}.{name}", within)
                  for name, field in fields.items()}  # fmt: skip
    required = sorted(name for name, field in fields.items() if _required(hint, name, field))
    return {"type": "object", "properties": properties, "required": required}


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
