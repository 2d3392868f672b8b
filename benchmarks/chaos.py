"""The long form of the chaos run: rounds of random kills while a mix of automations runs.

    .venv/bin/python benchmarks/chaos.py [--minutes 10] [--rounds 10] [--seed N]

Each round runs ``tests/test_chaos.py`` once with ``--minutes`` of chaos (a fresh set of
engine processes and stub providers, in the tests' own database; a new seed each round
unless ``--seed`` is given, which fixes the first round's). It stops at the first round that
fails and prints that round's output: its seed and every violation are in it. At the end it
prints the totals: runs by kind and outcome, steps, effects, the driver's actions by kind,
the crash points hit, runs parked for a person, effects that went outcome_unknown and were
reconciled, and the violations.

Exit status: 0 when every round held, 1 when one failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/test_chaos.py"
SUMMED = ("runs", "parked", "actions", "crash_hits", "crash_missed")
COUNTED = ("steps", "effects", "outcome_unknown_seen", "model_repeats", "timers_fired",
           "signals_consumed", "decisions", "minutes", "severed")  # fmt: skip


def one_round(minutes: float, report: Path, seed: int | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WAYMARK_CHAOS_SECONDS": str(minutes * 60),
           "WAYMARK_CHAOS_REPORT": str(report)}  # fmt: skip
    if seed is not None:
        env["WAYMARK_CHAOS_SEED"] = str(seed)
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-s", "-p", "no:cacheprovider",
               "-p", "no:logging", TEST]  # fmt: skip
    return subprocess.run(  # noqa: S603 (our own interpreter, our own test)
        command, cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )


def totals(report: Path) -> tuple[dict[str, Counter[str]], Counter[str], list[str], list[int]]:
    summed: dict[str, Counter[str]] = {name: Counter() for name in SUMMED}
    counted: Counter[str] = Counter()
    violations: list[str] = []
    seeds: list[int] = []
    if report.exists():
        for line in report.read_text().splitlines():
            entry = json.loads(line)
            seeds.append(entry["seed"])
            for name in SUMMED:
                summed[name].update(entry.get(name, {}))
            counted.update({name: entry.get(name, 0) for name in COUNTED})
            violations += entry.get("violations", [])
    return summed, counted, violations, seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="chaos per round")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None, help="the first round's seed")
    args = parser.parse_args()
    report = Path(tempfile.mkdtemp(prefix="waymark-chaos-")) / "report.jsonl"
    began = time.monotonic()
    status = 0
    for number in range(1, args.rounds + 1):
        done = one_round(args.minutes, report, args.seed if number == 1 else None)
        verdict = "ok" if done.returncode == 0 else "FAILED"
        last = [line for line in done.stdout.splitlines() if line.startswith("chaos seed")]
        print(f"round {number}: {verdict}; {last[-1] if last else '(no summary)'}", flush=True)
        if done.returncode != 0:
            print(done.stdout[-20000:], done.stderr[-5000:], sep="\n")
            status = 1
            break
    summed, counted, violations, seeds = totals(report)
    print(f"\n{len(seeds)} round(s) of {args.minutes:g} min of chaos in "
          f"{(time.monotonic() - began) / 60:.1f} min (seeds {seeds}):")  # fmt: skip
    print(f"  runs {dict(summed['runs'])}; parked for a person {dict(summed['parked'])}")
    print(f"  steps entered {counted['steps']}, effects settled {counted['effects']}, "
          f"outcome_unknown reconciled {counted['outcome_unknown_seen']}, model repeats "
          f"{counted['model_repeats']}, timers fired {counted['timers_fired']}, signals "
          f"consumed {counted['signals_consumed']}, decisions {counted['decisions']}")  # fmt: skip
    print(f"  actions {dict(summed['actions'])}; database connections severed "
          f"{counted['severed']}")  # fmt: skip
    print(f"  crash points hit {dict(summed['crash_hits'])}; armed, not reached "
          f"{dict(summed['crash_missed'])}")  # fmt: skip
    print(f"  violations: {len(violations)}")
    for violation in violations[:50]:
        print(f"    {violation}")
    return status


if __name__ == "__main__":
    sys.exit(main())
