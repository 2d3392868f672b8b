"""A database restart in the middle of load, on real processes: the operator's
`embedded_db stop; sleep 3; embedded_db start` beside engine and web processes that reach the
embedded server through its backend, and the same restart of a server the processes reach
through DATABASE_URL (docs/how-to/production.md, "The embedded PostgreSQL" and "Database faults").

Every run finishes and succeeds, nothing fails, no process writes a traceback, and the web
answers each request either as usual or 503 `database_unavailable` with Retry-After, never
500. In the embedded case, no process starts the server again while the operator has it
stopped.

The test owns its server (the embedded server's wheel, data in a temporary directory), so
stopping it disturbs no other test: never the suite's server, never the system's.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from waymark_config.embedded_db.server import (
    server_status,
    start_server,
    stop_server,
)

from .clusters import ROOT, Cluster, bounded, free_port, server_home
from .processes import kill_tree
from .stubs import ProviderStub

pytestmark = pytest.mark.long_running

DATABASE = "waymark_restart"
RUNS = 20
STOPPED_SECONDS = 3.0  # as in the report: stop, sleep 3, start

_CALL = {"type": "http", "connection": "api",
         "request": {"method": "POST", "url": "{{ input.api_url }}/items",
                     "body": {"run": "{{ run.id }}"}}}  # fmt: skip
# A call, a timer, a call: the restart finds steps running, timers due and settles under way.
DEFINITION = {
    "start": "a",
    "steps": [
        {"id": "a", **_CALL, "next": "nap"},
        {"id": "nap", "type": "wait", "duration": "1s", "next": "b"},
        {"id": "b", **_CALL, "next": "done"},
        {"id": "done", "type": "end"},
    ],
}

# Run by `manage.py shell`: the organisation, its connection and automation, an API key
# (printed), and RUNS runs started.
SETUP = """
import json, os
from effects.models import Connection, EgressAllow
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start
from workflows.services.tenancy import api_key_create, organisation_ensure

args = json.loads(os.environ["RESTART_ARGS"])
org = organisation_ensure(slug=args["org"])
EgressAllow.objects.get_or_create(org=org, entry="127.0.0.1/32")
Connection.objects.get_or_create(org=org, name="api", defaults={
    "provider": "http", "base_url": args["url"], "options": {"idempotency_keys": True},
    "max_concurrency": 64})
automation_publish_definition(org=org, slug="calls", definition=args["definition"])
for n in range(args["runs"]):
    run_start(org=org, automation_slug="calls", start_key=f"s{n}",
              run_input={"api_url": args["url"]})
print(json.dumps(api_key_create(org=org, name="restart")[1]))
"""


@dataclass
class EmbeddedCluster(Cluster):
    """Processes that reach the server through the embedded backend: one WAYMARK_DATA_DIR
    for all (the server's data in its `postgres`), no DATABASE_URL."""

    data: Path = field(default_factory=Path)

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        env = super().env(home, **extra)
        del env["DATABASE_URL"]
        return {**env, "WAYMARK_DATA_DIR": str(self.data), "WAYMARK_DB_NAME": DATABASE}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Path, str]]:
    """The module's own server (its data dir, a URL of its database), migrated once."""
    with server_home("restart") as base:
        data_dir = base / "data" / "postgres"
        address = start_server(data_dir)
        try:
            with psycopg.connect(address.uri("postgres"), autocommit=True) as admin:
                admin.execute(f"CREATE DATABASE {DATABASE}")
            url = address.uri(DATABASE)
            Cluster(url=url, secret="x" * 50, base=base).manage("migrate", "-v0")
            yield data_dir, url
        finally:
            stop_server(data_dir)


class Poster(threading.Thread):
    """POSTs /api/v1/runs again and again (each a new start key) and keeps every answer."""

    def __init__(self, port: int, key: str, url: str) -> None:
        super().__init__(name="poster", daemon=True)
        self.port, self.key, self.url = port, key, url
        self.stop = threading.Event()
        self.answers: list[tuple[int, dict[str, Any], str | None]] = []

    def run(self) -> None:
        n = 0
        while not self.stop.wait(0.25):
            n += 1
            body = {"automation": "calls", "start_key": f"p{n}", "input": {"api_url": self.url}}
            self.answers.append(self._post(body))

    def _post(self, body: Any) -> tuple[int, dict[str, Any], str | None]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/v1/runs", method="POST",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 (ours)
                return answer.status, json.loads(answer.read()), None
        except urllib.error.HTTPError as refused:
            text = refused.read()
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = {"body": text[:300].decode(errors="replace")}
            return refused.code, parsed, refused.headers.get("Retry-After")


def _embedded_db(cluster: EmbeddedCluster, action: str) -> subprocess.CompletedProcess[str]:
    """The operator's `manage.py embedded_db ACTION`, as the processes see the server."""
    home = cluster.base / "operator"
    home.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "embedded_db", action], cwd=home,
        env=cluster.env(home), capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("reached", ["embedded", "database_url"])
def test_a_database_restart_under_load_fails_nothing_and_writes_no_traceback(
    server: tuple[Path, str], reached: str
) -> None:
    data_dir, url = server
    base = data_dir.parent.parent / reached
    base.mkdir()
    secret = secrets.token_urlsafe(32)
    cluster: Cluster
    if reached == "embedded":
        cluster = EmbeddedCluster(url=url, secret=secret, base=base, data=data_dir.parent)
    else:
        cluster = Cluster(url=url, secret=secret, base=base)
    org = f"restart-{reached.replace('_', '-')}"
    began = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - began, 1)

    with ExitStack() as stack:
        stub = stack.enter_context(ProviderStub(idempotent=True))
        # The engine's roles as processes of their own (as `runengine` starts them, fewer:
        # one lane's worker), and the web, each reaching the database as the settings say.
        port = free_port()
        roles = {
            "web": ("runengine", "--web-only", "--port", str(port), "--web-workers", "1"),
            "worker": ("worker", "--lane", "io", "--grace", "2"),
            "relay": ("relay",),
            "sweep": ("sweep",),
        }
        processes = {name: cluster.command(name, *args) for name, args in roles.items()}
        for process in processes.values():
            stack.callback(kill_tree, process)
        out = cluster.manage("shell", "-c", SETUP, RESTART_ARGS=json.dumps(
            {"org": org, "url": stub.url, "definition": DEFINITION, "runs": RUNS}))  # fmt: skip
        key = json.loads(out.strip().splitlines()[-1])
        phase("set up")
        web = processes["web"]
        bounded("the web to say it is ready",
                lambda: "ready" in cluster.log("web") or web.poll() is not None)  # fmt: skip
        phase("web ready")
        poster = Poster(port, key, stub.url)
        poster.start()
        stack.callback(poster.stop.set)
        # Under way: first calls made, timers pending, runs started through the web.
        bounded("a quarter of the first calls", lambda: len(stub.created) >= RUNS // 4)
        bounded("runs started through the web", lambda: len(poster.answers) >= 5)

        phase("under way")
        if isinstance(cluster, EmbeddedCluster):
            stopped = _embedded_db(cluster, "stop")
            assert (stopped.returncode, stopped.stdout.strip()) == (0, "stopped"), stopped
            time.sleep(STOPPED_SECONDS)
            # Stopped by the operator: no engine or web process started it again meanwhile.
            assert server_status(data_dir) is None
            started = _embedded_db(cluster, "start")
            assert started.returncode == 0, started
        else:
            assert stop_server(data_dir)
            time.sleep(STOPPED_SECONDS)
            start_server(data_dir)

        phase("restarted")
        # The web answers again (each POST a run), then the poster stops.
        answered = len(poster.answers)

        def web_answers_again() -> bool:
            return any(status == 201 for status, _, _ in poster.answers[answered:])

        bounded("the web to start runs again after the restart", web_answers_again, seconds=120)
        phase("web answers again")
        poster.stop.set()
        poster.join(timeout=90)
        for name, process in processes.items():
            assert process.poll() is None, f"{name} exited:\n{cluster.log(name)[-4000:]}"

        def unfinished() -> int:
            rows = cluster.query(
                "SELECT count(*) FROM workflows_run r JOIN workflows_organisation o"
                " ON o.id = r.org_id WHERE o.slug = %s AND r.finished_at IS NULL", org,
            )  # fmt: skip
            return int(rows[0][0])

        bounded("every run to finish after the restart", lambda: unfinished() == 0, seconds=180)
        phase("runs finished")
        statuses = Counter(status for (status,) in cluster.query(
            "SELECT r.status FROM workflows_run r JOIN workflows_organisation o"
            " ON o.id = r.org_id WHERE o.slug = %s", org))  # fmt: skip
        created = sum(1 for s, _, _ in poster.answers if s == 201)
        assert statuses["succeeded"] >= RUNS + created, statuses
        assert set(statuses) == {"succeeded"}, statuses  # not one failed run

    # The web: each answer a run, or 503 database_unavailable with Retry-After; never 500.
    codes = Counter(s for s, _, _ in poster.answers)
    assert set(codes) <= {201, 503}, [a for a in poster.answers if a[0] not in (201, 503)][:3]
    for status, body, retry_after in poster.answers:
        if status == 503:
            assert body["code"] in ("database_unavailable", "database_busy"), body
            assert retry_after is not None and int(retry_after) > 0
    logs = {name: cluster.log(name) for name in roles}
    for name, log in logs.items():
        at = log.find("Traceback")
        assert at < 0, f"{name}:\n{log[max(0, at - 1000) :][:6000]}"
        assert "ERROR" not in log, f"{name}:\n{log[log.find('ERROR') - 500 :][:4000]}"
    warnings = sum(log.count("WARNING") for log in logs.values())
    print(f"{reached}: web answers {dict(codes)}; warnings {warnings};"
          f" seconds from the test's start: {phases}")  # fmt: skip
