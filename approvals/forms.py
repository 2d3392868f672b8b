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
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import date
from typing import Any

FIELD_TYPES = ("text", "number", "date", "choice", "file_name")
FIELD_KEYS = {"name", "label", "type", "required", "max_length", "min", "max", "choices", "help"}
NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
MAX_FIELDS = 30
MAX_CHOICES = 100
MAX_TEXT = 10_000
DEFAULT_TEXT = 1000


class FormInvalid(Exception):
    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = errors
        first = next(iter(errors.items()))
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"{first[0]}: {first[1]}{more}")


def schema_problems(form: Any) -> list[tuple[str, str]]:
    """What is wrong with a form schema: (path, message) pairs, empty when it is valid."""
    if not isinstance(form, Mapping) or set(form) - {"fields"}:
        return [("form", 'must be an object with "fields" (a list of fields)')]
    fields = form.get("fields")
    if not isinstance(fields, list) or not 1 <= len(fields) <= MAX_FIELDS:
        return [("form.fields", f"must be a list of 1 to {MAX_FIELDS} fields")]
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    for position, spec in enumerate(fields):
        where = f"form.fields.{position}"
        if not isinstance(spec, Mapping):
            problems.append((where, "must be an object"))
            continue
        unknown = sorted(set(spec) - FIELD_KEYS)
        if unknown:
            problems.append(
                (f"{where}.{unknown[0]}", f"is not a field key ({', '.join(sorted(FIELD_KEYS))})")
            )
        name = spec.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            problems.append(
                (f"{where}.name", "must be lowercase letters, digits and _ (at most 63)")
            )
        elif name in seen:
            problems.append((f"{where}.name", f"{name!r} is used twice"))
        else:
            seen.add(name)
        kind = spec.get("type")
        if kind not in FIELD_TYPES:
            problems.append((f"{where}.type", f"must be one of {', '.join(FIELD_TYPES)}"))
        if "required" in spec and not isinstance(spec["required"], bool):
            problems.append((f"{where}.required", "must be true or false"))
        for text_key in ("label", "help"):
            if text_key in spec and (
                not isinstance(spec[text_key], str) or len(spec[text_key]) > 500
            ):
                problems.append(
                    (f"{where}.{text_key}", "must be a string of at most 500 characters")
                )
        if "max_length" in spec:
            value = spec["max_length"]
            if kind != "text" or not _whole(value) or not 1 <= value <= MAX_TEXT:
                problems.append(
                    (f"{where}.max_length", f"only for text: a whole number 1 to {MAX_TEXT}")
                )
        for bound in ("min", "max"):
            if bound in spec and (kind != "number" or not _number(spec[bound])):
                problems.append((f"{where}.{bound}", "only for number: a number"))
        if kind == "choice":
            choices = spec.get("choices")
            if (
                not isinstance(choices, list)
                or not 1 <= len(choices) <= MAX_CHOICES
                or not all(isinstance(c, str) and c and len(c) <= 200 for c in choices)
            ):
                problems.append(
                    (f"{where}.choices", f"must be 1 to {MAX_CHOICES} non-empty strings")
                )
        elif "choices" in spec:
            problems.append((f"{where}.choices", "only for choice"))
    return problems


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def clean_answer(form: Mapping[str, Any], answer: Any) -> dict[str, Any]:
    """The answer, checked and normalised against ``form``; FormInvalid says what is wrong
    with each field. Fields the form does not have are refused."""
    if not isinstance(answer, Mapping):
        raise FormInvalid({"answer": "must be an object of field values"})
    specs = {spec["name"]: spec for spec in form.get("fields", [])}
    errors: dict[str, str] = {}
    for name in sorted(set(answer) - set(specs)):
        errors[str(name)[:100]] = "is not a field of this form"
    cleaned: dict[str, Any] = {}
    for name, spec in specs.items():
        value = answer.get(name)
        if value is None or (isinstance(value, str) and not value.strip()):
            if spec.get("required"):
                errors[name] = "is required"
            cleaned[name] = None
            continue
        try:
            cleaned[name] = _clean_value(spec, value)
        except ValueError as exc:
            errors[name] = str(exc)
    if errors:
        raise FormInvalid(errors)
    return cleaned


def _clean_value(spec: Mapping[str, Any], value: Any) -> Any:
    kind = spec["type"]
    if kind == "text":
        limit = spec.get("max_length", DEFAULT_TEXT)
        if not isinstance(value, str):
            raise ValueError("must be text")
        if len(value) > limit or "\x00" in value:
            raise ValueError(f"must be at most {limit} characters")
        return value
    if kind == "number":
        if isinstance(value, str):
            try:
                value = float(value) if any(c in value for c in ".eE") else int(value)
            except ValueError:
                raise ValueError("must be a number") from None
        if not _number(value):
            raise ValueError("must be a number")
        if "min" in spec and value < spec["min"]:
            raise ValueError(f"must be at least {spec['min']}")
        if "max" in spec and value > spec["max"]:
            raise ValueError(f"must be at most {spec['max']}")
        return value
    if kind == "date":
        if not isinstance(value, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            raise ValueError("must be a date as YYYY-MM-DD")
        try:
            return date.fromisoformat(value).isoformat()
        except ValueError:
            raise ValueError("must be a real date as YYYY-MM-DD") from None
    if kind == "choice":
        if value not in spec["choices"]:
            raise ValueError(f"must be one of {', '.join(spec['choices'])}")
        return value
    # file_name
    if (
        not isinstance(value, str)
        or len(value) > 255
        or value in (".", "..")
        or any(c in value for c in "/\\")
        or any(ord(c) < 32 or ord(c) == 127 for c in value)
    ):
        raise ValueError("must be a file name (no path, at most 255 characters)")
    return value
