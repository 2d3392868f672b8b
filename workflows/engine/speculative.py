"""Walks computed before any round trip (hops.py, starts.py): their writes are sent in one
statement afterwards, which checks what the walk assumed. Such a walk may not touch the
database itself: a statement of its own would need the transaction it does not have."""

from __future__ import annotations

from typing import Any


class NeedsDatabase(Exception):
    """A speculative walk tried to run a statement: its caller goes the slow way."""


class NoDatabase:
    """The cursor of a speculative walk: any statement ends the walk before it is sent."""

    def execute(self, *args: Any, **kwargs: Any) -> None:
        raise NeedsDatabase


def refuse(*args: Any, **kwargs: Any) -> None:
    """Django's execute wrapper during a speculative walk: an inline step that queries."""
    raise NeedsDatabase
