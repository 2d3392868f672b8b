"""Several engine hosts against one PostgreSQL server over TCP: the drained rate with 1, 2, 3.

    DATABASE_URL=postgres://user@dbhost:5432/waymark_hosts \\
        .venv/bin/python benchmarks/hosts.py [--hosts 1,2,3] [--runs 3000]

For each host count: every run of three no-op io steps started first (no engine), then that
many `runengine --no-web` hosts, each from its own directory with its own data directory (as
separate machines would be), share the database; it prints io steps/s from the first claim to
the last finish (the database's clock), the database's commits per io step, and the peak of
connections per role (pg_stat_activity, by application_name) and in all. Hosts on one
machine share its cores: there the figure shows what the database and the cores allow
together, not what separate machines would add. It asserts nothing, but exits non-zero when
a run does not succeed. The database (DATABASE_URL, required: the embedded server takes no
TCP connections) is migrated and its run tables emptied first.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import ROOT, THREE_IO, commits, empty_run_tables, setup, start_runs

if not os.environ.get("DATABASE_URL"):
    raise SystemExit("set DATABASE_URL to a PostgreSQL server over TCP (see the docstring)")
setup("waymark_hosts")

import psycopg  # noqa: E402
from django.db import connection  # noqa: E402

from workflows.models import Organisation  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402


def start_hosts(count: int, base: Path) -> list[subprocess.Popen[bytes]]:
    hosts = []
    for number in range(count):
        home = base / f"host-{number}"
        home.mkdir()
        env = {**os.environ, "WAYMARK_DATA_DIR": str(home), "WAYMARK_LOG_LEVEL": "WARNING"}
        env.pop("WAYMARK_DB_NAME", None)  # the URL names the database
        hosts.append(subprocess.Popen(  # noqa: S603
            [sys.executable, str(ROOT / "manage.py"), "runengine", "--no-web"],
            cwd=home, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))  # fmt: skip
    return hosts


def stop_hosts(hosts: list[subprocess.Popen[bytes]]) -> None:
    for host in hosts:
        host.send_signal(signal.SIGTERM)
    for host in hosts:
        host.wait(timeout=60)


class Peaks:
    """The most connections seen per application_name, and in all, while it runs."""

    def __init__(self, url: str, database: str) -> None:
        self.url, self.database = url, database
        self.peak: collections.Counter[str] = collections.Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample)

    def _sample(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.wait(0.1):
                rows = conn.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid() GROUP BY 1",
                    (self.database,),
                ).fetchall()
                for name, n in rows:
                    self.peak[name] = max(self.peak[name], n)
                self.peak["(all)"] = max(self.peak["(all)"], sum(n for _, n in rows))


def one(count: int, org: Organisation, runs: int) -> bool:
    empty_run_tables()
    start_runs(org, "three-io", runs, f"h{count}-{time.time()}", threads=4)
    connection.close()
    before = commits()
    peaks = Peaks(os.environ["DATABASE_URL"], connection.settings_dict["NAME"])
    peaks.thread.start()
    with tempfile.TemporaryDirectory() as base:
        hosts = start_hosts(count, Path(base))
        with connection.cursor() as cursor:
            while True:
                cursor.execute("SELECT count(*) FROM workflows_run WHERE finished_at IS NULL")
                if cursor.fetchone()[0] == 0:
                    break
                time.sleep(0.05)
        stop_hosts(hosts)
    peaks.stop.set()
    peaks.thread.join()
    time.sleep(1.0)  # pg_stat_database lags the commits
    used = commits() - before
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM (SELECT max(finished_at) FROM workflows_run)"
            " - (SELECT min(at) FROM workflows_runevent WHERE kind = 'step.claimed')),"
            " (SELECT count(*) FROM workflows_run WHERE status <> 'succeeded')"
        )
        span, failed = cursor.fetchone()
    roles = ", ".join(f"{name.removeprefix('waymark-')} {n}"
                      for name, n in sorted(peaks.peak.items()) if name != "(all)")  # fmt: skip
    print(f"{count} host(s): {3 * runs / float(span):7.0f} io steps/s, "
          f"{used / (3 * runs):.2f} commits per io step, load {os.getloadavg()[0]:.1f}; "
          f"connections at most {peaks.peak['(all)']} ({roles})", flush=True)  # fmt: skip
    return failed == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1,2,3")
    parser.add_argument("--runs", type=int, default=3000)
    args = parser.parse_args()
    org, _ = Organisation.objects.get_or_create(slug="hosts", defaults={"name": "hosts"})
    automation_publish_definition(org=org, slug="three-io", definition=THREE_IO)
    ok = all(one(int(count), org, args.runs) for count in args.hosts.split(","))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
