"""How fast runs start through the HTTP API, served as `runengine` serves it.

    .venv/bin/python benchmarks/api_starts.py [--runs 2000] [--threads 8] [--web-workers 2]

Serves the API on a free local port with the web processes `runengine` starts (waitress,
waymark_config/web.py), creates an
organisation, an API key and a three-io-step automation, then POSTs /api/v1/runs from
several threads with keep-alive connections. No engine runs: this measures the start path
alone. The per-key and per-organisation rate limits are raised for it: it measures capacity.
Prints starts/s; asserts nothing, but exits non-zero when a start is not a 201.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time

from common import ROOT, THREE_IO, database_cpu_seconds, process_cpu_seconds, setup

setup(
    "waymark_bench_api",
    WAYMARK_RATE_PER_KEY="1000000/s",
    WAYMARK_QUOTA_STARTS_PER_MINUTE="0",
    WAYMARK_QUOTA_RUNNING_RUNS="0",
)


from waymark_config.web import bind, web_argv  # noqa: E402
from workflows.models import Organisation  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402
from workflows.services.tenancy import api_key_create  # noqa: E402


def serve(workers: int) -> tuple[int, list[subprocess.Popen[str]]]:
    """The web processes runengine starts, on one socket bound here; its port, once every
    process accepts. (The kernel queues connections on the socket before any process does:
    clients that connected then would all be held by whichever process was up first.)"""
    listener = bind("127.0.0.1", 0)
    fd = listener.fileno()
    # As served by default: INFO, one access line per request (read and dropped here).
    env = dict(os.environ, WAYMARK_LOG_LEVEL="INFO")
    argv = web_argv(fd, grace=5)
    processes = [
        subprocess.Popen(argv, cwd=ROOT, env=env, pass_fds=(fd,), stderr=subprocess.PIPE, text=True)  # noqa: S603
        for _ in range(workers)
    ]
    serving = threading.Semaphore(0)
    for process in processes:
        threading.Thread(target=relay_log, args=(process, serving), daemon=True).start()
    for _ in processes:
        if not serving.acquire(timeout=60):
            raise SystemExit("a web process did not start")
    return int(listener.getsockname()[1]), processes


def relay_log(process: subprocess.Popen[str], serving: threading.Semaphore) -> None:
    """Count a web process's "serving" line; pass its warnings and errors through."""
    assert process.stderr is not None
    for line in process.stderr:
        if " waymark.web web process " in line:
            serving.release()
        elif " INFO " not in line:
            sys.stderr.write(line)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--web-workers", type=int, default=2)
    args = parser.parse_args()
    org, _ = Organisation.objects.get_or_create(slug="api-bench", defaults={"name": "api"})
    automation_publish_definition(org=org, slug="three", definition=THREE_IO)
    _, raw_key = api_key_create(org=org, name="bench")
    port, servers = serve(args.web_workers)
    bad: list[int] = []
    try:
        tag = f"a{int(time.time())}"
        headers = {"Authorization": f"Bearer {raw_key}", "Content-Type": "application/json"}

        def client(offset: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            for n in range(offset, args.runs, args.threads):
                body = json.dumps({"automation": "three", "start_key": f"{tag}-{n}"})
                conn.request("POST", "/api/v1/runs", body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                if response.status != 201:
                    bad.append(response.status)
            conn.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.threads)]
        web_cpu = sum(process_cpu_seconds(server.pid) for server in servers)
        database_cpu = database_cpu_seconds()
        began = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - began
        web_cpu = sum(process_cpu_seconds(server.pid) for server in servers) - web_cpu
        after = database_cpu_seconds()
        database_cpu = None if after is None or database_cpu is None else after - database_cpu
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=30)
    print(f"API starts: {args.runs} in {elapsed:.2f}s, {args.threads} clients, "
          f"{args.web_workers} web workers: {args.runs / elapsed:.0f} starts/s")  # fmt: skip
    per_start = "n/a" if database_cpu is None else f"{database_cpu / args.runs * 1e6:.0f} us"
    print(f"CPU per start: web processes {web_cpu / args.runs * 1e6:.0f} us, "
          f"database server {per_start}")  # fmt: skip
    if bad:
        raise SystemExit(f"{len(bad)} starts were not 201: {sorted(set(bad))}")


if __name__ == "__main__":
    main()
