"""Waymark's side of the peer benchmark (run by run.py with the project's venv; prints one
JSON object). Each call starts a fresh embedded PostgreSQL of its own under --data, runs the
engine the way users do (`manage.py runengine --no-web`: relay, sweeper, a worker per lane)
and measures:

- chain-3 / chain-10: runs of 3 or 10 no-op io steps (`start -> s1 -> ... -> end`), each
  step claimed and settled by a worker. drain: every run started with no engine, held from
  the claim while the engine starts, then made due at once (the peer's drain starts in a
  process already launched too); rate from the first claim to the last finish (database
  clock). e2e: the engine running while one thread starts the runs; first start to last
  finish.
- code-3 / code-run-3 / code-10 (drain only): the chain-3 work as a code workflow
  (peer_code.py): three `ctx.step(id, "noop")` calls (the same noop io steps), or three
  `ctx.run` calls of a no-op function; code-10 is chain-10's work; steps/s counts the
  run's steps, as the chain's.
- serial: one 3-step run at a time, started, then awaited as a caller awaits one
  (``run_wait``: back when the transaction that ends the run commits; client clock), after 20
  untimed ones; ``serial code-3``: the same with the code workflow code-3.
  ``PEER_SERIAL_POLL=1`` awaits by polling the run every 2 ms instead, as it did before.
- sleep: runs of one durable `wait` of 2 s, all started together; lateness = the run's
  finish minus the timer's due time (database clock).
- starts: starts through the service with 10 % duplicate start keys; starts/s, and that the
  duplicates made no run.
- commits per io step (pg_stat_database over the drain pass, idle polls included) and the
  server's commit limit (machine.commit_limit) with 1 and 8 connections.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from machine import (  # noqa: E402
    DRAIN_POLL,
    WARM_UP,
    arguments,
    busy_cpu_seconds,
    load_average,
    measure,
    percentile,
    server_commits,
)

DATABASE = "waymark_peer"

# A drain's ready steps, kept from the claim (due in a day, as a retry not yet due is) while
# the engine starts, then made due together.
HOLD_READY = (
    "UPDATE workflows_step SET lease_until = now() + interval '1 day' WHERE status = 'ready'"
)
RELEASE_READY = (
    "UPDATE workflows_step SET lease_until = now() WHERE status = 'ready' AND lease_until > now()"
)


def chain_definition(steps: int) -> dict[str, Any]:
    ids = [f"s{i}" for i in range(1, steps + 1)]
    nexts = [*ids[1:], "done"]
    return {
        "start": ids[0],
        "steps": [
            *({"id": i, "type": "noop", "next": n} for i, n in zip(ids, nexts, strict=True)),
            {"id": "done", "type": "end"},
        ],
    }


# peer_code.py's workflows and how many steps each takes
CODE_WORKS = {"code-3": 3, "code-run-3": 3, "code-10": 10}

SLEEP = {
    "start": "nap",
    "steps": [
        {"id": "nap", "type": "wait", "duration": "2s", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


class Side:
    def __init__(self, data: Path) -> None:
        self.env = {
            **os.environ,
            "WAYMARK_DATA_DIR": str(data),
            "WAYMARK_DB_NAME": DATABASE,
            "WAYMARK_LOG_LEVEL": "WARNING",
            # The code workflows (peer_code.py), registered by every process of the side.
            "WAYMARK_EXTRA_STEP_MODULES": "peer_code",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
            "DJANGO_SETTINGS_MODULE": "waymark_config.settings",
        }
        os.environ.update(self.env)
        sys.path.insert(0, str(ROOT))
        os.chdir(ROOT)
        import django
        from django.core.management import call_command

        django.setup()
        if not os.environ.get("DATABASE_URL"):
            # The last measurement stopped it (`close`): a stopped server stays stopped.
            call_command("embedded_db", "start", stdout=io.StringIO())
        call_command("migrate", verbosity=0)
        from django.db import connection

        from workflows.models import Organisation
        from workflows.plugins.code import publish_code_workflow
        from workflows.services.automations import automation_publish_definition

        self.org, _ = Organisation.objects.get_or_create(slug="peer", defaults={"name": "peer"})
        for name, definition in (
            ("chain-3", chain_definition(3)),
            ("chain-10", chain_definition(10)),
            ("sleep", SLEEP),
        ):
            automation_publish_definition(org=self.org, slug=name, definition=definition)
        for name in CODE_WORKS:
            publish_code_workflow(org=self.org, name=name, version=1)
        connection.ensure_connection()
        self.uri = connection.connection.info.dsn
        # A measurement killed half-way left its runs: their start keys are this one's (the
        # tags start again at 1), so its starts would find them and wait on them for ever.
        self.empty()
        self.engine: subprocess.Popen[bytes] | None = None
        self.tag = 0

    # --- the engine, as users run it ---------------------------------------------------------

    def start_engine(self) -> None:
        self.engine = subprocess.Popen(
            [sys.executable, "manage.py", "runengine", "--no-web"],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def wait_engine_ready(self) -> None:
        """Until one run goes through: the engine's processes are up and listening."""
        run_id = self.start("chain-3", 1)[0]
        self.await_finished([run_id])
        # Its rows only: a TRUNCATE (empty) while the engine runs takes its tables' locks in
        # another order than a worker's claim, and one of the two died of the deadlock.
        for table, column in (("workflows_runevent", "run_id"), ("workflows_step", "run_id"),
                              ("workflows_run", "id")):  # fmt: skip
            self.q(f"DELETE FROM {table} WHERE {column} = %(run)s", {"run": run_id})  # noqa: S608

    def stop_engine(self) -> None:
        if self.engine is not None:
            self.engine.send_signal(signal.SIGTERM)
            self.engine.wait(timeout=60)
            self.engine = None

    # --- helpers ------------------------------------------------------------------------------

    def q(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(sql, params or {})
            return cursor.fetchall() if cursor.description else []

    def empty(self) -> None:
        self.q(
            "TRUNCATE workflows_runevent, workflows_step, workflows_outbox, workflows_run CASCADE"
        )
        self.q("CHECKPOINT")

    def start(self, slug: str, count: int, *, duplicates: float = 0.0) -> list[int]:
        from workflows.services.runs import run_start

        self.tag += 1
        keys = [f"{self.tag}-{n}" for n in range(count)]
        every = round(1 / duplicates) if duplicates else 0
        if every:  # every tenth start repeats the key of the start before it
            keys = [keys[n - 1] if n and n % every == 0 else key for n, key in enumerate(keys)]
        # a duplicate is a delivery retried: the same key with the same input
        return [
            run_start(
                org=self.org, automation_slug=slug, run_input={"key": key}, start_key=key
            ).run_id
            for key in keys
        ]

    def await_finished(self, ids: list[int], poll: float = 0.01) -> None:
        # By the ids' range, not the list: a poll that sends thousands of ids costs the
        # machine's CPU (the drain's) more than the work it waits for. The runs of one call
        # are started one after the other, and nothing else starts meanwhile.
        span = {"lo": min(ids), "hi": max(ids)}
        while self.q(
            "SELECT 1 FROM workflows_run WHERE id BETWEEN %(lo)s AND %(hi)s"
            " AND finished_at IS NULL LIMIT 1",
            span,
        ):
            time.sleep(poll)

    def awaited(self, run_id: int) -> None:
        """Back once the run has ended, as a caller waits for one (run_wait: told by the
        transaction that ends it, no polling)."""
        from workflows.services.run_waits import run_wait

        if os.environ.get("PEER_SERIAL_POLL"):  # the way this work was awaited before run_wait
            self.await_finished([run_id], poll=0.002)
            return
        if not run_wait(org=self.org, run_id=run_id, timeout=60).ended:
            raise SystemExit(f"run {run_id} did not end within 60 s")

    def not_succeeded(self) -> int:
        return int(self.q("SELECT count(*) FROM workflows_run WHERE status <> 'succeeded'")[0][0])

    # --- the work -----------------------------------------------------------------------------

    def chain(self, steps: int, mode: str, n: int, *, slug: str = "") -> dict[str, Any]:
        slug = slug or f"chain-{steps}"
        if mode == "e2e":
            self.start_engine()
            self.wait_engine_ready()
            began = time.monotonic()
            ids = self.start(slug, n)
        else:
            ids = self.start(slug, n)
            # The peer's drain begins in a process already launched: this one begins once the
            # engine's processes are up, its runs held out of the claim meanwhile, not beside
            # their start-up (imports and connections, a second or more of CPU each on the
            # two cores the drain has).
            self.q(HOLD_READY)
            self.start_engine()
            self.wait_engine_ready()
            time.sleep(1.0)
            before = server_commits(self.uri, DATABASE)
            busy = busy_cpu_seconds()
            began = time.monotonic()
            self.q(RELEASE_READY)
        self.await_finished(ids, poll=DRAIN_POLL)
        wall = time.monotonic() - began
        busy = busy_cpu_seconds() - busy if mode == "drain" else 0.0
        self.stop_engine()
        if mode == "e2e":
            span = self.q(
                "SELECT extract(epoch FROM max(finished_at) - min(created_at)) FROM workflows_run"
            )[0][0]
        else:
            span = self.q(
                "SELECT extract(epoch FROM (SELECT max(finished_at) FROM workflows_run)"
                " - (SELECT min(at) FROM workflows_runevent WHERE kind = 'step.claimed'))"
            )[0][0]
        row: dict[str, Any] = {
            "work": f"{slug} {mode}",
            "runs": n,
            "wall_s": round(wall, 2),
            "steps_per_s": round(steps * n / float(span), 1),
            "not_succeeded": self.not_succeeded(),
        }
        if mode == "drain":
            time.sleep(1.0)  # pg_stat_database lags the commits
            used = server_commits(self.uri, DATABASE) - before
            row["commits_per_step"] = round(used / (steps * n), 2)
            row["cpu_us_per_step"] = round(busy / (steps * n) * 1e6, 1)
        self.empty()
        return row

    def code(self, slug: str, n: int) -> dict[str, Any]:
        """The chain-3 work as a code workflow (peer_code.py), drained."""
        return self.chain(CODE_WORKS[slug], "drain", n, slug=slug)

    def serial(self, n: int, slug: str = "chain-3") -> dict[str, Any]:
        """One run of ``slug`` at a time (the chain-3 definition, or code-3: the same work as
        a code workflow), from the start request to the poll that sees it succeeded."""
        self.start_engine()
        self.wait_engine_ready()
        for _ in range(WARM_UP):  # untimed, as the peer's side
            self.awaited(self.start(slug, 1)[0])
        took = []
        for _ in range(n):
            began = time.monotonic()
            self.awaited(self.start(slug, 1)[0])
            took.append((time.monotonic() - began) * 1000)
        self.stop_engine()
        row = {
            "work": f"serial {slug}",
            "runs": n,
            "p50_ms": percentile(took, 50),
            "p90_ms": percentile(took, 90),
            "p99_ms": percentile(took, 99),
            "max_ms": round(max(took), 1),
            "not_succeeded": self.not_succeeded(),
        }
        self.empty()
        return row

    def sleep(self, n: int) -> dict[str, Any]:
        self.start_engine()
        self.wait_engine_ready()
        ids = self.start("sleep", n)
        self.await_finished(ids, poll=0.05)
        self.stop_engine()
        late = [
            float(x[0]) * 1000
            for x in self.q(
                "SELECT extract(epoch FROM r.finished_at - t.due_at) FROM workflows_run r"
                " JOIN timers_timer t ON t.run_id = r.id"
            )
        ]
        row = {
            "work": "sleep 2s",
            "runs": n,
            "late_p50_ms": percentile(late, 50),
            "late_p99_ms": percentile(late, 99),
            "late_max_ms": round(max(late), 1),
            "not_succeeded": self.not_succeeded(),
        }
        self.empty()
        return row

    def starts(self, n: int) -> dict[str, Any]:
        began = time.monotonic()
        ids = self.start("chain-3", n, duplicates=0.1)
        wall = time.monotonic() - began
        made = int(self.q("SELECT count(*) FROM workflows_run")[0][0])
        row = {
            "work": "starts, 10% duplicate keys",
            "runs": n,
            "starts_per_s": round(n / wall, 1),
            "runs_made": made,
            "distinct_ids": len(set(ids)),
        }
        self.empty()
        return row


def main() -> None:
    args = arguments()
    side = Side(args.data)

    def close() -> None:
        side.stop_engine()
        from django.db import connection

        connection.close()
        subprocess.run(
            [sys.executable, "manage.py", "embedded_db", "stop"],
            cwd=ROOT,
            env=side.env,
            capture_output=True,
            check=False,
        )

    measure("waymark", side, args, load_average(), close=close)


if __name__ == "__main__":
    main()
