"""The definition language's public helpers for step types and the data apps store:
templates (``is_template``, ``check_template``, a run's template context), durations, and
whether a text can be stored in PostgreSQL at all (``has_unstorable``: NUL characters, lone
surrogates), and a JSON value as a jsonb column gives it back (``as_stored``)."""

from __future__ import annotations

from ..definitions.expressions import build_context, check_template, is_template
from ..definitions.fields import parse_duration
from ..definitions.storable import (
    UNSTORABLE_REASON,
    as_stored,
    has_unstorable,
    storable_text,
    unstorable_path,
)

__all__ = [
    "UNSTORABLE_REASON",
    "as_stored",
    "build_context",
    "check_template",
    "has_unstorable",
    "is_template",
    "parse_duration",
    "storable_text",
    "unstorable_path",
]
