"""One organisation floods a host that never answers; what does another organisation see?

    .venv/bin/python benchmarks/noisy_neighbour.py [--flood 40] [--runs 20] [--port 8791]

Runs the engine as `runengine` runs it (web, relay, sweep, workers), on a database of its own,
with two organisations: *flood*, whose http steps call a local host that accepts connections
and never answers (its connection set to the most a tenant may: 64 calls in flight, a 120 s
timeout), and *quiet*, whose one-step runs call a local provider stub that answers at once.
First the quiet organisation's runs alone (the baseline), then the same while the flood's
``--flood`` runs hang and ``--checks`` clients check the flood's connection over and over.
Prints, for both phases: the quiet runs' latency (start to finished,
through the API), the web's p50/p99 (`/livez` and an API list, polled throughout), and the
most io slots each organisation held at once (from the steps running). Asserts nothing.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from common import ROOT, empty_run_tables, setup

setup(
    "waymark_bench_noisy",
    WAYMARK_QUOTA_STARTS_PER_MINUTE="0",
    WAYMARK_QUOTA_RUNNING_RUNS="0",
    WAYMARK_RATE_PER_KEY="1000000/s",
    WAYMARK_EGRESS_ALLOWABLE="127.0.0.1/32",  # the local stand-ins (engine processes inherit it)
)

from django.db import connection  # noqa: E402

from effects.models import EgressAllow  # noqa: E402
from tests.factories import QUICK_CALL_DEFINITION, SLOW_CALL_DEFINITION  # noqa: E402
from tests.stubs.provider import ProviderStub  # noqa: E402
from tests.stubs.tarpit import Tarpit  # noqa: E402
from workflows.models import Organisation  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402
from workflows.services.tenancy import api_key_create  # noqa: E402

FINISHED = ("succeeded", "failed", "cancelled")


class Api:
    """One organisation's API client (a keep-alive connection per thread)."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.local = threading.local()

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data else None


def organisation(slug: str, port: int, connection_body: dict[str, Any], definition: dict) -> Api:
    org, _ = Organisation.objects.get_or_create(slug=slug, defaults={"name": slug})
    EgressAllow.objects.get_or_create(org=org, entry="127.0.0.1/32")  # the local stand-ins
    _, raw = api_key_create(org=org, name="bench")
    api = Api(port, raw)
    api.call("DELETE", f"/api/v1/connections/{connection_body['name']}")
    status, answer = api.call("POST", "/api/v1/connections", connection_body)
    assert status == 201, answer
    automation_publish_definition(org=org, slug="bench", definition=definition)
    return api


def start(api: Api, run_input: dict[str, Any], key: str) -> int:
    body = {"automation": "bench", "start_key": key, "input": run_input}
    status, answer = api.call("POST", "/api/v1/runs", body)
    assert status == 201, answer
    return int(answer["id"])


def finish(api: Api, run_id: int) -> str:
    while True:
        _, answer = api.call("GET", f"/api/v1/runs/{run_id}")
        if answer["status"] in FINISHED:
            return str(answer["status"])
        time.sleep(0.02)


class Watch:
    """Polls the web (`/livez` and an API list) and the steps running, until stopped."""

    def __init__(self, port: int, api: Api) -> None:
        self.port, self.api = port, api
        self.web: list[float] = []
        self.held: Counter[str] = Counter()  # organisation slug -> most io slots held at once
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._web, daemon=True),
                        threading.Thread(target=self._slots, daemon=True)]  # fmt: skip

    def __enter__(self) -> Watch:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def _web(self) -> None:
        live = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        while not self.stop.wait(0.05):
            self.web.append(_timed(lambda: _get(live, "/livez")))
            self.web.append(_timed(lambda: self.api.call("GET", "/api/v1/runs?limit=1")))

    def _slots(self) -> None:
        from django.db import connections

        own = connections.create_connection("default")
        try:
            while not self.stop.wait(0.1):
                with own.cursor() as cursor:
                    cursor.execute(
                        "SELECT o.slug, count(*) FROM workflows_step s"
                        " JOIN workflows_organisation o ON o.id = s.org_id"
                        " WHERE s.lane = 'io' AND s.status = 'running' GROUP BY o.slug"
                    )
                    for slug, count in cursor.fetchall():
                        self.held[slug] = max(self.held[slug], count)
        finally:
            own.close()


def _get(conn: http.client.HTTPConnection, path: str) -> None:
    conn.request("GET", path)
    conn.getresponse().read()


def _timed(call: Callable[[], object]) -> float:
    began = time.monotonic()
    call()
    return time.monotonic() - began


def quiet_runs(api: Api, provider: str, runs: int, tag: str) -> tuple[list[float], Counter[str]]:
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    for n in range(runs):
        began = time.monotonic()
        outcomes[finish(api, start(api, {"api": provider}, f"{tag}-{n}"))] += 1
        latencies.append(time.monotonic() - began)
    return latencies, outcomes


@contextmanager
def checking(api: Api, clients: int) -> Iterator[Counter[str]]:
    """``clients`` threads checking the flood's connection to the silent host over and over
    (`POST /api/v1/connections/slow/check`) until the block ends: what they were answered."""
    answers: Counter[str] = Counter()
    stop = threading.Event()

    def check() -> None:
        while not stop.is_set():
            status, body = api.call("POST", "/api/v1/connections/slow/check")
            answers[f"{status} {body.get('code') or body.get('result', '')[:20]}"] += 1

    threads = [threading.Thread(target=check, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield answers
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def report(phase: str, latencies: list[float], outcomes: Counter[str], watch: Watch) -> None:
    web = sorted(watch.web)
    p99 = web[min(len(web) - 1, int(len(web) * 0.99))] if web else float("nan")
    print(f"{phase}: quiet runs {dict(outcomes)}, latency p50 {statistics.median(latencies):.3f}s"
          f" max {max(latencies):.3f}s; web p50 {statistics.median(web) * 1000:.0f} ms"
          f" p99 {p99 * 1000:.0f} ms ({len(web)} requests); most io slots held:"
          f" {dict(watch.held) or 'none'} of 32")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flood", type=int, default=40)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--checks", type=int, default=16, help="concurrent connection checks")
    args = parser.parse_args()
    empty_run_tables()  # an earlier pass's runs would call a silent host that is gone
    engine = subprocess.Popen(  # noqa: S603
        [sys.executable, "manage.py", "runengine", "--port", str(args.port), "--grace", "2"],
        cwd=ROOT, env=dict(os.environ), stdout=subprocess.DEVNULL,
    )  # fmt: skip
    tag = f"n{int(time.time())}"
    try:
        with Tarpit() as tarpit, ProviderStub() as provider:
            _wait_for_web(args.port)
            flood = organisation("flood", args.port, {
                "name": "slow", "provider": "http", "base_url": tarpit.url,
                "max_concurrency": 64, "timeout_seconds": 120}, SLOW_CALL_DEFINITION)  # fmt: skip
            quiet = organisation("quiet", args.port,
                                 {"name": "api", "provider": "http", "base_url": provider.url},
                                 QUICK_CALL_DEFINITION)  # fmt: skip
            with Watch(args.port, quiet) as watch:
                latencies, outcomes = quiet_runs(quiet, provider.url, args.runs, f"{tag}-a")
            report("alone", latencies, outcomes, watch)

            for n in range(args.flood):
                start(flood, {"url": tarpit.url, "n": n}, f"{tag}-f{n}")
            held = tarpit.wait_held(args.flood, timeout=30)  # all, or as many as it may hold
            print(f"flood: {args.flood} runs started; {held} calls hanging at the silent host")
            with Watch(args.port, quiet) as watch, checking(flood, args.checks) as checks:
                latencies, outcomes = quiet_runs(quiet, provider.url, args.runs, f"{tag}-b")
            report("beside the flood", latencies, outcomes, watch)
            if args.checks:
                print(f"the flood's connection checks of the silent host, {args.checks} at a"
                      f" time: answers {dict(checks)}")  # fmt: skip
    finally:
        engine.terminate()
        engine.wait(timeout=60)
        connection.close()


def _wait_for_web(port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            _get(http.client.HTTPConnection("127.0.0.1", port, timeout=5), "/livez")
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the engine's web server did not start")


if __name__ == "__main__":
    main()
