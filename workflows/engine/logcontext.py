"""What a log line is about: the run, step and organisation, on every line logged meanwhile.

With ``WAYMARK_LOG_FORMAT=json`` every process logs one JSON object a line (time, level,
logger, message), and ``ContextFilter`` adds the fields bound here where they apply:
``run_id``, ``step``, ``iteration``, ``attempt`` and ``org_id`` while a worker runs a step
attempt (worker.py), ``org_id`` while the web serves an API key's request
(``monitoring.LogContextMiddleware``, api/auth.py), and ``trace_id`` and ``span_id`` while
tracing is on (tracing.py).

The fields live in a context variable, so each thread (a worker's step threads, the web's
request threads) has its own. Binding costs nothing unless the filter is installed: in the
text format nothing is bound at all (``on()``).

Imported by the logging configuration (waymark_config/settings.py names ``ContextFilter`` by
dotted path) before the apps are ready: it imports nothing of Django's models or the engine's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

_EMPTY: MappingProxyType[str, Any] = MappingProxyType({})
_fields: ContextVar[MappingProxyType[str, Any]] = ContextVar("waymark_log_fields", default=_EMPTY)
_wanted = False  # a ContextFilter is installed: the fields are written somewhere


def on() -> bool:
    """Whether log lines carry the bound fields (a ContextFilter is installed)."""
    return _wanted


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Lines logged in this thread while the block runs carry ``fields`` too."""
    token = _fields.set(MappingProxyType({**_fields.get(), **fields}))
    try:
        yield
    finally:
        _fields.reset(token)


def bind(**fields: Any) -> None:
    """Add ``fields`` until this thread's context is next cleared (``clear``: the web clears
    it as each request begins, so a request's lines, Django's own after its middleware
    included, carry what was bound while serving it)."""
    _fields.set(MappingProxyType({**_fields.get(), **fields}))


def clear() -> None:
    _fields.set(_EMPTY)


def current() -> MappingProxyType[str, Any]:
    return _fields.get()


class ContextFilter(logging.Filter):
    """Puts the bound fields (and the current span's ids) on each record, as attributes the
    JSON formatter writes. Installing one (the logging configuration) turns binding on."""

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        global _wanted
        _wanted = True

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _fields.get().items():
            if not hasattr(record, key):  # a field the caller passed in ``extra`` wins
                setattr(record, key, value)
        ids = _trace_ids()
        if ids is not None:
            record.trace_id, record.span_id = ids
        return True


def _trace_ids() -> tuple[str, str] | None:
    from .tracing import current_ids  # imported late: tracing needs the engine's modules

    return current_ids()
