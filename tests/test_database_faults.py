"""Database faults under load, on real engine processes: a server restart, backends
terminated mid-settle, an idle transaction holding a run's lock, a half-open LISTEN
connection (docs/explanation/how-the-guarantees-are-tested.md, "Database faults").

The tests start and own a PostgreSQL server of their own (the embedded server's wheel, data in
a temporary directory), so restarting it cannot disturb the server the rest of the suite runs
on. Engine processes reach it as any PostgreSQL (DATABASE_URL naming its unix socket; one
worker, in the half-open test, through a TCP proxy the test controls). Runs are started and
signalled by a short `manage.py shell` script against the same database; the stub provider
counts what each effect key created. Every wait polls for its event, bounded far beyond its
normal time.
"""

from __future__ import annotations

import json
import secrets
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pytest

from waymark_config.embedded_db.server import (
    ServerAddress,
    server_status,
    start_server,
    stop_server,
)

from .clusters import Cluster, bounded, server_home
from .listen_proxy import ListenProxy
from .processes import kill_tree
from .stubs import ProviderStub

pytestmark = pytest.mark.long_running

DATABASE = "waymark_faults"
PROBES = {"WAYMARK_EXTRA_STEP_MODULES": "tests.probe_steps"}  # the tests' `probe` step type


def _call(step_id: str, after: str, connection: str = "api") -> dict[str, Any]:
    """An http step that creates an item at the stub, under its effect key."""
    return {"id": step_id, "type": "http", "connection": connection,
            "request": {"method": "POST", "url": "{{ input.api_url }}/items",
                        "body": {"run": "{{ run.id }}"}},
            "next": after}  # fmt: skip


# Two calls around a timer, a wait for the run's signal, a last call.
BUSY = {
    "start": "a",
    "steps": [
        _call("a", "nap"),
        {"id": "nap", "type": "wait", "duration": "2s", "next": "b"},
        _call("b", "sig"),
        {"id": "sig", "type": "wait_signal", "signal": "go", "correlation": "{{ input.key }}",
         "timeout": "1h", "next": {"received": "c", "timed_out": "late"}},
        _call("c", "done"),
        {"id": "late", "type": "end", "status": "failed"},
        {"id": "done", "type": "end"},
    ],
}  # fmt: skip
THREE_CALLS = {"start": "a", "steps": [_call("a", "b"), _call("b", "c"), _call("c", "done"),
                                       {"id": "done", "type": "end"}]}  # fmt: skip
ONE_CALL = {"start": "a", "steps": [_call("a", "done"), {"id": "done", "type": "end"}]}
# Through the connection "plain": an endpoint that honours no key and cannot be asked, so a
# call whose answer is lost can only go to a person.
PLAIN_CALL = {"start": "a", "steps": [_call("a", "done", "plain"), {"id": "done", "type": "end"}]}
# A step that takes a while (the tests' probe type), so a test can lock its run meanwhile.
SLOW = {"start": "p", "steps": [{"id": "p", "type": "probe", "sleep_seconds": 8, "next": "done"},
                                {"id": "done", "type": "end"}]}  # fmt: skip

# Run by `manage.py shell` on the test's database: set up an organisation, start runs, send
# signals. Its arguments come as JSON in FAULTS_ARGS; it prints JSON.
SCRIPT = """
import json, os
from effects.models import Connection, EgressAllow
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start
from workflows.services.signals import signal_send
from workflows.services.tenancy import organisation_ensure

args = json.loads(os.environ["FAULTS_ARGS"])
org = organisation_ensure(slug=args["org"])
if args["do"] == "setup":
    EgressAllow.objects.get_or_create(org=org, entry="127.0.0.1/32")
    Connection.objects.get_or_create(org=org, name="api", defaults={
        "provider": "http", "base_url": args["url"], "options": {"idempotency_keys": True},
        "max_concurrency": 64})
    Connection.objects.get_or_create(org=org, name="plain", defaults={
        "provider": "http", "base_url": args["url"], "max_concurrency": 64})
    for slug, definition in args["automations"].items():
        automation_publish_definition(org=org, slug=slug, definition=definition)
    print(json.dumps([]))
elif args["do"] == "start":
    print(json.dumps([
        run_start(org=org, automation_slug=args["slug"], start_key=key,
                  run_input={"api_url": args["url"], "key": key}).run_id
        for key in args["keys"]]))
elif args["do"] == "signal":
    for key in args["keys"]:
        signal_send(org=org, name="go", correlation=key)
    print(json.dumps([]))
"""


class Faults:
    """The test's server, its database, the engine's processes and the stub provider."""

    def __init__(self, cluster: Cluster, data_dir: Path, address: ServerAddress,
                 stub: ProviderStub, org: str) -> None:  # fmt: skip
        self.cluster, self.data_dir, self.address = cluster, data_dir, address
        self.stub, self.org = stub, org
        self.processes: dict[str, Any] = {}

    def script(self, **args: Any) -> list[int]:
        out = self.cluster.manage("shell", "-c", SCRIPT, **PROBES,
                                  FAULTS_ARGS=json.dumps({"org": self.org, **args}))  # fmt: skip
        return list(json.loads(out.strip().splitlines()[-1]))

    def setup(self, **automations: dict[str, Any]) -> None:
        self.script(do="setup", url=self.stub.url, automations=automations)

    def start(self, slug: str, keys: list[str]) -> list[int]:
        return self.script(do="start", slug=slug, url=self.stub.url, keys=keys)

    def signal(self, keys: list[str]) -> None:
        self.script(do="signal", keys=keys)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return self.cluster.query(sql, *params)

    def unfinished(self, ids: list[int]) -> int:
        rows = self.query(
            "SELECT count(*) FROM workflows_run WHERE id = ANY(%s) AND finished_at IS NULL", ids
        )
        return int(rows[0][0])

    def wait_finished(self, ids: list[int], what: str, seconds: float = 300.0) -> None:
        bounded(what, lambda: self.unfinished(ids) == 0, seconds=seconds, every=0.5)

    def statuses(self, ids: list[int]) -> Counter[str]:
        rows = self.query("SELECT status FROM workflows_run WHERE id = ANY(%s)", ids)
        return Counter(status for (status,) in rows)

    def run(self, name: str, *args: str, **env: str) -> None:
        """Start ``manage.py ARGS`` as process ``name`` (killed at the test's end)."""
        self.processes[name] = self.cluster.command(name, *args, **{**PROBES, **env})

    def assert_alive(self) -> None:
        dead = {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}
        assert not dead, f"engine processes exited: {dead}"

    def log(self, name: str) -> str:
        return self.cluster.log(name)

    def assert_settled_once(self, ids: list[int]) -> None:
        """No step execution settled twice (succeeded or failed twice, or both)."""
        twice = self.query(
            "SELECT run_id, step_id, iteration, count(*) FROM workflows_runevent"
            " WHERE kind IN ('step.succeeded', 'step.failed') AND run_id = ANY(%s)"
            " GROUP BY 1, 2, 3 HAVING count(*) > 1",
            ids,
        )
        assert twice == [], twice

    def assert_made_once(self, ids: list[int], calls_per_run: int) -> None:
        """Each call of each run created its item once at the stub. What the stub is sent
        is the effect key and a suffix (effects/ledger.py's external_key, the same for every
        call of one effect): a second item for one effect key is a second effect."""
        keys = Counter(item["key"].rpartition(":")[0] for item in self.stub.created)
        keys = Counter({key: n for key, n in keys.items() if int(key.split("/")[0]) in ids})
        assert len(keys) == calls_per_run * len(ids), (len(keys), keys.most_common(3))
        assert set(keys.values()) == {1}, keys.most_common(3)

    def attempts(self, ids: list[int]) -> Counter[int]:
        """Steps by attempts used (claims that ran, hand-backs and deferrals excluded)."""
        rows = self.query(
            "SELECT attempt - release_count - series_offset FROM workflows_step"
            " WHERE run_id = ANY(%s) AND step_id <> '~continue'",
            ids,
        )
        return Counter(used for (used,) in rows)

    def events(self, ids: list[int], kind: str) -> int:
        rows = self.query(
            "SELECT count(*) FROM workflows_runevent WHERE run_id = ANY(%s) AND kind = %s",
            ids, kind,
        )  # fmt: skip
        return int(rows[0][0])


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Cluster, Path]]:
    """A server of the module's own, its database migrated once for every test."""
    with server_home("faults") as base:
        data_dir = base / "pg"
        address = start_server(data_dir)
        try:
            with psycopg.connect(address.uri("postgres"), autocommit=True) as admin:
                admin.execute(f"CREATE DATABASE {DATABASE}")
            url = address.uri(DATABASE)
            cluster = Cluster(url=url, secret=secrets.token_urlsafe(32), base=base)
            cluster.manage("migrate", "-v0")
            yield cluster, data_dir
        finally:
            stop_server(data_dir)


@pytest.fixture
def faults(server: tuple[Cluster, Path], request: pytest.FixtureRequest) -> Iterator[Faults]:
    cluster, data_dir = server
    address = start_server(data_dir)  # running again if a test stopped it and failed
    org = request.node.name.removeprefix("test_")[:40].replace("_", "-").strip("-")
    with ExitStack() as stack:
        stub = stack.enter_context(ProviderStub(idempotent=True))
        made = Faults(cluster, data_dir, address, stub, org)
        try:
            yield made
        finally:
            for process in made.processes.values():
                kill_tree(process)


def _keys(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{n}" for n in range(count)]


# --- a server restart -------------------------------------------------------------------------

RESTART_RUNS = 200
# The workers' poll, the backstop for a lost wake-up: far beyond every bound below, so work
# that moves after the restart was woken through LISTEN/NOTIFY, not found by a poll.
SLOW_POLL = "300"


def test_a_restarted_server_loses_no_run_counts_no_attempt_and_the_engine_listens_again(
    faults: Faults,
) -> None:
    faults.setup(busy=BUSY, ping=ONE_CALL)
    faults.run("engine", "runengine", "--no-web", "--grace", "2",
               WAYMARK_WORKER_POLL_SECONDS=SLOW_POLL, WAYMARK_IO_LEASE_SECONDS="30")  # fmt: skip
    keys = _keys("r", RESTART_RUNS)
    ids = faults.start("busy", keys)
    # Under way: some first calls made, timers pending, steps running.
    bounded("a quarter of the first calls", lambda: len(faults.stub.created) >= RESTART_RUNS // 4)
    faults.assert_alive()

    assert stop_server(faults.data_dir)
    assert server_status(faults.data_dir) is None
    restarted = start_server(faults.data_dir)
    assert restarted == faults.address  # the same socket: the engine's URL still names it

    faults.signal(keys)
    faults.wait_finished(ids, "every run to finish after the restart")
    assert faults.statuses(ids) == {"succeeded": RESTART_RUNS}
    faults.assert_settled_once(ids)
    faults.assert_made_once(ids, calls_per_run=3)
    # The outage cost no step an attempt: none failed, none was retried for it. (A claim
    # whose answer the restart cut off lets its lease lapse: that one counts, rarely.)
    assert faults.events(ids, "step.failed") == 0
    assert faults.events(ids, "step.retry_scheduled") == 0
    used = faults.attempts(ids)
    assert max(used) <= 2 and used[2] <= 3, used

    # After the restart, new work is woken through LISTEN: a run started now is claimed long
    # before any poll would find it.
    (ping,) = faults.start("ping", ["after"])
    faults.wait_finished([ping], "a run started after the restart, woken by NOTIFY", 120)
    faults.assert_alive()
    log = faults.log("engine")
    assert "exited with" not in log, log[-4000:]  # no child died and was restarted
    assert "Traceback" not in log, log[log.find("Traceback") - 500 :][:6000]
    assert "the database is unavailable" in log  # the outage was seen, and said once a loop
    print(f"restart: attempts used {dict(used)}, deferred "
          f"{faults.events(ids, 'step.deferred')}, warnings "
          f"{log.count('the database is unavailable')}")  # fmt: skip


# --- an idle engine over an outage says it once ------------------------------------------------


def test_an_idle_engine_says_the_outage_once_a_loop_not_at_every_pass(faults: Faults) -> None:
    """Each loop logs one warning when the database goes and one when it answers again. A
    suspects-only worker, whose passes mostly ask the database nothing, took such a pass for
    the database answering: a pair of lines a second for as long as the outage lasted."""
    faults.setup(ping=ONE_CALL)
    # A short poll: a loop's looks (due retries, suspects) come round several times while
    # the server is down.
    faults.run("engine", "runengine", "--no-web", "--grace", "2",
               WAYMARK_WORKER_POLL_SECONDS="1")  # fmt: skip
    (ping,) = faults.start("ping", ["before"])
    faults.wait_finished([ping], "the engine at work before the outage", 120)
    assert stop_server(faults.data_dir)
    time.sleep(8)  # down for several of the loops' passes
    assert start_server(faults.data_dir) == faults.address
    (after,) = faults.start("ping", ["after"])
    faults.wait_finished([after], "the engine at work after the outage", 120)
    time.sleep(3)  # every loop has passed again
    log = faults.log("engine")
    back = Counter(
        line.split(": the database answers again")[0].split(" WARNING ")[-1]
        for line in log.splitlines()
        if "the database answers again" in line and " worker " in line
    )
    assert back, log[-3000:]
    # On a failure, the lines that say why (which loop said the outage, and when).
    said = [line for line in log.splitlines() if " WARNING " in line and " worker " in line]
    assert max(back.values()) == 1, (back.most_common(5), said[-40:])
    assert "could not update its idle listing" not in log
    assert "Traceback" not in log, log[log.find("Traceback") - 500 :][:6000]


# --- calls answered while the server is down ----------------------------------------------------

IN_FLIGHT_RUNS = 12


def test_calls_answered_while_the_server_is_down_are_recorded_once_it_is_back(
    faults: Faults,
) -> None:
    """An outside call under way when the server goes down, answered before it is back: the
    answer is known only to the worker that made the call. Kept until the database answers
    again (as a settle is), the effect is settled and the run goes on; dropped, an endpoint
    that honours no key and cannot be asked leaves the effect to a person (needs_review)
    though it was made."""
    faults.setup(plain=PLAIN_CALL)
    faults.stub.hold()
    faults.run("engine", "runengine", "--no-web", "--grace", "2",
               WAYMARK_IO_LEASE_SECONDS="5")  # fmt: skip
    ids = faults.start("plain", _keys("p", IN_FLIGHT_RUNS))
    bounded("calls under way at the stub", lambda: faults.stub.arrived >= 4)

    assert stop_server(faults.data_dir)
    faults.stub.release()  # answered 200 while the server is down
    bounded("every call held answered", lambda: len(faults.stub.created) >= faults.stub.arrived)
    time.sleep(3)  # down past the answers, as a restart is
    assert start_server(faults.data_dir) == faults.address

    def ended_or_waits_for_a_person() -> bool:
        return faults.unfinished(ids) == 0 or faults.events(ids, "effect.needs_review") > 0

    bounded("every run to finish (or a call left to a person)", ended_or_waits_for_a_person,
            seconds=300)  # fmt: skip
    assert faults.events(ids, "effect.needs_review") == 0
    assert faults.events(ids, "effect.outcome_unknown") == 0
    assert faults.statuses(ids) == {"succeeded": IN_FLIGHT_RUNS}
    faults.assert_made_once(ids, calls_per_run=1)
    faults.assert_settled_once(ids)
    log = faults.log("engine")
    assert "Traceback" not in log, log[log.find("Traceback") - 500 :][:6000]


# --- backends terminated mid-settle ----------------------------------------------------------

TERMINATED_RUNS = 120


class Terminator(threading.Thread):
    """Terminates engine backends again and again: mostly a worker's that is busy (a claim,
    a settle's transaction), sometimes any engine connection (a listener, the relay's).
    Paced by the engine's progress (``progress``: a count that grows as work is done), a
    termination at most every 0.05 s and at most PER_PROGRESS while the count stays put: at
    a fixed rate, a loaded machine, on which every reconnect and settle is slower, had each
    settle terminated before it could commit, and nothing went on at all."""

    PER_PROGRESS = 3

    def __init__(self, url: str, progress: Callable[[], int]) -> None:
        super().__init__(name="terminator", daemon=True)
        self.url = url
        self.progress = progress
        self.stop = threading.Event()
        self.killed: Counter[str] = Counter()

    def run(self) -> None:
        busy = ("SELECT pid, application_name FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND application_name LIKE 'waymark-worker%%'"
                " AND state IN ('active', 'idle in transaction')"
                " ORDER BY random() LIMIT 1")  # fmt: skip
        anyone = ("SELECT pid, application_name FROM pg_stat_activity"
                  " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                  " AND application_name LIKE 'waymark-%%' ORDER BY random() LIMIT 1")  # fmt: skip
        with psycopg.connect(self.url, autocommit=True) as conn:
            turn, seen, since = 0, -1, 0
            while not self.stop.wait(0.05):
                done = self.progress()
                if done != seen:
                    seen, since = done, 0
                elif since >= self.PER_PROGRESS:
                    continue  # nothing got through since the last terminations yet
                turn += 1
                row = conn.execute(anyone if turn % 5 == 0 else busy).fetchone()
                if row is not None:
                    conn.execute("SELECT pg_terminate_backend(%s)", [row[0]])
                    self.killed[row[1]] += 1
                    since += 1


def test_backends_terminated_in_the_middle_of_settles_lose_nothing_and_repeat_nothing(
    faults: Faults,
) -> None:
    faults.setup(three=THREE_CALLS)
    faults.run("engine", "runengine", "--no-web", "--grace", "2",
               WAYMARK_IO_LEASE_SECONDS="30")  # fmt: skip
    terminator = Terminator(faults.cluster.url, progress=lambda: len(faults.stub.created))
    ids = faults.start("three", _keys("t", TERMINATED_RUNS))
    bounded("the first calls", lambda: len(faults.stub.created) >= 5)
    terminator.start()
    try:
        bounded("two thirds of the calls, under fire",
                lambda: len(faults.stub.created) >= 2 * TERMINATED_RUNS)  # fmt: skip
    finally:
        terminator.stop.set()
        terminator.join()
    faults.wait_finished(ids, "every run to finish")
    workers = sum(n for name, n in terminator.killed.items() if "worker" in name)
    assert workers >= 10, terminator.killed  # it did terminate settles, many times
    assert faults.statuses(ids) == {"succeeded": TERMINATED_RUNS}
    faults.assert_settled_once(ids)
    faults.assert_made_once(ids, calls_per_run=3)
    assert faults.events(ids, "step.failed") == 0
    faults.assert_alive()
    log = faults.log("engine")
    assert "exited with" not in log, log[-4000:]
    # Each loop said so in a warning, without a traceback (a bug would still show one).
    assert "Traceback" not in log, log[log.find("Traceback") - 500 :][:6000]
    print(f"terminated: {dict(terminator.killed)}; attempts used {dict(faults.attempts(ids))}")


# --- an idle transaction holding a run's lock -------------------------------------------------

LOCK_TIMEOUT_MS = "500"
IDLE_TIMEOUT_MS = "5000"


def test_an_idle_transaction_holding_a_run_stalls_only_that_run_until_the_server_ends_it(
    faults: Faults,
) -> None:
    faults.setup(slow=SLOW, quick=ONE_CALL)
    faults.run("engine", "runengine", "--no-web", "--grace", "2",
               WAYMARK_DB_LOCK_TIMEOUT_MS=LOCK_TIMEOUT_MS,
               WAYMARK_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS=IDLE_TIMEOUT_MS)  # fmt: skip
    (held,) = faults.start("slow", ["held"])
    bounded("the slow step to run",
            lambda: faults.query("SELECT 1 FROM workflows_step WHERE run_id = %s"
                                 " AND status = 'running'", held))  # fmt: skip
    # A connection set up as the engine's are (the same timeouts: a process stopped in a
    # transaction), locking the run as a settle would. Until the test has seen what it waits
    # for, the holder's transaction is kept busy (a statement a second: never idle long
    # enough for the server to end it); then it idles.
    options = (f"-c lock_timeout={LOCK_TIMEOUT_MS}"
               f" -c idle_in_transaction_session_timeout={IDLE_TIMEOUT_MS}")  # fmt: skip
    holder = psycopg.connect(faults.cluster.url, options=options)

    def held_while(what: str, check: Any) -> None:
        def poked() -> Any:
            holder.execute("SELECT 1")
            return check()

        bounded(what, poked, every=1.0)

    try:
        holder.execute("SELECT id FROM workflows_run WHERE id = %s FOR UPDATE", [held])
        holder_pid = holder.info.backend_pid
        locked_at = faults.query("SELECT now()")[0][0]
        # Meanwhile other runs go on: they start and finish while the lock is held.
        others: list[int] = []
        starter = threading.Thread(
            target=lambda: others.extend(faults.start("quick", _keys("q", 10)))
        )
        starter.start()
        held_while("the other runs, beside the held lock",
                   lambda: others and faults.unfinished(others) == 0)  # fmt: skip
        starter.join()
        # The held run's settle meets lock_timeout and tries again (said once, in the log).
        held_while("the settle to meet the lock timeout",
                   lambda: "LockNotAvailable" in faults.log("engine"))  # fmt: skip
        assert faults.unfinished([held]) == 1  # its settle waits behind the lock
        # Left idle, the transaction is ended by the server; the run goes on.
        bounded("the server to end the idle transaction",
                lambda: not faults.query("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                         holder_pid))  # fmt: skip
        faults.wait_finished([held], "the held run, once its lock is gone")
    finally:
        holder.close()
    assert faults.statuses([held, *others]) == {"succeeded": 11}
    finished = faults.query("SELECT max(finished_at) FROM workflows_run WHERE id = ANY(%s)",
                            others)[0][0]  # fmt: skip
    assert finished > locked_at
    # The settle waited and went through: the step ran once, no attempt was counted.
    assert max(faults.attempts([held])) == 1, faults.attempts([held])
    faults.assert_settled_once([held, *others])
    faults.assert_alive()


# --- a half-open LISTEN connection ------------------------------------------------------------


def test_a_worker_whose_listening_connection_goes_silent_notices_and_listens_again(
    faults: Faults,
) -> None:
    faults.setup(ping=ONE_CALL)
    socket_path = f"{faults.address.socket_dir}/.s.PGSQL.{faults.address.port}"
    with ListenProxy(socket_path) as proxy:
        proxied = f"postgresql://postgres@127.0.0.1:{proxy.port}/{DATABASE}"
        faults.run("relay", "relay")
        faults.run("sweep", "sweep")
        # The one io worker, through the proxy: it polls only every SLOW_POLL seconds, so
        # what it claims within the bounds below it was woken for through its LISTEN.
        faults.run("deaf", "worker", "--lane", "io", "--concurrency", "4",
                   DATABASE_URL=proxied, WAYMARK_WORKER_POLL_SECONDS=SLOW_POLL,
                   WAYMARK_LISTEN_CHECK_SECONDS="1")  # fmt: skip
        bounded("the worker to listen", lambda: proxy.snapshot().listens >= 1, seconds=120)
        first = faults.start("ping", ["before"])
        faults.wait_finished(first, "a run woken through the proxied LISTEN", 120)

        proxy.cut_listeners()  # silence: no error, no answer
        bounded("the worker to notice its listening connection is silent",
                lambda: proxy.snapshot().noticed >= 1, seconds=120)  # fmt: skip
        # Meanwhile work is not stuck: another worker (polling) takes it.
        faults.run("helper", "worker", "--lane", "io", "--concurrency", "4")
        during = faults.start("ping", _keys("during", 3))
        faults.wait_finished(during, "runs started while the worker is deaf", 120)
        helper = faults.processes.pop("helper")
        helper.send_signal(signal.SIGTERM)
        assert helper.wait(timeout=120) == 0

        listens = proxy.snapshot().listens
        proxy.heal()
        bounded("the worker to listen again", lambda: proxy.snapshot().listens > listens,
                seconds=120)  # fmt: skip
        after = faults.start("ping", ["after"])
        faults.wait_finished(after, "a run woken through the new LISTEN", 120)
        faults.assert_alive()
    log = faults.log("deaf")
    assert "Traceback" not in log, log[-4000:]
    assert faults.statuses([*first, *during, *after]) == {"succeeded": 5}
