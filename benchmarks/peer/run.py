"""The peer benchmark: Waymark and DBOS Transact on the same work, alternated, in one run.

    .venv/bin/python benchmarks/peer/run.py                 # 2 rounds, 1,000 runs per work
    .venv/bin/python benchmarks/peer/run.py --rounds 3 --runs 300 --sleepers 300
    .venv/bin/python benchmarks/peer/run.py --rounds 4 --works "chain-3 drain,code-3 drain"

The first call creates the peer's virtual environment (.data/peerbench/venv, or
$PEERBENCH_VENV) and installs requirements.txt into it from PyPI (DBOS, pinned; again only
when the file changes). Each round runs waymark_side.py, then dbos_side.py, each on a fresh
embedded PostgreSQL 18 of its own (the same wheel, default settings, fsync on, unix
socket), so the two meet the same disk at the same hour. The work (see each side's
docstring): 3-step and 10-step runs of no-op steps, drained and end to end; one run at a
time; durable sleeps of 2 s (lateness); starts with 10 % duplicate keys. Both sides also
measure the server's commit limit (single-row UPDATE commits per second, 1 and 8
connections) and their commits per step, so a ratio can be read against what the machine
allows.

``--works`` measures only the works named (machine.WORKS), in that order on Waymark's side
in odd rounds and in the reverse order in even ones. ``code-3 drain`` and ``code-run-3
drain`` are the chain-3 work as a code workflow (peer_code.py), ``code-10 drain`` the
chain-10 work, on Waymark's side only: their ratios are printed against Waymark's same work
as a definition (measured in the same rounds) and against the peer's.

Prints, per work, the median of the rounds on each side and the ratio (how many times
Waymark's rate, or the peer's latency over Waymark's), with the load average before each
side started; writes every figure to .data/peerbench/results-<time>.json. Read ratios only
from a quiet machine (load under 1): beside other work they swing by a factor of two. It
asserts nothing, but exits non-zero when a side fails or a run does not succeed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORK = Path(os.environ.get("PEERBENCH_DIR", ROOT / ".data" / "peerbench"))
VENV = Path(os.environ.get("PEERBENCH_VENV", WORK / "venv"))

# work -> (figure, True when higher is better)
FIGURES = {
    "chain-3 drain": ("steps_per_s", True),
    "chain-3 e2e": ("steps_per_s", True),
    "chain-10 drain": ("steps_per_s", True),
    "chain-10 e2e": ("steps_per_s", True),
    "serial chain-3": ("p50_ms", False),
    "serial code-3": ("p50_ms", False),
    "sleep 2s": ("late_p99_ms", False),
    "starts, 10% duplicate keys": ("starts_per_s", True),
}
# A work of Waymark's side only, read against the peer's work of the same kind (the peer's
# chain-3 is code already)
PEER_WORK = {"serial code-3": "serial chain-3"}
# Waymark's side only (peer_code.py), each against the same work as a definition
CODE_WORKS = {
    "code-3 drain": "chain-3 drain",
    "code-run-3 drain": "chain-3 drain",
    "code-10 drain": "chain-10 drain",
}


def peer_python() -> Path:
    """The peer's interpreter, its venv made (or brought up to requirements.txt) first."""
    python = VENV / "bin" / "python"
    requirements = HERE / "requirements.txt"
    stamp = VENV / "requirements.sha256"
    wanted = hashlib.sha256(requirements.read_bytes()).hexdigest()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)  # noqa: S603
    if not stamp.exists() or stamp.read_text() != wanted:
        subprocess.run(  # noqa: S603
            [str(python), "-m", "pip", "install", "-q", "-r", str(requirements)],
            check=True,
        )
        stamp.write_text(wanted)
    return python


def side(
    python: Path, script: str, data: Path, args: argparse.Namespace, works: list[str]
) -> dict[str, Any]:
    command = [
        str(python),
        str(HERE / script),
        "--data",
        str(data),
        "--runs",
        str(args.runs),
        "--serial",
        str(args.serial),
        "--sleepers",
        str(args.sleepers),
        "--works",
        ",".join(works),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"{script} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median(rounds: list[dict[str, Any]], work: str, figure: str) -> float:
    values = [row[figure] for result in rounds for row in result["rows"] if row["work"] == work]
    return round(statistics.median(values), 2) if values else float("nan")


def measured(rounds: list[dict[str, Any]], work: str) -> bool:
    return any(row["work"] == work for result in rounds for row in result["rows"])


def report_code(waymark: list[dict[str, Any]], dbos: list[dict[str, Any]]) -> None:
    """The code works against the same work as a definition, round by round (each pair
    measured one after the other on one server, under the load shown), and their medians
    against the peer's chain-3."""
    for work, same in CODE_WORKS.items():
        if not measured(waymark, work):
            continue
        print(f"\n{work} against {same} (Waymark), per round:")
        for number, result in enumerate(waymark, 1):
            rows = {row["work"]: row for row in result["rows"]}
            code, chain = rows.get(work), rows.get(same)
            if code is None or chain is None:
                continue
            print(
                f"  round {number}: code {code['steps_per_s']} steps/s (load "
                f"{code['load_before']}), definition {chain['steps_per_s']} (load "
                f"{chain['load_before']}): {code['steps_per_s'] / chain['steps_per_s']:.2f}x;"
                f" CPU a step {_cpu(code)} against {_cpu(chain)} us:"
                f" {_cpu(chain) / _cpu(code):.2f}x"
            )
        ours, chain = median(waymark, work, "steps_per_s"), median(waymark, same, "steps_per_s")
        theirs = median(dbos, same, "steps_per_s") if dbos else float("nan")
        print(
            f"  median: {ours} steps/s; {ours / chain:.2f}x the definition ({chain}); "
            f"{ours / theirs:.1f}x DBOS {same} ({theirs})"
        )
        cpu, cpu_chain = median(waymark, work, "cpu_us_per_step"), median(
            waymark, same, "cpu_us_per_step")  # fmt: skip
        print(
            f"  the machine's CPU a step (every process, the server's too), median: {cpu} us"
            f" against {cpu_chain}: {cpu_chain / cpu:.2f}x the definition's cost"
        )


def _cpu(row: dict[str, Any]) -> float:
    return float(row.get("cpu_us_per_step", float("nan")))


def report(results: dict[str, list[dict[str, Any]]]) -> int:
    waymark, dbos = results["waymark"], results["dbos"]
    print(f"\n{'work':28} {'figure':14} {'Waymark':>10} {'DBOS':>10} {'ratio':>7}")
    for work, (figure, higher_better) in FIGURES.items():
        peer_work = PEER_WORK.get(work, work)
        if not measured(waymark, work) or not measured(dbos, peer_work):
            continue
        extra = ("p90_ms", "p99_ms", "max_ms") if work.startswith("serial") else ()
        for name in (figure, *extra):
            ours, theirs = median(waymark, work, name), median(dbos, peer_work, name)
            ratio = ours / theirs if higher_better else theirs / max(ours, 0.01)
            print(f"{work:28} {name:14} {ours:>10} {theirs:>10} {ratio:>6.2f}x")
    report_code(waymark, dbos)
    for work in ("chain-3 drain", "chain-10 drain", *CODE_WORKS):
        if not measured(waymark, work):
            continue
        print(
            f"{work:28} {'commits/step':14} {median(waymark, work, 'commits_per_step'):>10}"
            f" {median(dbos, work, 'commits_per_step'):>10}"
        )
        print(
            f"{work:28} {'CPU us/step':14} {median(waymark, work, 'cpu_us_per_step'):>10}"
            f" {median(dbos, work, 'cpu_us_per_step'):>10}"
        )
    if not dbos:
        return _failures(waymark)
    for name in ("commit_limit_1", "commit_limit_8"):
        ours = statistics.median(r[name] for r in waymark)
        theirs = statistics.median(r[name] for r in dbos)
        print(
            f"{'server commit limit':28} {name[-1] + ' conn commits/s':14} {ours:>10} {theirs:>10}"
        )
    loads = [(w["load_before"], d["load_before"]) for w, d in zip(waymark, dbos, strict=True)]
    print(f"load average before each side (Waymark, DBOS) per round: {loads}")
    return _failures([*waymark, *dbos])


def _failures(results: list[dict[str, Any]]) -> int:
    failed = [
        (r["engine"], row["work"])
        for result in results
        for r in [result]
        for row in result["rows"]
        if row.get("not_succeeded")
    ]
    duplicates = [
        r["engine"]
        for r in results
        for row in r["rows"]
        if "runs_made" in row and row["runs_made"] != row["distinct_ids"]
    ]
    if failed or duplicates:
        print(f"NOT SUCCEEDED: {failed}; duplicates that made runs: {duplicates}")
        return 1
    return 0


def measured_commit() -> str:
    """The commit measured, read before the first pass, with "-dirty" when the checkout has
    changes not committed (the figures are then not that commit's)."""
    return subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=7"],  # noqa: S607
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=1000, help="runs per chain work and starts")
    parser.add_argument("--serial", type=int, default=200, help="runs one at a time")
    parser.add_argument("--sleepers", type=int, default=1000, help="runs of one 2 s sleep")
    parser.add_argument("--works", default="", help="only these works, comma-separated")
    parser.add_argument("--no-peer", action="store_true", help="Waymark's side only")
    args = parser.parse_args()
    commit = measured_commit()
    works = [w.strip() for w in args.works.split(",") if w.strip()]
    python = Path(sys.executable) if args.no_peer else peer_python()
    results: dict[str, list[dict[str, Any]]] = {"waymark": [], "dbos": []}
    for number in range(1, args.rounds + 1):
        for engine, interpreter in (("waymark", Path(sys.executable)), ("dbos", python)):
            ordered = works if number % 2 or engine == "dbos" else works[::-1]
            if engine == "dbos":
                if args.no_peer:
                    continue
                ordered = [w for w in works if w not in CODE_WORKS and w not in PEER_WORK]
                if works and not ordered:
                    continue
            print(f"round {number}: {engine} …", file=sys.stderr, flush=True)
            results[engine].append(
                side(interpreter, f"{engine}_side.py", WORK / f"pg_{engine}", args, ordered)
            )
    path = WORK / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"commit": commit, "args": vars(args), **results}, indent=2))
    print(f"Waymark {commit}; {args.rounds} rounds, alternated; figures: {path}")
    raise SystemExit(report(results))


if __name__ == "__main__":
    main()
