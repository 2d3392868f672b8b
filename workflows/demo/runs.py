"""Start a few demo runs and print their progress, for ``./waymark run``."""

from __future__ import annotations

import time
import uuid
from typing import Any, TextIO

from django.db import connection

from ..models import Organisation, Run
from ..services.runs import run_start
from .bootstrap import DEMO_AUTOMATION, DEMO_ORG

NAMES = [("Maya", "gold"), ("Sam", "silver"), ("Ada", "gold"), ("Lin", "bronze")]


def show_demo_runs(count: int, out: TextIO, stop: Any) -> None:
    try:
        org = Organisation.objects.get(slug=DEMO_ORG)
        batch = uuid.uuid4().hex[:8]
        run_ids = []
        for index in range(count):
            name, tier = NAMES[index % len(NAMES)]
            started = run_start(
                org=org,
                automation_slug=DEMO_AUTOMATION,
                run_input={"name": name, "tier": tier},
                start_key=f"demo-{batch}-{index}",
            )
            run_ids.append(started.run_id)
        out.write(f"started {count} demo run(s): {run_ids}\n")
        deadline = time.monotonic() + 60
        shown = ""
        while not stop.is_set() and time.monotonic() < deadline:
            runs = list(Run.objects.filter(id__in=run_ids).order_by("id"))
            line = ", ".join(f"{r.id}:{r.status}({r.steps_executed} steps)" for r in runs)
            if line != shown:  # while the engine starts, a line a second said the same
                out.write(f"demo runs: {line}\n")
                shown = line
            if all(r.status != "running" for r in runs):
                for run in runs:
                    out.write(f"  run {run.id} {run.status}: output {run.output}\n")
                out.write("see them in the admin under Runs, or GET /api/v1/runs/<id>\n")
                break
            stop.wait(1.0)
    finally:
        connection.close()
