"""A provider that fails for a while, then recovers: how Waymark retries its effect calls,
with real engine processes, and how full jitter spreads the retries.

    .venv/bin/python benchmarks/retry_spread.py [--runs 200] [--fail-seconds 60] [--workers 1]
        [--backoff-base S] [--backoff-cap S] [--circuit-failures N] [--circuit-cooldown S]
        [--defer-seconds S] [--call-timeout S] [--max-attempts 30] [--timeout S]

A local provider stub (tests/stubs/provider.py, honouring Idempotency-Key) answers 503 to
every request for ``--fail-seconds`` from the moment the runs start, then creates items.
``--runs`` runs of a one-step automation (an http POST to the stub through a connection with
``idempotency_keys``) are started while a relay and ``--workers`` `manage.py worker --lane
io` processes run. No sweep is started: each worker promotes its lane's due retries once per
poll interval (the sweep is only the backstop for a lane without a free worker). Flags left
unset keep the project's defaults (waymark_config/settings.py: the io lane's backoff, EFFECTS).

When every run has ended it prints the provider's requests per 5 s (503s and answers), the
items created per idempotency key, the retry delays of `step.retry_scheduled` events by
attempt (full jitter: uniform over [0, min(cap, base * 2**(n-1))]), the deferrals (no attempt
spent: an open circuit, a probe under way, the concurrency cap), the circuit's openings (the
connection's row, sampled every 0.1 s: an opening is not an event), and how long after the
recovery the last run finished.

It uses its own database (bench_retry, emptied first) and asserts nothing, but exits 2 when
runs are still unfinished at ``--timeout``, and 1 when a run failed or the provider did not
create exactly one item per run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO

from common import ROOT, setup, start_runs

DATABASE = "bench_retry"
os.environ["WAYMARK_DB_NAME"] = DATABASE
setup(DATABASE, WAYMARK_EGRESS_ALLOWABLE="127.0.0.1/32")  # the local provider stub

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from effects.models import Connection  # noqa: E402
from tests.effect_setup import connect, one_step, post_item  # noqa: E402
from tests.stubs.base import Request, Response  # noqa: E402
from tests.stubs.provider import ProviderStub  # noqa: E402
from workflows.engine.lanes import lane_policy  # noqa: E402
from workflows.models import Organisation, Run, RunEvent  # noqa: E402
from workflows.services.automations import automation_publish_definition  # noqa: E402

BUCKET_SECONDS = 5
BAR_WIDTH = 50
SPARK = " ▁▂▃▄▅▆▇█"

# CLI flag -> the environment variable the engine processes read it from.
ENGINE_ENV = {
    "backoff_base": "WAYMARK_IO_BACKOFF_BASE_SECONDS",
    "backoff_cap": "WAYMARK_IO_BACKOFF_CAP_SECONDS",
    "circuit_failures": "WAYMARK_EFFECTS_CIRCUIT_FAILURES",
    "circuit_cooldown": "WAYMARK_EFFECTS_CIRCUIT_COOLDOWN_SECONDS",
    "defer_seconds": "WAYMARK_EFFECTS_DEFER_SECONDS",
}


class RecordingStub(ProviderStub):
    """The provider stub, also recording when it answered what (monotonic time, status)."""

    def __init__(self) -> None:
        super().__init__(idempotent=True)
        self.answers: list[tuple[float, int]] = []

    def dispatch(self, request: Request) -> Response | None:
        response = super().dispatch(request)
        with self._lock:
            self.answers.append((time.monotonic(), response.status if response else 0))
        return response


@dataclass
class CircuitSampler:
    """Samples the connection's circuit every 0.1 s from a thread (an opening is no event).

    An opening: the circuit is open, and was not at the last sample, or was open until a
    time that has passed since (a probe failed between two samples). A later circuit_until
    otherwise: a failure of a call that was already in flight pushed the cool-down back."""

    connection_id: int
    started: float
    opened_at: list[float] = field(default_factory=list)
    pushed_back: int = 0
    closed_at: list[float] = field(default_factory=list)  # back to closed after not closed
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        last: tuple[str, datetime | None] = ("closed", None)
        try:
            while not self.stop.wait(0.1):
                state, until = Connection.objects.filter(pk=self.connection_id).values_list(
                    "circuit", "circuit_until"
                )[0]
                self.sample(time.monotonic() - self.started, last, state, until)
                last = (state, until)
        finally:
            connection.close()

    def sample(
        self, at: float, last: tuple[str, datetime | None], state: str, until: datetime | None
    ) -> None:
        was, was_until = last
        if state == "open":
            lapsed = was_until is not None and was_until <= timezone.now()
            if was != "open" or (until != was_until and lapsed):
                self.opened_at.append(at)
            elif until != was_until:
                self.pushed_back += 1
        if state == "closed" and was != "closed":
            self.closed_at.append(at)


# --- setting up ---------------------------------------------------------------------------------


def reset() -> None:
    """Empty the run and effect tables: a leftover run would call an old stub's port."""
    if connection.settings_dict["NAME"] != DATABASE:
        raise SystemExit(f"refusing to empty a database not called {DATABASE}")
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE workflows_runevent, workflows_step, workflows_outbox, effects_effect, "
            "workflows_run CASCADE"
        )


def prepare(args: argparse.Namespace, stub: RecordingStub) -> tuple[Organisation, Connection]:
    org, _ = Organisation.objects.get_or_create(slug="retry", defaults={"name": "retry"})
    Connection.objects.filter(org=org).delete()  # a fresh circuit, no failures counted
    extra = {} if args.call_timeout is None else {"timeout_seconds": args.call_timeout}
    conn = connect(
        org,
        base_url=stub.url,
        options={"idempotency_keys": True},
        max_concurrency=args.max_concurrency,
        **extra,
    )
    definition = one_step(post_item(stub.url), retry=args.max_attempts)
    automation_publish_definition(org=org, slug="retry", definition=definition)
    return org, conn


def engine_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    for flag, name in ENGINE_ENV.items():
        value = getattr(args, flag)
        if value is not None:
            env[name] = str(value)
    return env


def start_engine(args: argparse.Namespace, log: IO[bytes]) -> list[subprocess.Popen[bytes]]:
    roles = [["relay"]] + [["worker", "--lane", "io"]] * args.workers
    return [
        subprocess.Popen(  # noqa: S603
            [sys.executable, "manage.py", *role],
            cwd=ROOT,
            env=engine_env(args),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for role in roles
    ]


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=30)


def wait_ended(ids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Run.objects.filter(pk__in=ids, status="running").exists():
            return True
        time.sleep(0.2)
    return False


# --- reporting ----------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    return (
        f"min {ordered[0]:.2f}, median {statistics.median(ordered):.2f}, "
        f"p90 {pct(ordered, 0.9):.2f}, max {ordered[-1]:.2f}"
    )


def bar(parts: list[tuple[int, str]], scale: float) -> str:
    return "".join(char * (max(1, round(n * scale)) if n else 0) for n, char in parts)


def print_requests(stub: RecordingStub, started: float, fail_seconds: float) -> None:
    buckets: dict[int, Counter[str]] = defaultdict(Counter)
    for at, status in stub.answers:
        buckets[int((at - started) // BUCKET_SECONDS)]["x" if status >= 500 else "o"] += 1
    statuses = Counter(status for _, status in stub.answers)
    print(
        f"\nprovider requests per {BUCKET_SECONDS} s since the runs started "
        f"(x = 503, o = answered otherwise; statuses {dict(sorted(statuses.items()))}):"
    )
    if not buckets:
        return
    scale = BAR_WIDTH / max(sum(c.values()) for c in buckets.values())
    for b in range(max(buckets) + 1):
        count = buckets[b]
        low = b * BUCKET_SECONDS
        mark = "  <- recovery" if low <= fail_seconds < low + BUCKET_SECONDS else ""
        print(
            f"  {low:4d}-{low + BUCKET_SECONDS:<4d}s  503 {count['x']:4d}  ok {count['o']:4d} "
            f"|{bar([(count['x'], 'x'), (count['o'], 'o')], scale)}{mark}"
        )


def print_keys(stub: RecordingStub, runs: int) -> None:
    keys = Counter(item["key"] for item in stub.created)
    duplicates = {key: n for key, n in keys.items() if n > 1}
    print(
        f"\nitems created: {len(stub.created)} for {runs} runs; distinct idempotency keys "
        f"{len(keys)}; keys with more than one item: {len(duplicates)} {duplicates or ''}"
    )


def retry_delays(ids: list[int]) -> tuple[dict[int, list[float]], Counter[int]]:
    """Delays of step.retry_scheduled events by attempt number n (the run's n-th retry: the
    n-th failed attempt; deferrals are step.deferred and spend no attempt), and how many
    runs spent how many attempts."""
    by_attempt: dict[int, list[float]] = defaultdict(list)
    seen: Counter[int] = Counter({run_id: 0 for run_id in ids})
    events = RunEvent.objects.filter(run_id__in=ids, kind="step.retry_scheduled").order_by("id")
    for run_id, detail in events.values_list("run_id", "detail"):
        seen[run_id] += 1
        by_attempt[seen[run_id]].append(float((detail or {})["delay_seconds"]))
    return by_attempt, Counter(retries + 1 for retries in seen.values())


def spark(delays: list[float], ceiling: float, bins: int = 10) -> str:
    counts = [0] * bins
    for delay in delays:
        counts[min(bins - 1, int(delay / ceiling * bins))] += 1
    top = max(counts)
    return "".join(SPARK[round(c / top * (len(SPARK) - 1))] for c in counts)


def print_retries(ids: list[int], base: float, cap: float) -> None:
    by_attempt, attempts = retry_delays(ids)
    delays = [d for values in by_attempt.values() for d in values]
    print(
        f"\nretries (step.retry_scheduled): {len(delays)}"
        + (f"; delay seconds {spread(delays)}" if delays else "")
    )
    print(f"runs by attempts spent: {dict(sorted(attempts.items()))}")
    if not delays:
        return
    print(
        f"by attempt n (full jitter over [0, min({cap:g}, {base:g} * 2**(n-1))]; "
        "spread: 10 equal bins from 0 to the ceiling):"
    )
    over, share = 0, [0] * 10
    for n in sorted(by_attempt):
        values, ceiling = by_attempt[n], min(cap, base * 2 ** (n - 1))
        over += sum(1 for d in values if d > ceiling + 0.001)
        for d in values:
            share[min(9, int(d / ceiling * 10))] += 1
        print(
            f"  n={n:<3d} retries {len(values):4d}  ceiling {ceiling:6.2f}  "
            f"{spread(values)}  |{spark(values, ceiling)}|"
        )
    print("all retries, delay / ceiling (uniform: about 10 % in each tenth):")
    for tenth, count in enumerate(share):
        print(
            f"  {tenth / 10:.1f}-{(tenth + 1) / 10:.1f} {count:5d} "
            f"{count / len(delays):5.1%} |{'#' * round(count / max(share) * BAR_WIDTH)}"
        )
    print(f"delays above their ceiling: {over}")


def reason_of(error: str) -> str:
    for needle, name in (
        ("is open", "circuit open"),
        ("being probed", "circuit probe under way"),
        ("concurrency cap", "concurrency cap"),
        ("in flight", "effect in flight"),
        ("was taken", "effect taken"),
    ):
        if needle in error:
            return name
    return error[:60]


def seconds(moments: list[float]) -> str:
    return ", ".join(f"{t:.1f}" for t in moments) or "-"


def print_deferrals(ids: list[int], sampler: CircuitSampler) -> None:
    events = RunEvent.objects.filter(run_id__in=ids, kind="step.deferred")
    details = [detail or {} for detail in events.values_list("detail", flat=True)]
    reasons = Counter(reason_of(detail["error"]) for detail in details)
    print(f"\ndeferrals (step.deferred, no attempt spent): {len(details)} {dict(reasons)}")
    if details:
        print(f"  deferred for seconds: {spread([d['delay_seconds'] for d in details])}")
    print(
        f"circuit (sampled every 0.1 s): opened {len(sampler.opened_at)} times, at s "
        f"{seconds(sampler.opened_at)}; cool-down pushed back {sampler.pushed_back} times by "
        f"calls already in flight; closed again at s {seconds(sampler.closed_at)}"
    )
    kinds = Counter(
        RunEvent.objects.filter(run_id__in=ids, kind__startswith="effect.").values_list(
            "kind", flat=True
        )
    )
    print(f"effect events: {dict(sorted(kinds.items()))}")


def print_recovery(
    ids: list[int], started_wall: float, fail_seconds: float, stub: RecordingStub, started: float
) -> None:
    recovered = started_wall + fail_seconds
    finished = sorted(
        at.timestamp() - recovered
        for at in Run.objects.filter(pk__in=ids).values_list("finished_at", flat=True)
        if at is not None
    )
    oks = [at - started - fail_seconds for at, status in stub.answers if status < 300]
    print(
        f"\nrecovery at {fail_seconds:g} s; first answered request {min(oks, default=0):+.1f} s"
        f" after it, last {max(oks, default=0):+.1f} s"
    )
    if finished:
        print(
            f"runs finished after the recovery, s: p50 {pct(finished, 0.5):+.1f}, "
            f"p90 {pct(finished, 0.9):+.1f}, last {finished[-1]:+.1f} "
            f"({len(finished)} of {len(ids)} runs ended)"
        )


def print_log(path: str) -> None:
    """Where the engine processes' output went (WARNING and above), and its last lines."""
    with open(path, encoding="utf-8", errors="replace") as log:
        lines = log.read().splitlines()
    print(f"engine log: {path} ({len(lines)} lines)")
    for line in lines[-20:]:
        print(f"  | {line}")


def verdict(ids: list[int], stub: RecordingStub, ended: bool, runs: int) -> int:
    statuses = Counter(Run.objects.filter(pk__in=ids).values_list("status", flat=True))
    keys = {item["key"] for item in stub.created}
    print(f"\nruns: {dict(statuses)}")
    if not ended:
        print("NOT FINISHED: runs still running at the timeout")
        return 2
    if statuses.get("succeeded", 0) != runs or len(stub.created) != runs or len(keys) != runs:
        print("FAILED: a run did not succeed, or the provider has not exactly one item per run")
        return 1
    return 0


# --- the benchmark -----------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--fail-seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=1, help="io worker processes")
    parser.add_argument("--max-attempts", type=int, default=30, help="the step's retry")
    parser.add_argument("--max-concurrency", type=int, default=1000, help="the connection's")
    parser.add_argument(
        "--call-timeout",
        type=float,
        default=None,
        help="the connection's timeout_seconds (default: the model's, 30)",
    )
    parser.add_argument("--backoff-base", type=float, default=None)
    parser.add_argument("--backoff-cap", type=float, default=None)
    parser.add_argument("--circuit-failures", type=int, default=None)
    parser.add_argument("--circuit-cooldown", type=float, default=None)
    parser.add_argument("--defer-seconds", type=float, default=None)
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for every run (default: 3 * fail + 300)",
    )
    return parser.parse_args()


def settings_line(args: argparse.Namespace) -> tuple[float, float]:
    """Print what the engine runs with (a flag, else the project's setting); return the
    backoff's base and cap."""
    policy = lane_policy("io")

    def chosen(flag: str, default: float) -> float:
        value = getattr(args, flag)
        return float(default if value is None else value)

    base = chosen("backoff_base", policy.backoff_base_seconds)
    cap = chosen("backoff_cap", policy.backoff_cap_seconds)
    effects = settings.EFFECTS
    print(
        f"{args.runs} runs, provider failing for {args.fail_seconds:g} s, {args.workers} io "
        f"worker(s); max attempts {args.max_attempts}; backoff base {base:g} s, cap {cap:g} s; "
        f"circuit opens after {chosen('circuit_failures', effects['CIRCUIT_FAILURES']):g} "
        f"failures for {chosen('circuit_cooldown', effects['CIRCUIT_COOLDOWN_SECONDS']):g} s; "
        f"defer {chosen('defer_seconds', effects['DEFER_SECONDS']):g} s"
    )
    return base, cap


def main() -> None:
    args = parse()
    reset()
    base, cap = settings_line(args)
    log = tempfile.NamedTemporaryFile(prefix="retry_spread-", suffix=".log", delete=False)  # noqa: SIM115
    with RecordingStub() as stub:
        org, conn = prepare(args, stub)
        processes = start_engine(args, log)
        time.sleep(3)  # let them start
        started, started_wall = time.monotonic(), time.time()
        stub.fail_for(args.fail_seconds, status=503)
        sampler = CircuitSampler(conn.pk, started)
        sampling = threading.Thread(target=sampler.run, daemon=True)
        sampling.start()
        try:
            ids = start_runs(org, "retry", args.runs, f"r{int(started_wall)}", 4)
            ended = wait_ended(ids, args.timeout or 3 * args.fail_seconds + 300)
        finally:
            sampler.stop.set()
            sampling.join()
            stop(processes)
        print_log(log.name)
        print_requests(stub, started, args.fail_seconds)
        print_keys(stub, args.runs)
        print_retries(ids, base, cap)
        print_deferrals(ids, sampler)
        print_recovery(ids, started_wall, args.fail_seconds, stub, started)
        code = verdict(ids, stub, ended, args.runs)
    sys.exit(code)


if __name__ == "__main__":
    main()
