"""DBOS Transact's side of the peer benchmark (run by run.py with the peer's venv, see
requirements.txt; prints one JSON object). The same work as waymark_side.py, on a fresh
embedded PostgreSQL of its own under --data, default settings:

- chain-3 / chain-10: a @DBOS.workflow calling 3 or 10 no-op @DBOS.step's, through a queue
  (worker_concurrency 128, polling every 10 ms: its fastest settings on this work). drain:
  every workflow enqueued on a queue not yet registered, then the queue is registered; rate
  from the first dequeue to the last completion (database clock). e2e: the queue running
  while one thread enqueues; first enqueue to last completion.
- serial: one 3-step workflow at a time, called directly in this process (its fastest way;
  no queue, no other process), after 20 untimed ones. Each queue pass deletes its queue when
  it ends (``retire``): a queue's polling thread left running beside the direct calls would
  slow them (four left from the chain passes doubled the p50).
- sleep: workflows of one DBOS.sleep(2), all started together; lateness = when the sleep
  returned minus when it was due.
- starts: enqueues with 10 % duplicate workflow ids (SetWorkflowID); enqueues/s, and that
  the duplicates made no workflow.
- commits per step (pg_stat_database over the drain pass) and the server's commit limit.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import (  # noqa: E402
    DRAIN_POLL,
    WARM_UP,
    arguments,
    busy_cpu_seconds,
    fresh_server,
    load_average,
    measure,
    percentile,
    server_commits,
)

SYSTEM_DB = "dbos_peer_sys"
CONCURRENCY, POLL = 128, 0.01


class Side:
    def __init__(self, data: Path) -> None:
        from sqlalchemy.engine import make_url

        self.server, uri = fresh_server(data)
        self.uri = make_url(uri).set(database=SYSTEM_DB).render_as_string(hide_password=False)
        from dbos import DBOS, DBOSConfig

        system_url = make_url(uri).set(drivername="postgresql+psycopg", database=SYSTEM_DB)
        config: DBOSConfig = {
            "name": "peer",
            "log_level": "WARNING",
            "system_database_url": system_url.render_as_string(hide_password=False),
        }
        DBOS(config=config)
        self.dbos = DBOS

        @DBOS.step()
        def noop(i: int) -> int:
            return i

        @DBOS.workflow()
        def chain_3(i: int) -> int:
            for s in range(3):
                noop(s)
            return i

        @DBOS.workflow()
        def chain_10(i: int) -> int:
            for s in range(10):
                noop(s)
            return i

        self.late: list[float] = []
        lock = threading.Lock()

        @DBOS.workflow()
        def sleeper(seconds: float) -> None:
            due = time.time() + seconds
            DBOS.sleep(seconds)
            with lock:
                self.late.append((time.time() - due) * 1000)

        self.chains = {3: chain_3, 10: chain_10}
        self.sleeper = sleeper
        DBOS.launch()
        logging.getLogger("dbos").setLevel(logging.WARNING)
        self.queues = 0

    def q(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.uri, autocommit=True) as c:
            return c.execute(sql, params).fetchall()

    def await_done(self, queue: str, n: int, poll: float = 0.01) -> None:
        import psycopg

        sql = (
            "SELECT count(*) FROM dbos.workflow_status WHERE queue_name = %s"
            " AND status IN ('SUCCESS', 'ERROR')"
        )
        # One connection for the whole wait: a connection per look costs the server a new
        # backend each time, CPU taken from the work.
        with psycopg.connect(self.uri, autocommit=True) as c:
            while c.execute(sql, (queue,)).fetchall()[0][0] < n:
                time.sleep(poll)

    def not_succeeded(self, queue: str) -> int:
        sql = (
            "SELECT count(*) FROM dbos.workflow_status"
            " WHERE queue_name = %s AND status <> 'SUCCESS'"
        )
        return int(self.q(sql, (queue,))[0][0])

    def new_queue(self) -> str:
        self.queues += 1
        return f"peer_{self.queues}"

    def chain(self, steps: int, mode: str, n: int) -> dict[str, Any]:
        DBOS, workflow, queue = self.dbos, self.chains[steps], self.new_queue()
        if mode == "e2e":
            DBOS.register_queue(queue, worker_concurrency=CONCURRENCY, polling_interval_sec=POLL)
            time.sleep(1.5)  # its queue thread takes a new queue up within a second
            began = time.monotonic()
            for i in range(n):
                DBOS.enqueue_workflow(queue, workflow, i)
        else:
            for i in range(n):
                DBOS.enqueue_workflow(queue, workflow, i)
            time.sleep(1.0)
            before = server_commits(self.uri, SYSTEM_DB)
            busy = busy_cpu_seconds()
            began = time.monotonic()
            DBOS.register_queue(queue, worker_concurrency=CONCURRENCY, polling_interval_sec=POLL)
        self.await_done(queue, n, poll=DRAIN_POLL)
        wall = time.monotonic() - began
        busy = busy_cpu_seconds() - busy if mode == "drain" else 0.0
        first, last, dequeued = self.q(
            "SELECT min(created_at), max(updated_at), min(started_at_epoch_ms)"
            " FROM dbos.workflow_status WHERE queue_name = %s",
            (queue,),
        )[0]
        span = (last - (first if mode == "e2e" else dequeued)) / 1000
        row: dict[str, Any] = {
            "work": f"chain-{steps} {mode}",
            "runs": n,
            "wall_s": round(wall, 2),
            "steps_per_s": round(steps * n / span, 1),
            "not_succeeded": self.not_succeeded(queue),
        }
        if mode == "drain":
            time.sleep(1.0)  # pg_stat_database lags the commits
            used = server_commits(self.uri, SYSTEM_DB) - before
            row["commits_per_step"] = round(used / (steps * n), 2)
            row["cpu_us_per_step"] = round(busy / (steps * n) * 1e6, 1)
        self.retire(queue)
        return row

    def retire(self, queue: str) -> None:
        """Delete a pass's queue: its worker thread, which polls every POLL seconds in this
        process for as long as the queue exists, stops at its next look. Left running, four
        such threads doubled the direct call's latency measured after them (serial)."""
        self.dbos.delete_queue(queue)
        time.sleep(0.5)

    def serial(self, n: int) -> dict[str, Any]:
        for i in range(WARM_UP):  # untimed, as Waymark's side
            self.chains[3](-1 - i)
        took = []
        for i in range(n):
            began = time.monotonic()
            self.chains[3](i)
            took.append((time.monotonic() - began) * 1000)
        return {
            "work": "serial chain-3",
            "runs": n,
            "p50_ms": percentile(took, 50),
            "p90_ms": percentile(took, 90),
            "p99_ms": percentile(took, 99),
            "max_ms": round(max(took), 1),
            "not_succeeded": 0,
        }

    def sleep(self, n: int) -> dict[str, Any]:
        self.late.clear()
        handles = [self.dbos.start_workflow(self.sleeper, 2.0) for _ in range(n)]
        for handle in handles:
            handle.get_result()
        return {
            "work": "sleep 2s",
            "runs": n,
            "late_p50_ms": percentile(self.late, 50),
            "late_p99_ms": percentile(self.late, 99),
            "late_max_ms": round(max(self.late), 1),
            "not_succeeded": n - len(self.late),
        }

    def starts(self, n: int) -> dict[str, Any]:
        from dbos import SetWorkflowID

        queue = self.new_queue()  # never registered: the enqueues are the work measured
        keys = [f"start-{k}" for k in range(n)]
        keys = [keys[k - 1] if k and k % 10 == 0 else key for k, key in enumerate(keys)]
        began = time.monotonic()
        ids = set()
        for key in keys:
            with SetWorkflowID(key):
                ids.add(self.dbos.enqueue_workflow(queue, self.chains[3], 0).workflow_id)
        wall = time.monotonic() - began
        made = self.q("SELECT count(*) FROM dbos.workflow_status WHERE queue_name = %s", (queue,))
        return {
            "work": "starts, 10% duplicate keys",
            "runs": n,
            "starts_per_s": round(n / wall, 1),
            "runs_made": int(made[0][0]),
            "distinct_ids": len(ids),
        }


def main() -> None:
    args = arguments()
    load_before = load_average()
    side = Side(args.data)
    measure("dbos", side, args, load_before, close=side.dbos.destroy)


if __name__ == "__main__":
    main()
