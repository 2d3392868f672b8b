"""What one thread's starts wait on, alone and beside the engine: the harness's end to end.

    .venv/bin/python benchmarks/start_waits.py [--runs 1500] [--alone]

In the database waymark_bench: one thread starts ``--runs`` runs of the side-by-side shape
(three no-op io steps) one after the other, while the relay and an io worker run (as the
harness starts them), or with no engine (``--alone``). Meanwhile a second connection samples
its backend's row in pg_stat_activity every half millisecond. Prints starts/s, the p50 and
p90 of a start, and the share of samples in each (state, wait event): `idle ClientRead` is
time in this process between statements, `WalSync` and `LWLock WALWrite` waiting for the
commit's WAL flush. Asserts nothing; exits non-zero when a start did not create its run.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import threading
import time

from common import ROOT, THREE_IO, empty_run_tables, setup

setup("waymark_bench")

from django.db import connection, connections  # noqa: E402

from workflows.models import Organisation  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402
from workflows.services.runs import run_start  # noqa: E402

SAMPLE = """
SELECT state, coalesce(wait_event_type, '-'), coalesce(wait_event, '-')
  FROM pg_stat_activity WHERE pid = %s
"""


def sample(pid: int, done: threading.Event) -> collections.Counter[tuple[str, str, str]]:
    """Samples of the backend ``pid``'s state and wait event until ``done``."""
    seen: collections.Counter[tuple[str, str, str]] = collections.Counter()
    watcher = connections.create_connection("default")
    watcher.ensure_connection()
    raw = watcher.connection
    raw.autocommit = True
    while not done.is_set():
        row = raw.execute(SAMPLE, (pid,)).fetchone()
        if row is not None:
            seen[row] += 1
        time.sleep(0.0005)
    watcher.close()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1500)
    parser.add_argument("--alone", action="store_true", help="no engine running")
    args = parser.parse_args()
    empty_run_tables()
    org, _ = Organisation.objects.get_or_create(slug="start-waits", defaults={"name": "s"})
    automation_publish_definition(org=org, slug="three", definition=THREE_IO)
    tag = f"w{int(time.time())}"
    run_start(org=org, automation_slug="three", run_input={}, start_key=f"{tag}-warm")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    engine = [] if args.alone else [
        subprocess.Popen([sys.executable, "manage.py", *role], cwd=ROOT,  # noqa: S603
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for role in (["relay"], ["worker", "--lane", "io"])
    ]  # fmt: skip
    time.sleep(0 if args.alone else 4)  # as the harness: the engine up and idle first
    done = threading.Event()
    samples: list[collections.Counter[tuple[str, str, str]]] = []
    sampler = threading.Thread(target=lambda: samples.append(sample(pid, done)))
    sampler.start()
    took, refused = [], 0
    began = time.monotonic()
    try:
        for n in range(args.runs):
            at = time.monotonic()
            started = run_start(org=org, automation_slug="three", run_input={"n": n},
                                start_key=f"{tag}-{n}")  # fmt: skip
            took.append(time.monotonic() - at)
            refused += not started.created
    finally:
        elapsed = time.monotonic() - began
        done.set()
        sampler.join()
        for process in engine:
            process.terminate()
            process.wait(timeout=30)
    took.sort()
    print(f"{'alone' if args.alone else 'beside the engine'}: {args.runs / elapsed:.0f} "
          f"starts/s, p50 {took[len(took) // 2] * 1e3:.2f} ms, "
          f"p90 {took[len(took) * 9 // 10] * 1e3:.2f} ms")  # fmt: skip
    total = sum(samples[0].values())
    for (state, kind, event), count in samples[0].most_common(8):
        print(f"{100 * count / total:5.1f} %  {state} {kind} {event}")
    if refused:
        raise SystemExit(f"{refused} starts did not create their run")


if __name__ == "__main__":
    main()
