"""Every definition the documentation shows runs to its end on the real engine (issue 26):
extracted from the Markdown (each ```json block that is a whole definition, with "start" and
"steps"; a step shown alone is not one), published and started through the API with
`runengine` running, once per path through it, against the local stubs.

The examples' placeholder hosts (`https://example.com`, `https://payments.example.com`)
are pointed at the provider stub's echo endpoint; everything else runs as documented,
connections by the names the examples give (`payments`, `mailer`). A new example fails
`test_every_documented_definition_has_its_scenarios` until its scenarios are written here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from .engine_harness import Harness, Script, Waiting
from .processes import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

DOCUMENTS = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
PLACEHOLDER_HOST = re.compile(r"https://(?:[a-z0-9-]+\.)*example\.com")


def documented_definitions() -> dict[str, dict[str, Any]]:
    """Every whole definition in the docs, by "<file>#<its start step>"."""
    found: dict[str, dict[str, Any]] = {}
    for document in DOCUMENTS:
        for block in re.findall(r"```json\n(.*?)```", document.read_text(), re.S):
            value = json.loads(block)  # a documented JSON block that does not parse fails
            if isinstance(value, dict) and "start" in value and "steps" in value:
                found[f"{document.name}#{value['start']}"] = value
    return found


@dataclass
class Scenario:
    """One run of an example: its input, the decisions of its approvals, and what it must
    do. In ``effects``, ``{run}`` stands for the run's id: each key reaches the stubs that
    often (an effect key, or the Idempotency-Key a step sets itself)."""

    input: dict[str, Any]
    path: list[str]
    output: Any
    status: str = "succeeded"
    decision: str = "approve"
    effects: dict[str, int] = field(default_factory=dict)


MAYA = {"name": "Maya", "id": "cus_1", "email": "maya@example.com"}
REFUND_PAID = ["note", "size", "refund", "tell", "done"]
REFUND_SENT = {"refund-{run}": 1, "{run}/tell/1": 1}

SCENARIOS: dict[str, list[Scenario]] = {
    "definitions.md#greet": [
        Scenario({"name": "Ada", "tier": "gold", "id": "c-1"},
                 ["greet", "route", "thank", "done"], None, effects={"{run}/thank/1": 1}),
        Scenario({"name": "Bo", "tier": "silver", "id": "c-2"}, ["greet", "route", "done"],
                 None),
    ],
    "sagas.md#note": [
        Scenario({"amount": 120, "customer": MAYA}, REFUND_PAID,
                 {"refunded": "120", "status": "200"}, effects=REFUND_SENT),
        Scenario({"amount": 900, "customer": MAYA}, ["note", "size", "ask", *REFUND_PAID[2:]],
                 {"refunded": "900", "status": "200"}, effects=REFUND_SENT),
        Scenario({"amount": 900, "customer": MAYA}, ["note", "size", "ask", "rejected"],
                 {"refunded": "0"}, status="failed", decision="reject"),
        Scenario({"amount": 50, "customer": {"name": "Ann", "id": "cus_3"}},
                 ["note", "size", "rejected"], {"refunded": "0"}, status="failed"),
    ],
    # The saga: every call answered, so nothing is compensated (tests/test_sagas.py fails it).
    "sagas.md#reserve": [
        Scenario({}, ["reserve", "charge", "ship", "done"], None,
                 effects={"{run}/reserve/1": 1, "{run}/charge/1": 1, "{run}/ship/1": 1}),
    ],
}  # fmt: skip

EXAMPLES = documented_definitions()


def test_every_documented_definition_has_its_scenarios() -> None:
    assert sorted(EXAMPLES) == sorted(SCENARIOS)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_documented_definition_runs_to_its_end(harness: Harness, name: str) -> None:
    scenarios = SCENARIOS[name]
    text = PLACEHOLDER_HOST.sub(harness.stubs.provider.url + "/echo", json.dumps(EXAMPLES[name]))
    slug = harness.publish(json.loads(text))
    runs = {harness.start(slug, s.input, start_key=f"s{i}"): s for i, s in enumerate(scenarios)}

    def decide(waiting: Waiting) -> str:
        return runs[waiting.run_id].decision

    finished = harness.wait_finished(runs, script=Script(decision=decide))

    for run_id, scenario in runs.items():
        run = finished[run_id]
        shown = f"{name} with {scenario.input}"
        assert (run.status, run.output) == (scenario.status, scenario.output), (shown, run.error)
        assert harness.path(run_id) == [(step, 1, "done") for step in scenario.path], shown
        effects = {key.format(run=run_id): n for key, n in scenario.effects.items()}
        assert {key: harness.stub_hits(key) for key in effects} == effects, shown
        ours = {key: n for key, n in effects.items() if key.startswith(f"{run_id}/")}
        assert harness.effect_keys(run_id) == ours, shown  # nothing else went out
