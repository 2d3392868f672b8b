"""A code workflow's input and output: checked against its JSON Schemas, and held to the
size limits every stored value of a run is held to.

``@workflow(input_schema=..., output_schema=...)`` gives the schemas; without one, a
TypedDict annotation of the function's input or return value gives it (type_hints.py). The
input is checked when a run starts, before anything is written (``InputDoesNotMatchSchema``,
400 ``invalid_input``, as a definition's input check answers); the output when the function
returns (the run fails with ``invalid_output``). A ``ctx.run`` result and the output are
held to ``WAYMARK_MAX_INPUT_BYTES`` and its nesting depth, as a run's input and a signal's
payload are (``result_too_large``, ``output_too_large``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator, SchemaError, validators
from jsonschema.exceptions import ValidationError

from ..definitions.storable import as_stored
from ..errors import InputDoesNotMatchSchema
from .context import CodeFailure, check_json, within_stored_limits

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


def _is_int(checker: object, instance: object) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


# JSON Schema's "integer" takes 2.0 (a number whose fraction is zero); Python's json reads it
# as a float, and a workflow whose hint says int would be handed one (range(2.0) raises). Here
# an integer is what Python reads as an int, as the TypedDict hints that give most schemas say.
CodeValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_int),
)


def problems(schema: Schema, value: Any, root: str) -> dict[str, list[str]]:
    """Each place of ``value`` that fails ``schema`` (``input.items.0``), with its messages."""
    found: dict[str, list[str]] = {}
    validator = _validator(schema)
    if validator.is_valid(value):
        return found
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
    for error in errors[:MAX_ERRORS]:
        found.setdefault(_place(root, error), []).append(error.message)
    return found


# By the schema object a registration holds (kept here too, so its id is never another's):
# a validator is made once, not at every start and every run's end.
_validators: dict[int, tuple[Schema, Any]] = {}


def _validator(schema: Schema) -> Any:
    made = _validators.get(id(schema))
    if made is not None and made[0] is schema:
        return made[1]
    validator = CodeValidator(schema)
    if len(_validators) >= 1024:
        _validators.clear()
    _validators[id(schema)] = (schema, validator)
    return validator


def _place(root: str, error: ValidationError) -> str:
    return ".".join([root, *(str(part) for part in error.absolute_path)])


def check_start_input(schema: Schema | None, run_input: Any) -> None:
    """A start's input against the workflow's input schema (a start guard calls it)."""
    if schema is None:
        return
    found = problems(schema, run_input, "input")
    if found:
        place, messages = next(iter(found.items()))
        more = sum(map(len, found.values())) - 1
        also = f" (and {more} more: see errors)" if more else ""
        raise InputDoesNotMatchSchema(reason=f"{place}: {messages[0]}{also}", errors=found)


def check_output(schema: Schema | None, output: Any) -> None:
    """What the function returned: JSON, within the size limit, matching the output schema
    as the run keeps it (storable.as_stored: a tuple is a list, a key a string), as a
    start's input is checked."""
    check_json("output", output)
    within_stored_limits("output", output, "output_too_large", "The workflow's output")
    if schema is None:
        return
    found = problems(schema, as_stored(output), "output")
    if found:
        detail = "; ".join(f"{place}: {', '.join(messages)}" for place, messages in found.items())
        raise CodeFailure("invalid_output", f"the output does not match its schema: {detail}")
