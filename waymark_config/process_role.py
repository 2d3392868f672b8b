"""What a process is to the engine, as its database connections name it.

``WAYMARK_PROCESS_ROLE`` (``web``, ``worker-io``, ``worker-io-suspects``, ``relay``, ``sweep``)
is set by ``runengine`` for each child it starts, and by the ``worker``, ``relay`` and
``sweep`` commands for themselves (workflows/engine/processes.py); any other process
(``manage.py migrate``, ``doctor``, a shell) is ``manage``. Every database connection
carries ``waymark-<role>`` as its ``application_name``, so ``pg_stat_activity`` (and the
server's log, with ``%a`` in ``log_line_prefix``) says which process holds each one.
"""

from __future__ import annotations

import os

ROLE_ENV = "WAYMARK_PROCESS_ROLE"
DEFAULT_ROLE = "manage"
PREFIX = "waymark-"
# PostgreSQL keeps the first NAMEDATALEN - 1 bytes of an application_name.
MAX_LENGTH = 63


def application_name(role: str | None = None) -> str:
    """``waymark-<role>``: the given role, else this process's (its environment's)."""
    chosen = role or os.environ.get(ROLE_ENV, "").strip() or DEFAULT_ROLE
    return (PREFIX + chosen)[:MAX_LENGTH]
