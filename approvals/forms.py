"""A task's form: a small schema of fields, checked when a definition is saved, and the
answer checked against it when a person submits.

    {"fields": [
        {"name": "invoice", "label": "Invoice number", "type": "text", "required": true,
         "max_length": 40},
        {"name": "amount", "type": "number", "min": 0, "max": 100000},
        {"name": "due", "type": "date"},
        {"name": "channel", "type": "choice", "choices": ["email", "post"]},
        {"name": "scan", "type": "file_name"}
    ]}

Types: ``text`` (a string, ``max_length`` default 1000), ``number`` (an int or a float,
optional ``min``/``max``), ``date`` (``YYYY-MM-DD``), ``choice`` (one of ``choices``),
``file_name`` (a file's name, no path: no ``/``, ``\\`` or control characters, at most 255
characters; the file itself is not uploaded here). ``required`` defaults to false; an
optional field left out (or empty) is stored as null.

Both checks are JSON Schemas run by jsonschema: ``FORM_SCHEMA`` describes a valid form, and
``answer_schema`` builds one for a form's answers. Their errors are mapped to this module's
own messages (the definition validator and the API show them; each is stable). What a JSON
Schema cannot say stays here: a field name used twice, a number given as text, an empty
value as null.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator, ValidationError
from jsonschema.validators import extend

FIELD_TYPES = ("text", "number", "date", "choice", "file_name")
# A field's keys in the order its problems are reported (a key it must not have, first).
FIELD_KEYS = ("name", "type", "required", "label", "help", "max_length", "min", "max", "choices")
MAX_FIELDS = 30
MAX_CHOICES = 100
MAX_TEXT = 10_000
DEFAULT_TEXT = 1000
# The end of the text: jsonschema matches patterns with Python's re.search, whose $ also
# matches before a final newline ("abc\n" would pass "^[a-z]+$").
END = r"(?![\s\S])"


def _is_number(_checker: Any, value: Any) -> bool:
    """A number as JSON means it: not a bool (Python's True is an int), and finite (Python's
    json reads NaN and Infinity), within what a float holds (a whole number past it, which
    JSON allows, is none a reader can take as a number; math.isfinite raised on it)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, int):
        return -sys.float_info.max <= value <= sys.float_info.max
    return math.isfinite(value)


def _is_integer(_checker: Any, value: Any) -> bool:
    """A whole number written as one: 40.0 is not a max_length."""
    return isinstance(value, int) and not isinstance(value, bool)


Validator = extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"number": _is_number, "integer": _is_integer}
    ),
)


# A key refused whatever its value. Not the schema ``false``: jsonschema's error for that
# lacks the key in its path.
REFUSED: dict[str, Any] = {"not": {}}


def _only_for(kind: str, *keys: str, then: dict[str, Any] | None = None) -> dict[str, Any]:
    """``keys`` are allowed only in fields of type ``kind`` (and there, ``then`` applies)."""
    return {
        "if": {"properties": {"type": {"const": kind}}, "required": ["type"]},
        "then": then or {},
        "else": {"properties": {key: REFUSED for key in keys}},
    }


SHORT_TEXT = {"type": "string", "maxLength": 500}
CHOICE_FIELD = {
    "required": ["choices"],
    "properties": {
        "choices": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_CHOICES,
            "items": {"type": "string", "minLength": 1, "maxLength": 200},
        }
    },
}
FIELD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "type"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,62}" + END},
        "type": {"enum": list(FIELD_TYPES)},
        "required": {"type": "boolean"},
        "label": SHORT_TEXT,
        "help": SHORT_TEXT,
        "max_length": {"type": "integer", "minimum": 1, "maximum": MAX_TEXT},
        "min": {"type": "number"},
        "max": {"type": "number"},
        "choices": {},  # checked in the choice fields only (below)
    },
    "allOf": [
        _only_for("text", "max_length"),
        _only_for("number", "min", "max"),
        _only_for("choice", "choices", then=CHOICE_FIELD),
    ],
}
FORM_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["fields"],
    "additionalProperties": False,
    "properties": {
        "fields": {"type": "array", "minItems": 1, "maxItems": MAX_FIELDS, "items": FIELD_SCHEMA}
    },
}
Validator.check_schema(FORM_SCHEMA)
FORM_VALIDATOR = Validator(FORM_SCHEMA)

FORM_MESSAGE = 'must be an object with "fields" (a list of fields)'
FIELDS_MESSAGE = f"must be a list of 1 to {MAX_FIELDS} fields"
# What is wrong with a field key's value; ONLY_FOR where the key is refused for the field's
# type and that says something else.
KEY_MESSAGES = {
    "name": "must be lowercase letters, digits and _ (at most 63)",
    "type": f"must be one of {', '.join(FIELD_TYPES)}",
    "required": "must be true or false",
    "label": "must be a string of at most 500 characters",
    "help": "must be a string of at most 500 characters",
    "max_length": f"only for text: a whole number 1 to {MAX_TEXT}",
    "min": "only for number: a number",
    "max": "only for number: a number",
    "choices": f"must be 1 to {MAX_CHOICES} non-empty strings",
}
ONLY_FOR = {"choices": "only for choice"}


class FormInvalid(Exception):
    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = errors
        first = next(iter(errors.items()))
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"{first[0]}: {first[1]}{more}")


# --- the form ----------------------------------------------------------------------------------


def schema_problems(form: Any) -> list[tuple[str, str]]:
    """What is wrong with a form schema: (path, message) pairs, empty when it is valid. A form
    that is not an object with a list of fields is one problem; otherwise each field's, in
    the fields' order, at most one per key."""
    errors = list(FORM_VALIDATOR.iter_errors(form))
    if any(not e.absolute_path and e.validator != "required" for e in errors):
        return [("form", FORM_MESSAGE)]
    if any(len(e.absolute_path) < 2 for e in errors):
        return [("form.fields", FIELDS_MESSAGE)]
    problems: dict[tuple[int, int], tuple[str, str]] = {}
    for error in errors:
        for order, problem in _field_problems(error):
            problems.setdefault(order, problem)
    for position, name in _names_used_twice(form["fields"], problems):
        problems[(position, FIELD_KEYS.index("name"))] = (
            f"form.fields.{position}.name",
            f"{name!r} is used twice",
        )
    return [problems[order] for order in sorted(problems)]


def _field_problems(error: ValidationError) -> list[tuple[tuple[int, int], tuple[str, str]]]:
    """One jsonschema error in a field (its path starts ``fields, position``) as this
    module's problems, each with its place in the report: (position, key's rank)."""
    position, *rest = list(error.absolute_path)[1:]
    where = f"form.fields.{position}"
    if rest:  # a key's value (or an item of it)
        key = str(rest[0])
        refused = error.schema is REFUSED  # the key is not for this field's type
        message = ONLY_FOR.get(key, KEY_MESSAGES[key]) if refused else KEY_MESSAGES[key]
        return [((position, FIELD_KEYS.index(key)), (f"{where}.{key}", message))]
    if error.validator == "additionalProperties":
        key = sorted(set(error.instance) - set(FIELD_KEYS))[0]
        message = f"is not a field key ({', '.join(sorted(FIELD_KEYS))})"
        return [((position, -1), (f"{where}.{key}", message))]
    if error.validator == "required":
        missing = [key for key in error.validator_value if key not in error.instance]
        return [
            ((position, FIELD_KEYS.index(key)), (f"{where}.{key}", KEY_MESSAGES[key]))
            for key in missing
        ]
    return [((position, -2), (where, "must be an object"))]


def _names_used_twice(
    fields: list[Any], problems: Mapping[tuple[int, int], Any]
) -> list[tuple[int, str]]:
    """Fields whose (valid) name an earlier field has: a JSON Schema cannot say it."""
    seen: set[str] = set()
    twice: list[tuple[int, str]] = []
    for position, spec in enumerate(fields):
        if (position, FIELD_KEYS.index("name")) in problems or not isinstance(spec, Mapping):
            continue
        name = str(spec["name"])
        if name in seen:
            twice.append((position, name))
        seen.add(name)
    return twice


# --- an answer ---------------------------------------------------------------------------------


def answer_schema(form: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON Schema an answer to ``form`` meets once its empty values are dropped."""
    specs = form.get("fields", [])
    return {
        "type": "object",
        "properties": {spec["name"]: _value_schema(spec) for spec in specs},
        "required": [spec["name"] for spec in specs if spec.get("required")],
        "additionalProperties": False,
    }


def _value_schema(spec: Mapping[str, Any]) -> dict[str, Any]:
    kind = spec["type"]
    if kind == "text":
        limit = spec.get("max_length", DEFAULT_TEXT)
        return {"type": "string", "maxLength": limit, "not": {"pattern": "\x00"}}
    if kind == "number":
        bounds = {"min": "minimum", "max": "maximum"}
        return {"type": "number", **{bounds[k]: spec[k] for k in bounds if k in spec}}
    if kind == "date":
        # The format checks it is a real date; the pattern, the form it is written in.
        return {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}" + END, "format": "date"}
    if kind == "choice":
        return {"enum": list(spec["choices"])}
    # file_name: no path (no / or \), no control characters, not . or ..
    return {
        "type": "string",
        "maxLength": 255,
        "not": {"anyOf": [{"enum": [".", ".."]}, {"pattern": r"[/\\\u0000-\u001f\u007f]"}]},
    }


def _value_message(spec: Mapping[str, Any], error: ValidationError) -> str:
    """What is wrong with a field's value, from the keyword of its schema that refused it."""
    kind, keyword = spec["type"], error.validator
    if kind == "text":
        if keyword == "type":
            return "must be text"
        if keyword == "not":
            return "must not contain a NUL character"
        return f"must be at most {spec.get('max_length', DEFAULT_TEXT)} characters"
    if kind == "number":
        if keyword == "minimum":
            return f"must be at least {spec['min']}"
        if keyword == "maximum":
            return f"must be at most {spec['max']}"
        return "must be a number"
    if kind == "date":
        return f"must be a {'real ' if keyword == 'format' else ''}date as YYYY-MM-DD"
    if kind == "choice":
        return f"must be one of {', '.join(spec['choices'])}"
    return "must be a file name (no path, at most 255 characters)"


def clean_answer(form: Mapping[str, Any], answer: Any) -> dict[str, Any]:
    """The answer, checked and normalised against ``form``; FormInvalid says what is wrong
    with each field. Fields the form does not have are refused."""
    if not isinstance(answer, Mapping):
        raise FormInvalid({"answer": "must be an object of field values"})
    specs = {spec["name"]: spec for spec in form.get("fields", [])}
    given = {
        name: _as_number(value) if name in specs and specs[name]["type"] == "number" else value
        for name, value in answer.items()
        if name not in specs or not _empty(value)  # a field the form lacks is refused, even empty
    }
    validator = Validator(answer_schema(form), format_checker=Validator.FORMAT_CHECKER)
    unknown: dict[str, str] = {}
    by_field: dict[str, str] = {}
    for error in validator.iter_errors(given):
        if error.validator == "additionalProperties":
            for name in sorted(set(given) - set(specs)):
                unknown[str(name)[:100]] = "is not a field of this form"
        elif error.validator == "required":
            for name in error.validator_value:
                if name not in given:
                    by_field.setdefault(name, "is required")
        else:
            name = str(error.absolute_path[0])
            by_field.setdefault(name, _value_message(specs[name], error))
    errors = unknown | {name: by_field[name] for name in specs if name in by_field}
    if errors:
        raise FormInvalid(errors)
    return {name: given.get(name) for name in specs}


def _empty(value: Any) -> bool:
    """Left out: null, or text of nothing but spaces (stored as null)."""
    return value is None or (isinstance(value, str) and not value.strip())


def _as_number(value: Any) -> Any:
    """A number field's value given as text (an HTML form sends text), as a number; text
    that is not one stays text, which the schema refuses."""
    if not isinstance(value, str):
        return value
    try:
        return float(value) if any(c in value for c in ".eE") else int(value)
    except ValueError:
        return value
