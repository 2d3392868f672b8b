"""Chaos runs: the engine's roles as separate processes, killed at random while runs go on.

A ``Pool`` starts each role alone (io workers, a worker per other lane, a suspects-only
worker per lane, two relays, two sweepers), each with its own log file, so any one can be
killed without the others. A ``Driver`` thread (seeded: a failure can be replayed) picks a
process every 0.5-3 s and does one of:

- ``kill``: SIGKILL, then starts it again;
- ``term``: SIGTERM (it stops within its grace), then starts it again;
- ``stop``: SIGSTOP for longer than a step's lease, then SIGCONT (a long GC pause, a
  partition: its leases lapse, others take its work, and it wakes up to find it gone);
- ``crash``: SIGKILL, then starts it again with ``WAYMARK_CRASH_AT`` set to one of its
  role's crash points: it dies when it reaches that line (exit status 137, counted as a
  hit), and is started again without it.
- ``sever``: terminates every database connection of one role's processes on the server
  (``pg_terminate_backend``: a settle half sent, a LISTEN, a claim, as in a failover); the
  processes live on and must reconnect and listen again.

A process is struck only once it has been up a while (a Django process takes seconds to
start on a loaded machine), and one armed with a crash point is left to reach it.

The load (``Load``) is drawn up front: generated automations (tests/generated_automations.py,
each with its predicted path), an automation whose signal is sent before its run waits for
it, and a saga whose last step fails for good (its compensations must each run once). Runs
are started through the API so that many are in flight while processes die, and a scripted
person answers signals, approvals and tasks as the automation says.

Afterwards (``drain``) the chaos stops, every process is continued or started again
without a crash point, and the engine drains: waiting is bounded by progress (the run
events keep coming), never by a wall-clock budget. ``check`` (tests/chaos_checks.py) then reads the
database, the stubs and the logs, and lists every violated invariant
(docs/explanation/how-the-guarantees-are-tested.md, "Chaos runs").
"""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from effects.models import Effect
from waymark_config.process_role import application_name
from workflows.definitions.registry import registry
from workflows.engine.transport import own_connection
from workflows.models import Run, RunEvent, Step

from .engine_harness import Harness
from .generated_automations import Automation, RunInput, automations, run_inputs
from .processes import ROOT, engine_env
from .test_generated_automations import People

FINAL = ("succeeded", "failed", "cancelled", "compensated")
LOG_ALARMS = ("Traceback", "engine_error")
LEASE_SECONDS = 2.0  # every lane's, in chaos (CHAOS_ENV)
CHAOS_ATTEMPTS = 25  # every lane's and every worker step's (chaos_attempts)

# Short leases and quick looks, so that a process stopped past its lease is noticed in
# seconds. Attempts: with a kill every ~2 s, a step can be caught in more kills than the
# default 5 attempts (the poison-step guard then fails it, by design); production kills are
# rarer by orders of magnitude, so chaos allows more.
CHAOS_ENV = {
    **{f"WAYMARK_{lane}_LEASE_SECONDS": str(LEASE_SECONDS) for lane in ("IO", "SLOW", "HUMAN")},
    **{f"WAYMARK_{lane}_MAX_ATTEMPTS": str(CHAOS_ATTEMPTS) for lane in ("IO", "SLOW", "HUMAN")},
    **{f"WAYMARK_{lane}_BACKOFF_BASE_SECONDS": "0.05" for lane in ("IO", "SLOW", "HUMAN")},
    **{f"WAYMARK_{lane}_BACKOFF_CAP_SECONDS": "0.5" for lane in ("IO", "SLOW", "HUMAN")},
    "WAYMARK_SWEEP_SECONDS": "0.3",  # the sweep lease is 3 ticks: a dead leader's lapses fast
    "WAYMARK_EFFECTS_LEASE_MARGIN_SECONDS": "2",  # an effect's lease: its timeout + this
    "WAYMARK_EFFECTS_DEFER_SECONDS": "0.5",
    # Every kill loses answers; five on one connection in a row would open its circuit for
    # the cool-down (the breaker has its own tests).
    "WAYMARK_EFFECTS_CIRCUIT_FAILURES": "100000",
}
CALL_TIMEOUT_SECONDS = 5.0  # the connections' (an effect's lease: this + the margin above)

# The crash points each role can reach (docs/explanation/processes-timers-effects.md, "Crash
# points"): the io lane runs the effects but the model, and walks that take pending signals; slow
# runs the model; human the approvals and tasks.
EFFECT_POINTS = ("worker.after_claim", "effect.before_call", "effect.after_answer",
                 "settle.after_step_update")  # fmt: skip
LANE_POINTS = {
    "io": (*EFFECT_POINTS, "signal.after_consume"),
    "slow": EFFECT_POINTS,
    "human": ("worker.after_claim", "approval.after_decision", "settle.after_step_update"),
}
SWEEP_POINTS = ("timers.after_claim", "timers.before_batch_commit", "signal.after_consume",
                "approval.after_decision")  # fmt: skip
RELAY_POINTS = ("relay.after_publish",)
CRASHED = 137  # os._exit(137) at a crash point
# A process is struck only once it has been up this long (a Django process takes seconds to
# start on a loaded machine: struck sooner, it would never work), and one armed with a crash
# point is left alone to reach it, for this long at most.
UP_SECONDS = 8.0
ARMED_SECONDS = 30.0
# A worker stops within its grace (2 s) and the release of its steps; this bound only tells a
# hang from a slow machine.
TERM_BOUND_SECONDS = 120.0


# --- the processes --------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    argv: list[str]
    points: tuple[str, ...]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    armed: str = ""  # the crash point it was started with
    stopped_until: float = 0.0  # SIGSTOPped: continued at this monotonic time
    started: int = 0
    started_at: float = 0.0

    def start(self, crash_at: str = "") -> None:
        env = engine_env(**CHAOS_ENV)
        env.pop("WAYMARK_CRASH_AT", None)
        if crash_at:
            env["WAYMARK_CRASH_AT"] = crash_at
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {self.name} start {self.started} crash_at={crash_at!r}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                [sys.executable, "manage.py", *self.argv],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.armed, self.stopped_until = crash_at, 0.0
        self.started += 1
        self.started_at = time.monotonic()

    def up_for(self, now: float) -> float:
        return now - self.started_at

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        assert self.popen is not None
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


def roles(log_dir: Path, *, io_workers: int = 2) -> list[Proc]:
    """Every role runengine runs (but the web: the test is the API), one process each, with
    two io workers, two relays and two sweepers (one holds the sweep lease at a time)."""
    specs: list[tuple[str, list[str], tuple[str, ...]]] = []
    for n in range(io_workers):
        argv = ["worker", "--lane", "io", "--grace", "2"]
        specs.append((f"worker-io-{n}", argv, LANE_POINTS["io"]))
    for lane in ("slow", "human"):
        argv = ["worker", "--lane", lane, "--grace", "2"]
        specs.append((f"worker-{lane}", argv, LANE_POINTS[lane]))
    for lane in ("io", "slow", "human"):
        argv = ["worker", "--lane", lane, "--suspects-only", "--grace", "2"]
        specs.append((f"suspects-{lane}", argv, LANE_POINTS[lane]))
    specs += [(f"relay-{n}", ["relay"], RELAY_POINTS) for n in range(2)]
    specs += [(f"sweep-{n}", ["sweep"], SWEEP_POINTS) for n in range(2)]
    return [Proc(name, argv, points, log_dir / f"{name}.log") for name, argv, points in specs]


@dataclass
class Tally:
    actions: Counter[str] = field(default_factory=Counter)  # kill, term, stop, crash
    crash_hits: Counter[str] = field(default_factory=Counter)  # crash point -> deaths there
    # Armed, but the point was not reached within ARMED_SECONDS: started again without it.
    crash_missed: Counter[str] = field(default_factory=Counter)
    severed: int = 0  # database connections terminated by ``sever``
    unexpected_exits: list[str] = field(default_factory=list)


class Pool:
    """The processes, and what may be done to them. Used by one thread at a time (the
    driver while the chaos lasts, the test after it)."""

    def __init__(self, procs: list[Proc]) -> None:
        self.procs = procs
        self.tally = Tally()

    def start(self) -> None:
        for proc in self.procs:
            proc.start()

    def restart(self, proc: Proc, crash_at: str = "") -> None:
        proc.signal(signal.SIGKILL)
        proc.signal(signal.SIGCONT)
        proc.wait(timeout=30)
        self.reap(proc)
        proc.start(crash_at)

    def reap(self, proc: Proc) -> bool:
        """Note how a process that exited on its own ended; True if it had exited."""
        assert proc.popen is not None
        code = proc.popen.poll()
        if code is None:
            return False
        if code == CRASHED and proc.armed:
            self.tally.crash_hits[proc.armed] += 1
        elif code not in (0, -signal.SIGKILL, -signal.SIGTERM):
            self.tally.unexpected_exits.append(f"{proc.name} exited with {code}")
        return True

    def heal(self, now: float) -> None:
        """Continue what was stopped long enough; start again what died (at a crash point:
        without it now)."""
        for proc in self.procs:
            if proc.stopped_until and now >= proc.stopped_until:
                proc.signal(signal.SIGCONT)
                proc.stopped_until = 0.0
            if not proc.alive():
                self.reap(proc)
                proc.start()
            elif proc.armed and proc.up_for(now) > ARMED_SECONDS and not proc.stopped_until:
                self.tally.crash_missed[proc.armed] += 1
                self.restart(proc)

    def calm(self) -> None:
        """The end of the chaos: every process running, none stopped, none armed."""
        for proc in self.procs:
            if proc.armed or not proc.alive():
                self.restart(proc)
            elif proc.stopped_until:
                proc.signal(signal.SIGCONT)
                proc.stopped_until = 0.0

    def stop(self) -> None:
        for proc in self.procs:
            proc.signal(signal.SIGCONT)
            proc.signal(signal.SIGTERM)
        for proc in self.procs:
            if proc.popen is not None and proc.wait(timeout=30) is None:
                proc.signal(signal.SIGKILL)
                proc.wait(timeout=10)

    def exits_during_drain(self) -> list[str]:
        """Processes that died after the chaos stopped: nothing should kill them now."""
        dead = [p for p in self.procs if not p.alive()]
        for proc in dead:
            self.reap(proc)
            proc.start()
        return [f"{p.name} died after the chaos stopped (see {p.log_path})" for p in dead]

    def log_alarms(self) -> list[str]:
        found = []
        for proc in self.procs:
            text = proc.log_path.read_text(errors="replace") if proc.log_path.exists() else ""
            lines = [line for line in text.splitlines() if any(a in line for a in LOG_ALARMS)]
            if lines:
                first = min(text.find(a) for a in LOG_ALARMS if a in text)
                found.append(f"{proc.log_path}: {len(lines)} alarm line(s):\n"
                             f"{text[max(0, first - 300): first + 3000]}")  # fmt: skip
        return found


# The roles whose database connections ``sever`` cuts (their application_name, process_role.py).
SEVERED_ROLES = ("worker-io", "worker-slow", "worker-human", "worker-io-suspects", "relay",
                 "sweep")  # fmt: skip
SEVER = """
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
 WHERE datname = current_database() AND application_name = %(app)s AND pid <> pg_backend_pid()
"""


def sever(role: str) -> int:
    """Terminate every database connection of ``role``'s processes, whatever each is doing
    (a settle half sent, a LISTEN, a claim): the server's side of a crash or a failover."""
    with own_connection() as conn:
        row = conn.execute(SEVER, {"app": application_name(role)}).fetchone()
    return int(row[0]) if row else 0


class Driver(threading.Thread):
    """Every 0.5-3 s, one thing done to one process (or, ``sever``, to the database
    connections of one role's processes), chosen by a seeded random."""

    KINDS = ("kill", "term", "stop", "crash", "sever")

    def __init__(self, pool: Pool, rng: random.Random) -> None:
        super().__init__(name="chaos-driver", daemon=True)
        self.pool, self.rng = pool, rng
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.wait(self.rng.uniform(0.5, 3.0)):
                self.pool.heal(time.monotonic())
                self.strike()
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.error = exc

    def strike(self) -> None:
        now = time.monotonic()
        kind = self.rng.choice(self.KINDS)
        if kind == "sever":
            self.pool.tally.actions[kind] += 1
            self.pool.tally.severed += sever(self.rng.choice(SEVERED_ROLES))
            return
        ready = [p for p in self.pool.procs if p.alive() and not p.stopped_until
                 and not p.armed and p.up_for(now) > UP_SECONDS]  # fmt: skip
        if kind == "crash":  # a suspects-only worker seldom has work: it would not get there
            ready = [p for p in ready if not p.name.startswith("suspects")]
        if not ready:
            return
        proc = self.rng.choice(ready)
        self.pool.tally.actions[kind] += 1
        if kind == "kill":
            self.pool.restart(proc)
        elif kind == "term":
            proc.signal(signal.SIGTERM)
            if proc.wait(timeout=TERM_BOUND_SECONDS) is None:  # far past its grace: a hang
                proc.signal(signal.SIGABRT)  # its threads' stacks into its log (faulthandler)
                proc.wait(timeout=30)
                self.pool.tally.unexpected_exits.append(
                    f"{proc.name} did not stop within {TERM_BOUND_SECONDS:g} s of SIGTERM "
                    f"(its stacks are in {proc.log_path})"
                )
            self.pool.restart(proc)
        elif kind == "stop":
            proc.signal(signal.SIGSTOP)
            proc.stopped_until = time.monotonic() + self.rng.uniform(LEASE_SECONDS + 1, 8.0)
        else:
            self.pool.restart(proc, crash_at=self.rng.choice(proc.points))


# --- the load ---------------------------------------------------------------------------------


def draw_automations(count: int, draw_seed: int) -> list[tuple[Automation, list[dict[str, bool]]]]:
    """``count`` generated automations, each with two runs' inputs, drawn with ``draw_seed``
    (a @given that only collects: no example is run, nothing shrinks)."""
    drawn: list[tuple[Automation, list[dict[str, bool]]]] = []

    @seed(draw_seed)
    @settings(max_examples=count, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(automations(), st.lists(run_inputs(), min_size=2, max_size=2))
    def collect(automation: Automation, inputs: list[dict[str, bool]]) -> None:
        drawn.append((automation, inputs))

    collect()
    return drawn


def signal_first_definition() -> dict[str, Any]:
    """An effect, then a wait for a signal that was sent when the run started: the walk
    entering the wait takes the pending signal (or the sweep's late matching does)."""
    return {
        "start": "call",
        "steps": [
            {"id": "call", "type": "http", "connection": "api",
             "request": {"method": "POST", "url": "{{ input.api_url }}/items",
                         "body": {"run": "{{ run.id }}"}}, "next": "wait"},
            {"id": "wait", "type": "wait_signal", "signal": "sig.first",
             "correlation": "{{ input.key }}", "timeout": "1h",
             "next": {"received": "done", "timed_out": "late"}},
            {"id": "late", "type": "end", "status": "failed"},
            {"id": "done", "type": "end"},
        ],
    }  # fmt: skip


SAGA_FORWARD = ("reserve", "charge")  # compensated, latest first: refund, release


def saga_definition() -> dict[str, Any]:
    """Two effects that name their undo, then one that fails for good (a 404): the run must
    end ``compensated``, each compensation made once."""

    def post(step_id: str, path: str, **more: Any) -> dict[str, Any]:
        request = {"method": "POST", "url": "{{ vars.api_url }}" + path,
                   "body": {"run": "{{ run.id }}", "step": step_id}}  # fmt: skip
        return {"id": step_id, "type": "http", "connection": "api", "request": request, **more}

    return {
        "start": "setup",
        "steps": [
            {"id": "setup", "type": "set", "values": {"api_url": "{{ input.api_url }}"},
             "next": "reserve"},
            post("reserve", "/items", compensate="release", next="charge"),
            post("charge", "/items", compensate="refund", next="ship"),
            post("ship", "/nowhere", next="done"),
            {"id": "done", "type": "end"},
            post("release", "/items"),
            post("refund", "/items"),
        ],
    }  # fmt: skip


@dataclass
class Started:
    kind: str  # "generated" | "signal_first" | "saga"
    slug: str
    given: RunInput
    automation: Automation | None = None


def chaos_attempts(definition: dict[str, Any]) -> dict[str, Any]:
    """Every worker step allowed CHAOS_ATTEMPTS attempts, as the lanes are (CHAOS_ENV): a
    step type's own lower policy (a model step's 2) would otherwise fail a step caught in two
    of the chaos's kills, by design (a claim that never settled counts as an attempt)."""
    steps = []
    for step in definition["steps"]:
        step_type = registry.get(step["type"])
        if step_type is not None and step_type.lane != "inline" and "retry" not in step:
            step = {**step, "retry": {"max_attempts": CHAOS_ATTEMPTS}}
        steps.append(step)
    return {**definition, "steps": steps}


class Load:
    """Starts runs through the API and answers them as their automations say."""

    def __init__(self, harness: Harness, drawn: list[tuple[Automation, list[dict[str, bool]]]],
                 *, in_flight: int) -> None:  # fmt: skip
        self.harness = harness
        self.people = People()
        self.in_flight = in_flight
        self.runs: dict[int, Started] = {}
        self.live: set[int] = set()
        self.slugs = [harness.publish(chaos_attempts(a.definition)) for a, _ in drawn]
        self.signal_first = harness.publish(chaos_attempts(signal_first_definition()),
                                            slug="signal-first")  # fmt: skip
        self.saga = harness.publish(chaos_attempts(saga_definition()), slug="saga")
        self._plan = itertools.cycle(self._starts(drawn))
        self._numbers = itertools.count()

    def _starts(self, drawn: list[tuple[Automation, list[dict[str, bool]]]]
                ) -> Iterator[tuple[str, str, Automation | None, dict[str, bool]]]:  # fmt: skip
        for n, ((automation, inputs), slug) in enumerate(zip(drawn, self.slugs, strict=True)):
            for flags in inputs:
                yield "generated", slug, automation, flags
            if n % 3 == 0:
                yield "signal_first", self.signal_first, None, {}
            if n % 4 == 0:
                yield "saga", self.saga, None, {}

    def top_up(self) -> None:
        """Start runs until ``in_flight`` are unfinished."""
        self.live -= set(Run.objects.filter(pk__in=self.live, status__in=FINAL)
                         .values_list("pk", flat=True))  # fmt: skip
        while len(self.live) < self.in_flight:
            self.start_one()

    def start_one(self) -> int:
        kind, slug, automation, flags = next(self._plan)
        given = RunInput(key=f"chaos-{next(self._numbers)}", flags=flags)
        soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
        run_input = given.as_json(soon=soon, api_url=self.harness.stubs.provider.url)
        run_id = self.harness.start(slug, run_input, start_key=given.key)
        self.runs[run_id] = Started(kind, slug, given, automation)
        self.live.add(run_id)
        if automation is not None:
            self.people.automation_of[run_id] = automation
        if kind == "signal_first":  # sent before the run can wait for it
            self.harness.send_signal("sig.first", given.key, f"first/{run_id}", {"early": True})
        return run_id

    def answer(self) -> None:
        self.harness.drive_people_and_signals(self.live, self.people.script())


def run_chaos(pool: Pool, load: Load, *, seconds: float, rng: random.Random) -> Driver:
    """Chaos for ``seconds``, with runs in flight all along; then the driver stopped."""
    driver = Driver(pool, rng)
    driver.start()
    until = time.monotonic() + seconds
    try:
        while time.monotonic() < until and driver.is_alive():
            load.top_up()
            load.answer()
            time.sleep(0.2)
    finally:
        driver.halt.set()
        driver.join(timeout=120)
    if driver.error is not None:
        raise AssertionError(f"the chaos driver failed: {driver.error!r}") from driver.error
    return driver


# How long the drain may go without any run event before it is called stuck: long enough
# for a lapsed lease, an effect's lease (its timeout + margin) and a loaded machine.
STALL_SECONDS = 180.0


def drain(pool: Pool, load: Load) -> list[str]:
    """Until every run has finished or is parked for a person; the violations seen
    meanwhile (a process that died, a drain that stopped moving)."""
    pool.calm()
    problems: list[str] = []
    last_event, last_move = _last_event(), time.monotonic()
    while True:
        load.answer()
        problems += pool.exits_during_drain()
        unsettled = [r for r in load.runs if not _finished_or_parked(r)]
        if not unsettled:
            return problems
        event = _last_event()
        if event != last_event:
            last_event, last_move = event, time.monotonic()
        elif time.monotonic() - last_move > STALL_SECONDS:
            stuck = ", ".join(str(r) for r in unsettled[:20])
            return [*problems, f"the drain stopped moving ({STALL_SECONDS:g} s without a run "
                               f"event) with {len(unsettled)} runs unsettled: {stuck}"]  # fmt: skip
        time.sleep(0.3)


def _last_event() -> int:
    return RunEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def _finished_or_parked(run_id: int) -> bool:
    run = Run.objects.get(pk=run_id)
    return run.status in FINAL or bool(parked_reason(run_id))


def parked_reason(run_id: int) -> str:
    """Why a running run waits for a person: its effects in needs_review, when nothing else
    of it is live but a join waiting for their branches. '' when it is not parked so."""
    reviews = list(Effect.objects.filter(run_id=run_id, state="needs_review"))
    if not reviews:
        return ""
    held = {(e.step_id, e.iteration) for e in reviews}
    live = Step.objects.filter(run_id=run_id).exclude(status__in=("done", "failed", "cancelled"))
    if any((s.step_id, s.iteration) not in held and s.type != "join" for s in live):
        return ""
    return "; ".join(f"{e.step_id}/{e.iteration} ({e.provider}): {e.error}" for e in reviews)
