"""Walks computed before any transaction (hops.py, starts.py): their writes are sent in one
statement afterwards, which checks what the walk assumed (the run row's version, the step's
fence, the start key).

The rule every such fast path keeps: it gives the ordinary walk's result, or it hands the hop
to the ordinary walk (workflows/engine/walk.py, inside the run's locked transaction) before
anything is written. What a walk ahead may enter is asked of each step type's declaration
(``StepType.runs_ahead``: a worker lane's step, whose row is all the walk writes, or an inline
type declared ``pure``); a step type that says nothing, a plugin's included, is entered by the
ordinary walk only. A walk ahead may not touch the database either: a statement would need
the transaction it does not have, so its cursor and Django's connection refuse to send one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import connection

logger = logging.getLogger(__name__)


class NeedsTransaction(Exception):
    """A walk ahead reached what only the ordinary walk may do: its caller goes that way."""


class NoDatabase:
    """The cursor of a walk ahead: any statement ends the walk before it is sent."""

    def execute(self, *args: Any, **kwargs: Any) -> None:
        raise NeedsTransaction("a statement")


def refuse(*args: Any, **kwargs: Any) -> None:
    """Django's execute wrapper during a walk ahead: a step that queries ends it."""
    raise NeedsTransaction("a statement")


def walked_ahead(walk: Callable[[], None], *, run_id: int) -> bool:
    """Run ``walk`` (a walk's transitions) ahead of any transaction; False when it must be
    walked the ordinary way instead (nothing of it may be written).

    Any other exception hands the walk over too: the ordinary walk is the reference, and it
    meets the same exception where it is a real failure (recorded as the step's or the
    run's), instead of a fast path deciding what it would not."""
    try:
        with connection.execute_wrapper(refuse):
            walk()
    except NeedsTransaction:
        return False
    except Exception:
        logger.warning("walk ahead of run %s failed; walking it the ordinary way", run_id,
                       exc_info=True)  # fmt: skip
        return False
    return True
