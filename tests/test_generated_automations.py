"""Generated automations (tests/generated_automations.py) run on the real engine.

Hypothesis draws valid definitions from the whole step-type catalogue: effects against the
local stub providers, waits of 0 to 2 s, signal waits with and without their signal,
approvals and tasks decided by a scripted person through the API, parallel branches meeting
at a join, loops with a bound, branches on the input. Each is published and started through
the API, with ``runengine`` running as real processes (tests/engine_harness.py), and each
run must:

- succeed, along exactly the path its input predicts (the steps it entered, and how often);
- have made each effect once per iteration at its provider (counted at the stub by key);
- record no ``engine_error``, and leave no traceback in the engine's log.

A failure shrinks to a small definition. This short form draws 20 automations (about a
minute); ``benchmarks/generated_automations.py`` runs the long form for as long as asked.
``WAYMARK_GENERATED_EXAMPLES`` sets how many automations one test run draws, and
``WAYMARK_GENERATED_REPORT`` a file where it appends what it checked (one JSON line).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from workflows.models import Run, Step

from .engine_harness import Harness, Script, Waiting
from .generated_automations import (
    EFFECTS,
    Automation,
    RunInput,
    Sequence,
    Single,
    automations,
    model_marker,
    run_inputs,
)

pytestmark = [pytest.mark.long_running, pytest.mark.django_db(transaction=True)]

# Always tried first: the reproduction that opened "Correct together" (a worker step, then a
# wait: the settle's walk ahead entered the wait and failed the run).
ISSUE_REPRODUCTION = Automation(Sequence((Single("noop"), Single("wait", 1))))
NO_FLAGS = {"f1": False, "f2": False, "f3": False}
EXAMPLES = int(os.environ.get("WAYMARK_GENERATED_EXAMPLES", "20"))
RUNS_PER_AUTOMATION = 2


@dataclass
class Checked:
    automations: int = 0
    runs: int = 0
    steps: int = 0
    effects: int = 0
    step_types: Counter[str] = field(default_factory=Counter)


class People:
    """The scripted person and sender: what each run's automation says to answer."""

    def __init__(self) -> None:
        self.automation_of: dict[int, Automation] = {}

    def script(self) -> Script:
        return Script(signal=self.signal, decision=self.decision)

    def signal(self, waiting: Waiting) -> dict[str, Any] | None:
        sent = self.automation_of[waiting.run_id].signal_sent(waiting.step_id)
        return {"pass": waiting.iteration} if sent else None

    def decision(self, waiting: Waiting) -> str | None:
        decided = self.automation_of[waiting.run_id].decision_for(waiting.step_id)
        return decided if decided in ("approve", "reject") else None  # "timeout": nobody


def check_run(harness: Harness, run: Run, automation: Automation, given: RunInput) -> int:
    """The run against its prediction; how many effects it made."""
    where = f"run {run.pk} of {json.dumps(automation.definition)} with {given}"
    assert run.status == "succeeded", f"{where}: {run.status} {run.error}"
    rows = Step.objects.filter(run=run).exclude(step_id="~continue")
    errors = [(s.step_id, s.error) for s in rows if "engine_error" in s.error]
    assert not errors, f"{where}: {errors}"
    entered = Counter(rows.values_list("step_id", flat=True))
    assert entered == automation.visits(given), f"{where}: entered {dict(entered)}"
    expected: Counter[str] = Counter()
    for step in automation.steps_of(*EFFECTS):
        if step["type"] == "model":  # the model API gets no key: counted by its prompt
            seen = harness.model_hits(model_marker(str(run.pk), step["id"]))
            assert seen == entered[step["id"]], f"{where}: model {step['id']} called {seen}x"
            continue
        for iteration in range(1, entered[step["id"]] + 1):
            expected[f"{run.pk}/{step['id']}/{iteration}"] += 1
    made = harness.effect_keys(run.pk)
    assert made == expected, f"{where}: effects {dict(made)}, expected {dict(expected)}"
    return expected.total()


def check_automation(harness: Harness, people: People, automation: Automation,
                     inputs: list[dict[str, bool]], checked: Checked) -> None:  # fmt: skip
    slug = harness.publish(automation.definition)
    given = {}
    for n, flags in enumerate(inputs):
        drawn = RunInput(key=f"{slug}-r{n}", flags=flags)
        soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
        run_input = drawn.as_json(soon=soon, api_url=harness.stubs.provider.url)
        run_id = harness.start(slug, run_input, start_key=drawn.key)
        given[run_id] = drawn
        people.automation_of[run_id] = automation
    finished = harness.wait_finished(given, script=people.script())
    for run_id, run in finished.items():
        checked.effects += check_run(harness, run, automation, given[run_id])
        checked.steps += automation.visits(given[run_id]).total()
    checked.automations += 1
    checked.runs += len(finished)
    checked.step_types.update(s["type"] for s in automation.definition["steps"])


def report(checked: Checked, seconds: float) -> None:
    path = os.environ.get("WAYMARK_GENERATED_REPORT")
    if path:
        line = {"automations": checked.automations, "runs": checked.runs, "steps": checked.steps,
                "effects": checked.effects, "seconds": round(seconds, 1),
                "step_types": dict(checked.step_types)}  # fmt: skip
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")


def test_generated_automations_run_as_their_definitions_say(harness: Harness) -> None:
    people = People()
    checked = Checked()
    began = time.monotonic()

    # One harness for every example: the engine and the stubs outlive each draw (the
    # health check would object to the function-scoped fixture; it is meant).
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(automations(), st.lists(run_inputs(), min_size=RUNS_PER_AUTOMATION,
                                   max_size=RUNS_PER_AUTOMATION))  # fmt: skip
    @example(ISSUE_REPRODUCTION, [NO_FLAGS, NO_FLAGS])
    def runs_as_defined(automation: Automation, inputs: list[dict[str, bool]]) -> None:
        check_automation(harness, people, automation, inputs, checked)

    try:
        runs_as_defined()
    finally:
        report(checked, time.monotonic() - began)
    assert checked.automations >= 1
