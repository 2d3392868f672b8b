"""What a process is to the engine, as its database connections name it.

``WAYMARK_PROCESS_ROLE`` (``web``, ``worker-io``, ``worker-io-suspects``, ``relay``, ``sweep``)
is set by ``runengine`` for each child it starts, and by the ``worker``, ``relay`` and
``sweep`` commands for themselves (workflows/engine/processes.py); any other process
(``manage.py migrate``, ``doctor``, a shell) is ``manage``. Every database connection
carries ``waymark-<role>`` as its ``application_name``, so ``pg_stat_activity`` (and the
server's log, with ``%a`` in ``log_line_prefix``) says which process holds each one.

A name the operator chose wins, as libpq decides it: ``application_name`` in DATABASE_URL
first, then the ``PGAPPNAME`` environment variable, kept as they are; Waymark's role name
only when neither is set. So the role name goes to libpq as ``fallback_application_name``
(``OPTION``), the parameter libpq meant for an application's own default, never as
``application_name``, which would hide ``PGAPPNAME``.
"""

from __future__ import annotations

import os

ROLE_ENV = "WAYMARK_PROCESS_ROLE"
DEFAULT_ROLE = "manage"
PREFIX = "waymark-"
# The connection parameter that carries the role name: libpq uses it only when neither the
# connection's application_name nor PGAPPNAME names the connection.
OPTION = "fallback_application_name"
# PostgreSQL keeps the first NAMEDATALEN - 1 bytes of an application_name.
MAX_LENGTH = 63


def application_name(role: str | None = None) -> str:
    """``waymark-<role>``: the given role, else this process's (its environment's)."""
    chosen = role or os.environ.get(ROLE_ENV, "").strip() or DEFAULT_ROLE
    return (PREFIX + chosen)[:MAX_LENGTH]
