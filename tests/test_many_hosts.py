"""Several hosts, one PostgreSQL server over TCP: a whole host dies and the others finish.

Three "hosts" run against one PostgreSQL server over TCP (not the embedded one): one serves
the web (`runengine --web-only`), two run the engine (`runengine --no-web`), each started as
users start it, from its own working directory with its own environment and data directory
(`python /path/to/manage.py runengine`), sharing only the database URL and the secret key.
Runs of `effect -> wait 1 s -> effect` are started through the web host's API, over HTTP;
once the runs are under way, the engine host that holds the sweep lease is killed whole
(SIGKILL to its supervisor and every child at once), and the other host must finish every
run: its workers take the dead host's steps over when their leases lapse, its sweeper takes
the lease over and fires the timers, and nothing runs twice (each item created once at the
idempotent stub provider, each step settled once).

It needs a PostgreSQL server over TCP on which it may create a database:
`WAYMARK_HOSTS_SERVER` (default `postgres://postgres@127.0.0.1:5432`). Without one it is
skipped, and says why.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from pathlib import Path

import psycopg
import pytest

from .clusters import Cluster, api, bounded, free_port
from .processes import kill_tree
from .stubs import ProviderStub

pytestmark = pytest.mark.long_running

SERVER = os.environ.get("WAYMARK_HOSTS_SERVER", "postgres://postgres@127.0.0.1:5432")
RUNS = 60
DEFINITION = {
    "start": "a",
    "steps": [
        {"id": "a", "type": "http", "connection": "api",
         "request": {"method": "POST", "url": "{{ input.api_url }}/items",
                     "body": {"run": "{{ run.id }}"}},
         "next": "nap"},
        {"id": "nap", "type": "wait", "duration": "1s", "next": "b"},
        {"id": "b", "type": "http", "connection": "api",
         "request": {"method": "POST", "url": "{{ input.api_url }}/items",
                     "body": {"run": "{{ run.id }}"}},
         "next": "done"},
        {"id": "done", "type": "end"},
    ],
}  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    try:
        with psycopg.connect(f"{SERVER}/postgres", autocommit=True, connect_timeout=3) as admin:
            name = f"waymark_hosts_{os.getpid()}"
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {name}")
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL server over TCP at {SERVER} (WAYMARK_HOSTS_SERVER): {exc}")
    made = Cluster(url=f"{SERVER}/{name}", secret=secrets.token_urlsafe(32), base=tmp_path)
    made.manage("migrate", "-v0")
    try:
        yield made
    finally:
        with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def sweep_holder_pid(cluster: Cluster) -> int:
    rows = cluster.query("SELECT holder FROM workflows_sweeplease WHERE lease_until > now()")
    return int(rows[0][0].split(":")[1]) if rows else 0


def host_of(pid: int, hosts: dict[str, subprocess.Popen[bytes]]) -> str:
    import psutil

    for name, process in hosts.items():
        with suppress(psutil.NoSuchProcess):
            tree = psutil.Process(process.pid).children(recursive=True)
            if pid in {child.pid for child in tree}:
                return name
    raise AssertionError(f"the sweep lease's holder (pid {pid}) belongs to no engine host")


def test_a_killed_host_s_runs_are_finished_by_the_others_and_nothing_runs_twice(
    cluster: Cluster,
) -> None:
    cluster.manage("create_organisation", "hosts")
    key = cluster.manage("create_api_key", "--org", "hosts").strip().splitlines()[-1]
    cluster.manage("egress_allow", "--org", "hosts", "add", "127.0.0.1/32")
    with ExitStack() as stack:
        stub = stack.enter_context(ProviderStub(idempotent=True))
        port = free_port()
        web = cluster.host("web", "--web-only", "--port", str(port), "--web-workers", "1")
        stack.callback(kill_tree, web)
        engines = {name: cluster.host(name, "--no-web") for name in ("east", "west")}
        for process in engines.values():
            stack.callback(kill_tree, process)
        bounded("the web host to say it is ready",
                lambda: "ready" in cluster.log("web") or web.poll() is not None)  # fmt: skip
        assert web.poll() is None, cluster.log("web")
        api(port, key, "POST", "/api/v1/connections",
            {"name": "api", "provider": "http", "base_url": stub.url,
             "options": {"idempotency_keys": True}, "max_concurrency": 64})  # fmt: skip
        api(port, key, "POST", "/api/v1/automations", {"slug": "two-calls"})
        version = api(port, key, "POST", "/api/v1/automations/two-calls/versions",
                      {"definition": DEFINITION})  # fmt: skip
        api(
            port, key, "POST", f"/api/v1/automations/two-calls/versions/{version['number']}/publish"
        )
        given = {"api_url": stub.url}
        ids = [api(port, key, "POST", "/api/v1/runs",
                   {"automation": "two-calls", "start_key": f"k{n}", "input": given})["id"]
               for n in range(RUNS)]  # fmt: skip

        # Under way on both hosts: some first calls made, the sweeper elected.
        bounded("a quarter of the first calls", lambda: len(stub.created) >= RUNS // 4)
        holder = bounded("a sweeper holding the lease", lambda: sweep_holder_pid(cluster))
        doomed = host_of(holder, engines)
        kill_tree(engines.pop(doomed))
        survivor = next(iter(engines))

        def finished() -> bool:
            rows = cluster.query(
                "SELECT count(*) FROM workflows_run WHERE id = ANY(%s) AND finished_at IS NULL",
                ids,
            )
            return int(rows[0][0]) == 0

        bounded(f"every run to finish on {survivor} after {doomed} was killed", finished)
        statuses = Counter(
            s for (s,) in cluster.query("SELECT status FROM workflows_run WHERE id = ANY(%s)", ids)
        )
        assert statuses == {"succeeded": RUNS}, statuses
        new_holder = sweep_holder_pid(cluster)
        assert new_holder and host_of(new_holder, engines) == survivor

    # Nothing ran twice: each step settled once, each item created once per effect key.
    settled = cluster.query(
        "SELECT run_id, step_id, iteration, count(*) FROM workflows_runevent"
        " WHERE kind = 'step.succeeded' AND run_id = ANY(%s)"
        " GROUP BY 1, 2, 3 HAVING count(*) > 1",
        ids,
    )
    assert settled == []
    keys = Counter(item["key"] for item in stub.created)
    assert len(keys) == 2 * RUNS and set(keys.values()) == {1}, keys.most_common(3)
    taken_over = cluster.query(
        "SELECT count(*) FROM workflows_step WHERE run_id = ANY(%s) AND attempt > 1", ids
    )[0][0]
    print(f"{doomed} killed; {survivor} finished {RUNS} runs, {taken_over} steps taken over")
    for name in ("web", survivor):
        assert "Traceback" not in cluster.log(name), cluster.log(name)[-4000:]
