"""What PostgreSQL cannot store in text or jsonb: NUL characters and unpaired surrogates.

JSON can carry ``\\u0000`` and lone ``\\ud800`` escapes, and Python strings hold them, but a
``text`` or ``jsonb`` column refuses them. Inputs, definitions and rendered templates are
checked here first, so such data gets a clear 4xx (or a failed step) instead of a database
error.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable_path(value: Any) -> str | None:
    """The dotted path of the first string or key PostgreSQL cannot store, or None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item):
                return path or "(the value)"
        elif isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and _UNSTORABLE.search(key):
                    return child_path.encode("unicode_escape").decode()
                stack.append((child, child_path))
        elif isinstance(item, list):
            stack.extend((child, f"{path}.{index}" if path else str(index))
                         for index, child in enumerate(item))  # fmt: skip
    return None


def has_unstorable(text: str) -> bool:
    return _UNSTORABLE.search(text) is not None


def storable_text(text: str) -> str:
    """``text`` with each character PostgreSQL cannot store written as its escape (``\\x00``,
    ``\\ud800``): for a message made of what code raised, which is stored as it reads."""
    if not has_unstorable(text):
        return text
    return _UNSTORABLE.sub(lambda found: found.group().encode("unicode_escape").decode(), text)


UNSTORABLE_REASON = "contains a NUL character or an unpaired surrogate, which cannot be stored"


def as_stored(value: Any) -> Any:
    """``value`` (JSON that json.dumps writes) as a ``jsonb`` column gives it back: JSON's
    types (a tuple is a list, a key a string), an object's keys in jsonb's order (shorter
    first, then by their UTF-8 bytes), a number as PostgreSQL's numeric writes it (a float
    written with a positive exponent, ``1e+16``, comes back an int; ``-0.0`` is ``0.0``).

    For a value handed to code both right after it was made and, later, as read back from
    the database (a code run's replay, workflows/code/history.py): the code must meet one
    value whichever way it came, or a loop over an object's keys goes another way."""
    if value is None or type(value) in _ALREADY_STORED:
        return value
    return json.loads(json.dumps(value), object_pairs_hook=_jsonb_object,
                      parse_float=_jsonb_number)  # fmt: skip


_ALREADY_STORED = (str, int, bool)


def _jsonb_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    kept = dict(pairs)  # a key given twice keeps its last value, as in jsonb
    return {key: kept[key] for key in sorted(kept, key=_jsonb_key_order)}


def _jsonb_key_order(key: str) -> tuple[int, bytes]:
    encoded = key.encode("utf-8", "surrogatepass")
    return len(encoded), encoded


def _jsonb_number(text: str) -> int | float:
    """A JSON number with a fraction or an exponent, as jsonb's numeric gives it back: with
    no digit after the point once the exponent is applied (``1e+16``, ``1.5e+16``), an int;
    otherwise the same float, but never ``-0.0`` (numeric has no negative zero)."""
    mantissa, _, exponent = text.lower().partition("e")
    scale = len(mantissa.partition(".")[2]) - int(exponent or 0)
    if scale <= 0:
        return int(Decimal(text))
    number = float(text)
    return number if number else 0.0
