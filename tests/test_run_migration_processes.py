"""The proof of issue 30, part 1, on the real engine (`runengine --no-web` as processes) and the
real `manage.py migrate_runs` process: 3,000 runs waiting on version 3 (timers, signals,
approvals); version 4 published: new runs take it, the old finish on 3; a migration with a
removed step moves those it can and reports the rest, as its dry run said; killed mid-way and
resumed, it moves no run twice, and the moved runs finish on version 4 when woken."""

from __future__ import annotations

import signal
from collections import Counter
from typing import Any

import pytest
from django.db.models import Count

from workflows.models import Run, RunEvent, RunMigration, Step
from workflows.services.run_migration import dry_run
from workflows.services.runs import run_start

from .engine_harness import Harness
from .migration_setup import (
    KINDS,
    SLUG,
    live_steps,
    make_timers_due,
    plan_3_to_4,
    publish,
    run_input,
    version_of,
)
from .processes import exit_code, spawn, stop, wait_for

pytestmark = [pytest.mark.long_running, pytest.mark.django_db(transaction=True)]

RUNS = 3_000
SAMPLE = 10  # runs of each kind woken on each side of the migration
MIGRATE = ["--automation", SLUG, "--from", "3", "--to", "4", "--map", "cool=cooldown",
           "--map", "paid=payment", "--removed", "stay"]  # fmt: skip


def wake_and_finish(harness: Harness, run_ids: list[int]) -> dict[int, Run]:
    """Fire their timers, send their signals and approve their requests (through the API):
    each run ends."""
    make_timers_due(run_ids)
    return harness.wait_finished(run_ids, timeout=240)


def ended(finished: dict[int, Run]) -> Counter[tuple[str, Any, int]]:
    return Counter((run.status, run.output, version_of(run.pk)) for run in finished.values())


def test_three_thousand_waiting_runs_migrate_once_each_even_when_the_job_is_killed(
    harness: Harness, procs: list[Any]
) -> None:
    org = harness.org
    publish(org, 3)
    runs: dict[str, list[int]] = {kind: [] for kind in KINDS}
    for n in range(RUNS):
        kind = KINDS[n % len(KINDS)]
        started = run_start(org=org, automation_slug=SLUG, run_input=run_input(kind, n),
                            start_key=f"r{n}")  # fmt: skip
        runs[kind].append(started.run_id)
    every = [run_id for ids in runs.values() for run_id in ids]
    harness.wait_quiet(every, timeout=600)  # the approvals asked, every run parked
    assert Step.objects.filter(run_id__in=every, status="waiting").count() == RUNS

    # Version 4: new runs take it; the old ones, woken, finish on version 3.
    publish(org, 4)
    new = [run_start(org=org, automation_slug=SLUG, run_input=run_input(kind, RUNS + n),
                     start_key=f"new{n}").run_id
           for n, kind in enumerate(("cool", "paid", "review"))]  # fmt: skip
    assert {version_of(run_id) for run_id in new} == {4}
    old_sample = [run_id for ids in runs.values() for run_id in ids[:SAMPLE]]
    assert ended(wake_and_finish(harness, old_sample)) == {("succeeded", "v3", 3): 4 * SAMPLE}
    waiting = {kind: ids[SAMPLE:] for kind, ids in runs.items()}

    # The dry run: the removed step's runs stay, the rest would move.
    plan = plan_3_to_4(org)
    planned = dry_run(plan)
    left = RUNS - 4 * SAMPLE
    assert (planned.matched, planned.would_move) == (left, left * 3 // 4)
    assert planned.cannot["step_removed"]["runs"] == left // 4

    # The real command, killed once some runs moved (not after a sleep: when they have).
    migrating = spawn("migrate_runs", "--org", org.slug, *MIGRATE)
    procs.append(migrating)
    job = wait_for(lambda: RunMigration.objects.filter(org=org, moved__gte=200).first(),
                   timeout=600, what="200 runs moved")  # fmt: skip
    assert stop(migrating, signal.SIGKILL) == -signal.SIGKILL
    job.refresh_from_db()
    assert job.status == "running" and 200 <= job.moved < planned.would_move
    by_job = RunEvent.objects.filter(run__org=org, kind="run.migrated",
                                     detail__migration=job.pk)  # fmt: skip
    assert by_job.count() == job.moved  # the count grew with each move, in its transaction

    # Resumed by its id, it finishes, moving each run once.
    resumed = spawn("migrate_runs", "--org", org.slug, "--automation", SLUG,
                    "--resume", str(job.pk))  # fmt: skip
    procs.append(resumed)
    assert exit_code(resumed) == 0
    job.refresh_from_db()
    assert (job.status, job.moved) == ("finished", planned.would_move)
    assert job.report is not None and job.report["cannot"] == planned.as_json()["cannot"]
    per_run = by_job.values("run_id").annotate(n=Count("id"))
    assert Counter(row["n"] for row in per_run) == {1: planned.would_move}
    moved = waiting["cool"] + waiting["paid"] + waiting["review"]
    on_version = Counter(Run.objects.filter(pk__in=every).values_list("version__number",
                                                                      flat=True))  # fmt: skip
    assert on_version == {4: len(moved), 3: RUNS - len(moved)}
    assert not RunEvent.objects.filter(run_id__in=waiting["hold"], kind="run.migrated").exists()
    assert {live_steps(r)[0][0] for r in waiting["cool"]} == {"cooldown"}
    assert {live_steps(r)[0][0] for r in waiting["paid"]} == {"payment"}

    # Woken, the moved runs finish on version 4; the ones left behind, on version 3.
    woken = [run_id for kind in ("cool", "paid", "review") for run_id in waiting[kind][:SAMPLE]]
    assert ended(wake_and_finish(harness, woken)) == {("succeeded", "v4", 4): 3 * SAMPLE}
    stayed = waiting["hold"][:SAMPLE]
    assert ended(wake_and_finish(harness, stayed)) == {("succeeded", "v3", 3): SAMPLE}
