"""How fast runs start, through the service, from several threads (no engine running).

    .venv/bin/python benchmarks/starts.py [--runs 4000] [--threads 8] [--ordinary]

Each start is `run_start` (the run, its first step, its events and its wake-up, one
transaction) with its own start key. Prints starts/s, commits per start, and the CPU per start
of this process and of the database server (when it runs on this machine); asserts nothing,
but exits non-zero when a start did not create its run.
--ordinary: never the one-statement start (engine/starts.py), to compare the two.
"""

from __future__ import annotations

import argparse
import threading
import time

from common import THREE_IO, commits, database_cpu_seconds, setup

setup("waymark_bench_starts")

from django.db import connection  # noqa: E402

from workflows.models import Organisation  # noqa: E402
from workflows.services import runs  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402
from workflows.services.runs import run_start  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--ordinary", action="store_true", help="no one-statement starts")
    args = parser.parse_args()
    if args.ordinary:
        runs.start_in_one_trip = lambda *args, **kwargs: None  # type: ignore[assignment]
    org, _ = Organisation.objects.get_or_create(slug="starts", defaults={"name": "starts"})
    automation_publish_definition(org=org, slug="three", definition=THREE_IO)
    tag = f"s{int(time.time())}"
    failures: list[str] = []
    barrier = threading.Barrier(args.threads + 1)

    def starter(offset: int) -> None:
        barrier.wait()
        for n in range(offset, args.runs, args.threads):
            started = run_start(org=org, automation_slug="three", run_input={"n": n},
                                start_key=f"{tag}-{n}")  # fmt: skip
            if not started.created:
                failures.append(f"{tag}-{n}")
        connection.close()

    threads = [threading.Thread(target=starter, args=(i,)) for i in range(args.threads)]
    for thread in threads:
        thread.start()
    before = commits()
    barrier.wait()
    began, cpu, server = time.monotonic(), time.process_time(), database_cpu_seconds()
    for thread in threads:
        thread.join()
    elapsed, cpu = time.monotonic() - began, time.process_time() - cpu
    server_after = database_cpu_seconds()
    spent = commits() - before
    print(f"starts: {args.runs} in {elapsed:.2f}s with {args.threads} threads")
    print(f"starts/s: {args.runs / elapsed:.0f}")
    print(f"commits per start: {spent / args.runs:.2f}")
    print(f"CPU per start (this process): {cpu / args.runs * 1e6:.0f} us")
    if server is not None and server_after is not None:
        server_us = (server_after - server) / args.runs * 1e6
        print(f"CPU per start (database server): {server_us:.0f} us")
    if failures:
        raise SystemExit(f"{len(failures)} starts did not create their run")


if __name__ == "__main__":
    main()
