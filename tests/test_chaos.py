"""The chaos run, short form: two minutes of random kills, stops and crash points while a mix
of automations runs, then the drain and every invariant (tests/chaos.py;
docs/explanation/how-the-guarantees-are-tested.md, "Chaos runs"). ``benchmarks/chaos.py`` runs the
long form.

``WAYMARK_CHAOS_SECONDS`` sets how long the chaos lasts (120), ``WAYMARK_CHAOS_SEED`` its
seed (random, printed), ``WAYMARK_CHAOS_REPORT`` a file where it appends what it did and
found (one JSON line), ``WAYMARK_CHAOS_FLOOR`` the progress floor in runs finished well per
minute (2).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from effects.models import Connection
from workflows.models import Organisation

from .chaos import (
    CALL_TIMEOUT_SECONDS,
    Load,
    Pool,
    Tally,
    drain,
    draw_automations,
    roles,
    run_chaos,
)
from .chaos_checks import Report, check
from .engine_harness import Engine, make_harness, stub_servers

pytestmark = [pytest.mark.long_running, pytest.mark.django_db(transaction=True)]

SECONDS = float(os.environ.get("WAYMARK_CHAOS_SECONDS", "120"))
FLOOR = float(os.environ.get("WAYMARK_CHAOS_FLOOR", "2"))
IN_FLIGHT = 24  # runs kept unfinished while the chaos lasts
AUTOMATIONS = 30  # drawn up front; started again and again in turn


def test_chaos_breaks_no_invariant(org: Organisation, tmp_path: Path) -> None:
    chosen = int(os.environ.get("WAYMARK_CHAOS_SEED") or random.randrange(2**32))
    print(f"chaos seed {chosen} (WAYMARK_CHAOS_SEED={chosen} replays its choices)")
    rng = random.Random(chosen)
    pool = Pool(roles(tmp_path))
    began = time.monotonic()
    with stub_servers() as stubs:
        harness = make_harness(org, stubs, Engine(tmp_path / "unused.log"))
        # Short calls: the lease of an effect whose answer was lost lapses soon.
        Connection.objects.filter(org=org).update(timeout_seconds=CALL_TIMEOUT_SECONDS)
        load = Load(harness, draw_automations(AUTOMATIONS, chosen), in_flight=IN_FLIGHT)
        pool.start()
        try:
            run_chaos(pool, load, seconds=SECONDS, rng=rng)
            problems = drain(pool, load)
            minutes = (time.monotonic() - began) / 60
            report = check(load, pool, minutes=minutes, floor=FLOOR)
            report.violations[:0] = problems
        finally:
            pool.stop()
    print(summary(chosen, report, pool.tally, minutes))
    record(chosen, report, pool.tally, minutes)
    assert not report.violations, "\n".join([f"seed {chosen}", *report.violations[:50]])


def summary(chosen: int, report: Report, tally: Tally, minutes: float) -> str:
    return (f"chaos seed {chosen}: {minutes:.1f} min, runs {dict(report.runs)}, "
            f"steps {report.steps}, effects {report.effects}, actions {dict(tally.actions)}, "
            f"database connections severed {tally.severed}, "
            f"crash points hit {dict(tally.crash_hits)} (armed, not reached: "
            f"{dict(tally.crash_missed)}), parked {dict(report.parked)}, "
            f"outcome_unknown {report.outcome_unknown_seen}, "
            f"violations {len(report.violations)}; parked: {report.parked_why}")  # fmt: skip


def record(chosen: int, report: Report, tally: Tally, minutes: float) -> None:
    path = os.environ.get("WAYMARK_CHAOS_REPORT")
    if not path:
        return
    # Not dataclasses.asdict: it rebuilds a Counter from its items, counting the pairs.
    found = {name: dict(value) if isinstance(value, dict) else value
             for name, value in vars(report).items()}  # fmt: skip
    line = {"seed": chosen, "minutes": round(minutes, 2), **found,
            "actions": dict(tally.actions), "crash_hits": dict(tally.crash_hits),
            "crash_missed": dict(tally.crash_missed), "severed": tally.severed}  # fmt: skip
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")
