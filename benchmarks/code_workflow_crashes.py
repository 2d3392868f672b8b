"""The long form of tests/test_code_workflow_crashes.py: a code workflow killed at every crash
point its runs reach, not only the suite's subset.

    .venv/bin/python benchmarks/code_workflow_crashes.py [pytest args, e.g. -x]

Runs the test file with ``WAYMARK_CRASH_MATRIX=all`` (each point: fresh engine processes
that die there, fresh ones that take over, the runs driven to their end) and prints how long
each point took and the whole. Exit status: pytest's (0 when every point held).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/test_code_workflow_crashes.py"
TIMED = re.compile(r"^([\d.]+)s call\s+\S+\[(.+)\]$")


def main(extra: list[str]) -> int:
    env = {**os.environ, "WAYMARK_CRASH_MATRIX": "all"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--durations=0", TEST, *extra]  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(  # noqa: S603 (our own interpreter, our own test)
        command, cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    took = time.monotonic() - began
    print(done.stdout[-20000:], done.stderr[-4000:], sep="\n")
    points = [TIMED.match(line.strip()) for line in done.stdout.splitlines()]
    for match in filter(None, points):
        print(f"{match.group(2):32} {float(match.group(1)):7.1f} s")
    print(f"{'the whole file':32} {took:7.1f} s (exit {done.returncode})")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
