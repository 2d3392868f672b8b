"""Engine hosts as users start them, against a PostgreSQL server the test names by URL.

A ``Cluster`` is one database on one server (any server: over TCP, or a unix socket the test
owns): hosts run ``python /abs/manage.py ...`` from a directory of their own, with their own
environment, sharing only the database URL and the secret key. Used by the many-hosts test
(tests/test_many_hosts.py) and the database faults test (tests/test_database_faults.py).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from .processes import ROOT


def bounded(what: str, check: Any, *, seconds: float = 240.0, every: float = 0.2) -> Any:
    """Poll ``check`` until it returns something true; fail saying ``what`` after a cap far
    beyond the event's normal time (a loaded machine is slow, not wrong)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"waited {seconds:.0f} s for {what}")


@dataclass
class Cluster:
    url: str  # the database: over TCP, or a unix socket (postgresql://u@/db?host=/dir&port=N)
    secret: str
    base: Path

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """One host's environment: the shared database and secret key, its own data
        directory, short leases (a dead host's steps are taken over in seconds)."""
        inherited = {k: v for k, v in os.environ.items()
                     if not k.startswith("WAYMARK_") and k != "DATABASE_URL"}  # fmt: skip
        return {
            **inherited,
            "DATABASE_URL": self.url, "WAYMARK_SECRET_KEY": self.secret,
            "WAYMARK_DATA_DIR": str(home), "DJANGO_SETTINGS_MODULE": "waymark_config.settings",
            # the stub provider listens on loopback, which the organisation allowlists
            "WAYMARK_EGRESS_ALLOWABLE": "127.0.0.1/32",
            "WAYMARK_IO_LEASE_SECONDS": "2", "WAYMARK_WORKER_POLL_SECONDS": "0.2",
            "WAYMARK_LOG_LEVEL": "WARNING", "PYTHONFAULTHANDLER": "1",
            # The checkout under test, for children started with `python -m` (the web's)
            # from the host's directory: else an installed copy of the package may answer.
            "PYTHONPATH": str(ROOT), **extra,
        }  # fmt: skip

    def manage(self, *args: str, **env: str) -> str:
        """``manage.py ARGS`` to its end (``env``: more of its environment); its output."""
        home = self.base / "admin"
        home.mkdir(exist_ok=True)
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args], cwd=home,
            env=self.env(home, **env), capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}{done.stderr}"
        return done.stdout

    def host(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        """``python /abs/manage.py runengine ARGS`` from the host's own directory."""
        return self.command(name, "runengine", "--grace", "2", *args, **env)

    def command(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        """``python /abs/manage.py ARGS`` (a worker, a relay, ...) from its own directory,
        its output in its log (``log(name)``)."""
        home = self.base / name
        home.mkdir(exist_ok=True)
        with (home / "process.log").open("ab") as log:
            return subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), *args],
                cwd=home, env=self.env(home, **env), stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def log(self, name: str) -> str:
        path = self.base / name / "process.log"
        return path.read_text(errors="replace") if path.exists() else ""


def api(port: int, key: str, method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 (our own host)
            return json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as refused:
        raise AssertionError(f"{method} {path}: {refused.code} {refused.read()!r}") from None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def server_home(prefix: str) -> Iterator[Path]:
    """A directory for a test's own PostgreSQL data, outside pytest's temporary root: other
    pytest sessions of the same user reset that root's mode (the server's own user, when
    tests run as root, then loses its way to its data and PANICs) and delete its older
    directories, both possibly while the server runs."""
    path = Path(tempfile.mkdtemp(prefix=f"waymark-{prefix}-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
