"""The long form of the generated-automations test: as many drawn automations as time allows.

    .venv/bin/python benchmarks/generated_automations.py [--minutes 30] [--chunk 40] [--twin]

It runs ``tests/test_generated_automations.py`` again and again (each pass draws ``--chunk``
new automations with a fresh random seed, on a fresh ``runengine`` and stub providers, in the
tests' own database) until ``--minutes`` have passed, then prints how many automations, runs,
steps entered and effects it checked, and which step types they used. It stops at the first
pass that fails and prints that pass's output: Hypothesis's shrunk definition is in it.

With ``--twin`` it runs ``tests/test_generated_twins.py`` instead: each automation is also
written as a code workflow (generated Python, registered by the engine's processes), both run
on the same inputs and processes, and they must make the same effects, enter the same steps
and end the same. A pass there starts an engine per batch of up to 8 automations.

Exit status: 0 when every pass held, 1 when one failed.
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
TESTS = {False: "tests/test_generated_automations.py", True: "tests/test_generated_twins.py"}


def one_pass(test: str, chunk: int, report: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WAYMARK_GENERATED_EXAMPLES": str(chunk),
           "WAYMARK_GENERATED_REPORT": str(report)}  # fmt: skip
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test]
    return subprocess.run(  # noqa: S603 (our own interpreter, our own test)
        command, cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )


def totals(report: Path) -> tuple[Counter[str], Counter[str]]:
    counts: Counter[str] = Counter()
    types: Counter[str] = Counter()
    if report.exists():
        for line in report.read_text().splitlines():
            entry = json.loads(line)
            types.update(entry.pop("step_types"))
            counts.update({k: v for k, v in entry.items() if isinstance(v, int | float)})
    return counts, types


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--chunk", type=int, default=40, help="automations per pass")
    twin = "each automation against its code twin (tests/test_generated_twins.py)"
    parser.add_argument("--twin", action="store_true", help=twin)
    args = parser.parse_args()
    report = Path(tempfile.mkdtemp(prefix="waymark-generated-")) / "report.jsonl"
    began = time.monotonic()
    passes = 0
    status = 0
    while time.monotonic() - began < args.minutes * 60:
        done = one_pass(TESTS[args.twin], args.chunk, report)
        passes += 1
        counts, _ = totals(report)
        verdict = "ok" if done.returncode == 0 else "FAILED"
        print(f"pass {passes}: {verdict}; so far {counts['automations']} automations, "
              f"{counts['runs']} runs", flush=True)  # fmt: skip
        if done.returncode != 0:
            print(done.stdout[-20000:], done.stderr[-5000:], sep="\n")
            status = 1
            break
    counts, types = totals(report)
    minutes = (time.monotonic() - began) / 60
    what = "made alike by each pair of twins" if args.twin else "checked once each"
    print(f"\n{passes} passes in {minutes:.1f} min: {counts['automations']} automations, "
          f"{counts['runs']} runs, {counts['steps']} steps entered, {counts['effects']} "
          f"effects {what}; {'a violation' if status else 'no violation'}")  # fmt: skip
    if args.twin:
        print(f"engines started (one per batch): {counts['engines']}")
    print("step types drawn:", ", ".join(f"{name} {n}" for name, n in types.most_common()))
    return status


if __name__ == "__main__":
    sys.exit(main())
