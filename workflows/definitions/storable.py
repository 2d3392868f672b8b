"""What PostgreSQL cannot store in text or jsonb: NUL characters and unpaired surrogates.

JSON can carry ``\\u0000`` and lone ``\\ud800`` escapes, and Python strings hold them, but a
``text`` or ``jsonb`` column refuses them. Inputs, definitions and rendered templates are
checked here first, so such data gets a clear 4xx (or a failed step) instead of a database
error.
"""

from __future__ import annotations

import re
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
