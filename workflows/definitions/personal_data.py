"""A definition's ``personal_data`` declaration: which of a run's values identify its person,
which others are that person's data, and what erasing the person does to a live run.

    "personal_data": {
        "identifiers": ["input.customer_id", "input.email"],
        "fields": ["input.name", "input.phone", "vars.address"],
        "on_erasure": "cancel"
    }

``identifiers``: paths into the run's input whose values name its person: a run is the
person's when one of them is the email address, phone number or identifier an erasure names.
``fields``: paths (into ``input``, ``vars`` or ``outputs.<step id>``) whose values are that
person's data too: erased with them wherever the run stored them. ``on_erasure``: ``cancel``
(the default) or ``finish`` (the run goes on without the erased values). See
docs/reference/definitions.md, "Personal data".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ON_ERASURE = ("cancel", "finish")
FIELDS = ("identifiers", "fields", "on_erasure")
MAX_PATHS = 50
IDENTIFIER_PATH = re.compile(r"input(\.[A-Za-z0-9_\-]+)+")
FIELD_PATH = re.compile(r"(input|vars|outputs\.[A-Za-z0-9_\-]+)(\.[A-Za-z0-9_\-]+)+")


@dataclass(frozen=True)
class Declaration:
    identifiers: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    on_erasure: str = "cancel"


def declaration_of(definition: Mapping[str, Any]) -> Declaration | None:
    """The declaration of a valid definition, or None when it declares nothing."""
    declared = definition.get("personal_data")
    if not isinstance(declared, dict):
        return None
    return Declaration(
        identifiers=tuple(declared.get("identifiers") or ()),
        fields=tuple(declared.get("fields") or ()),
        on_erasure=str(declared.get("on_erasure") or "cancel"),
    )


def value_at(data: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` (``input.customer.email``) of a run's data
    (``input``, ``vars``, ``outputs``), or None."""
    current: Any = data
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return None
        current = current[part]
    return current


def declaration_problems(value: object) -> list[tuple[str, str, str]]:
    """What is wrong with a ``personal_data`` value, as (issue code, field, message)."""
    if not isinstance(value, dict):
        return [("invalid_field", "personal_data", "personal_data must be an object")]
    problems = [
        ("unknown_field", f"personal_data.{key}",
         f"personal_data.{key} is not a field (fields: {', '.join(FIELDS)})")
        for key in value if key not in FIELDS
    ]  # fmt: skip
    for key, pattern, where in (
        ("identifiers", IDENTIFIER_PATH, "input.<key>[.<key>...]"),
        ("fields", FIELD_PATH, "input.<key>, vars.<key> or outputs.<step id>.<key>"),
    ):
        field, paths = f"personal_data.{key}", value.get(key, [])
        if not isinstance(paths, list) or len(paths) > MAX_PATHS:
            message = f"{field} must be a list of at most {MAX_PATHS} paths"
            problems.append(("invalid_field", field, message))
            continue
        for path in paths:
            if not isinstance(path, str) or pattern.fullmatch(path) is None:
                message = f"{field}: {path!r} is not a path like {where}"
                problems.append(("invalid_field", field, message))
    if value.get("on_erasure", "cancel") not in ON_ERASURE:
        message = f"personal_data.on_erasure must be one of {', '.join(ON_ERASURE)}"
        problems.append(("invalid_field", "personal_data.on_erasure", message))
    return problems
