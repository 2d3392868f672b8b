"""What every engine process does as it starts and stops, whatever its role (web, a lane's
worker, relay, sweep): name its database connections by its role (``application_name``
``waymark-<role>``: waymark_config/process_role.py), trace as the ``OTEL_*`` variables say
(tracing.py), flush the spans still queued when it stops, and keep what it made at start-up
out of the garbage collector's full collections.

A process's role is ``WAYMARK_PROCESS_ROLE``: ``runengine`` sets it for each child it starts
(``web``, ``worker-io``, ``worker-io-suspects``, ``relay``, ``sweep``), and such a process
begins as the engine's at start-up (``begin_from_environment``, from the app's ``ready``).
The ``worker``, ``relay`` and ``sweep`` commands started on their own (by systemd, say) name
their role themselves (``engine_process``).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import connections

from waymark_config.process_role import OPTION as NAME_OPTION
from waymark_config.process_role import ROLE_ENV, application_name

from . import tracing

__all__ = ["ROLE_ENV", "begin", "begin_from_environment", "engine_process"]


def begin(role: str) -> None:
    """This process is the engine's ``role`` from now on. Idempotent."""
    # Read wherever a connection is opened outside Django's settings (the embedded server's
    # bootstrap connection).
    os.environ[ROLE_ENV] = role
    _name_connections(application_name(role))
    if not tracing.on():
        tracing.configure(role)


def _name_connections(name: str) -> None:
    """Connections opened from now on carry ``name`` (Django reads a database's OPTIONS at
    each connect, and ``own_connection`` takes its parameters from there too); one opened
    before under another name is closed, to be opened again when next used. It goes as
    libpq's fallback (process_role.OPTION): a name the operator chose (``application_name``
    in DATABASE_URL, or ``PGAPPNAME``) still wins."""
    for alias, database in settings.DATABASES.items():
        options = database.setdefault("OPTIONS", {})
        if options.get(NAME_OPTION) == name:
            continue
        options[NAME_OPTION] = name
        connections[alias].close()


def begin_from_environment() -> None:
    """Begin as the role ``runengine`` gave this process, if it gave one."""
    role = os.environ.get(ROLE_ENV, "")
    if role:
        begin(role)


@contextmanager
def engine_process(role: str) -> Iterator[None]:
    """Run the block as the engine's ``role``; the spans still queued are sent when it ends
    (a stop on SIGTERM, or an exit to be replaced).

    What the process made to start (its modules, Django's registries: some hundred thousand
    objects that live as long as it does) is moved out of the garbage collector's view
    (``gc.freeze``): a full collection, about one per few hundred runs a worker takes, then
    scans only what came after, instead of stopping every thread of the process for tens of
    milliseconds each time."""
    begin(role)
    gc.freeze()
    try:
        yield
    finally:
        tracing.shutdown()
