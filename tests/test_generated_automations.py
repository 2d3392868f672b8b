"""Generated automations (tests/generated_automations.py) run on the real engine.

Hypothesis draws valid definitions from the whole step-type catalogue: effects against the
local stub providers, waits of 0 to 2 s, signal waits with and without their signal,
approvals and tasks decided by a scripted person through the API, parallel branches meeting
at a join, loops with a bound, branches on the input. Each is published and started through
the API, with ``runengine`` running as a real process, and each run must:

- succeed, along exactly the path its input predicts (the steps it entered, and how often);
- have made each effect once per iteration at its provider (counted at the stub by key);
- record no ``engine_error``, and leave no traceback in the engine's log.

A failure shrinks to a small definition. This short form runs a few automations (about a
minute); ``benchmarks/generated_automations.py`` runs the long form for as long as asked.
``WAYMARK_GENERATED_EXAMPLES`` sets how many automations one test run draws, and
``WAYMARK_GENERATED_REPORT`` a file where it appends what it checked (one JSON line).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from workflows.models import Organisation, Run, Step

from .effect_setup import connect
from .generated_automations import (
    EFFECTS,
    Automation,
    RunInput,
    Sequence,
    Single,
    automations,
    run_inputs,
)
from .processes import ROOT, engine_env, kill_tree
from .stubs.model import ModelStub
from .stubs.provider import ProviderStub
from .stubs.slack import SlackStub
from .stubs.smtp import SmtpStub

# Always tried first: the reproduction that opened "Correct together" (a worker step, then a
# wait: the settle's walk ahead entered the wait and failed the run).
ISSUE_REPRODUCTION = Automation(Sequence((Single("noop"), Single("wait", 1))))
NO_FLAGS = {"f1": False, "f2": False, "f3": False}
EXAMPLES = int(os.environ.get("WAYMARK_GENERATED_EXAMPLES", "6"))
RUNS_PER_AUTOMATION = 2
# Bounds, not budgets: a run of the longest drawn shape waits a few seconds in all.
RUN_DEADLINE_SECONDS = 120.0
TERMINAL = ("succeeded", "failed", "cancelled")


def _effect_key(sent: str) -> str:
    """The effect's key (run/step/iteration) from what a provider saw: some carry the
    request's digest after a colon."""
    return sent.partition(":")[0]


@dataclass
class Stubs:
    provider: ProviderStub
    smtp: SmtpStub
    slack: SlackStub
    model: ModelStub

    def effect_keys(self) -> Counter[str]:
        """Every effect key a provider saw, as many times as it saw it."""
        keys: Counter[str] = Counter()
        for request in self.provider.requests:
            key = _effect_key(request["headers"].get("idempotency-key", ""))
            if key and (request["path"] == "/items" or request["path"].startswith("/contacts/")):
                keys[key] += 1
        for message in self.smtp.messages:
            keys[_effect_key(message.headers.get("x-waymark-effect-key", ""))] += 1
        for posted in self.slack.messages:
            metadata = posted.get("metadata") or {}
            keys[_effect_key(metadata.get("event_payload", {}).get("effect_key", ""))] += 1
        return keys

    def model_prompts(self) -> Counter[str]:
        """How often each prompt reached the model (a prompt names its run and step)."""
        prompts: Counter[str] = Counter()
        for request in self.model.requests:
            for message in (request["body"] or {}).get("messages", []):
                prompts[str(message.get("content", ""))] += 1
        return prompts


@dataclass
class Engine:
    """``runengine --no-web`` against the test database, its output kept in one file."""

    log: Path
    process: Any = None

    def start(self) -> None:
        import subprocess
        import sys

        env = engine_env(WAYMARK_LOG_LEVEL="INFO", WAYMARK_SWEEP_SECONDS="0.5")
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "runengine", "--no-web", "--grace", "2"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def stop(self) -> None:
        if self.process is not None:
            kill_tree(self.process)

    def problems(self) -> list[str]:
        text = self.log.read_text(errors="replace")
        return [line for line in text.splitlines() if "Traceback" in line or "engine_error" in line]


@dataclass
class Checked:
    automations: int = 0
    runs: int = 0
    steps: int = 0
    effects: int = 0
    shapes: Counter[str] = field(default_factory=Counter)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    running = Engine(tmp_path / "runengine.log")
    running.start()
    yield running
    running.stop()


def _connect_all(org: Organisation, stubs: Stubs) -> None:
    connect(org, provider="http", name="api", base_url=stubs.provider.url)
    connect(org, provider="email", name="mail",
            options={"host": stubs.smtp.host, "port": stubs.smtp.port})  # fmt: skip
    connect(org, provider="slack_message", name="slack", base_url=stubs.slack.url + "/api/",
            secret="xoxb-stub")  # fmt: skip
    connect(org, provider="model", name="llm", base_url=f"{stubs.model.url}/v1",
            options={"model": "stub-1"})  # fmt: skip
    connect(org, provider="crm_upsert", name="crm", base_url=stubs.provider.url)


def _ok(response: Any, *statuses: int) -> Any:
    assert response.status_code in statuses, (response.status_code, response.content[:500])
    return response.json()


class Driver:
    """Publishes, starts and drives one drawn automation through the API, as its users
    would: signals sent, approvals and tasks decided by the script."""

    def __init__(self, api: APIClient, org: Organisation, stubs: Stubs) -> None:
        self.api, self.org, self.stubs = api, org, stubs
        self.count = 0

    def publish(self, automation: Automation) -> str:
        self.count += 1
        slug = f"gen-{self.count}"
        _ok(self.api.post("/api/v1/automations", {"slug": slug}, format="json"), 201)
        path = f"/api/v1/automations/{slug}/versions"
        version = _ok(self.api.post(path, {"definition": automation.definition}, format="json"),
                      201)  # fmt: skip
        _ok(self.api.post(f"{path}/{version['number']}/publish", format="json"), 200, 201)
        return slug

    def start(self, slug: str, run: RunInput) -> int:
        soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
        body = {"automation": slug, "start_key": run.key,
                "input": run.as_json(soon=soon, api_url=self.stubs.provider.url)}  # fmt: skip
        return int(_ok(self.api.post("/api/v1/runs", body, format="json"), 200, 201)["id"])

    def send_signals(self, automation: Automation, run: RunInput) -> None:
        visits = automation.visits(run)
        for step_id in automation.signals_sent():
            for n in range(visits[step_id]):  # one for each time the run waits there
                body = {"name": f"sig.{step_id}", "correlation": run.key,
                        "id": f"{run.key}-{step_id}-{n}", "payload": {"n": n}}  # fmt: skip
                _ok(self.api.post("/api/v1/signals", body, format="json"), 200, 201)

    def decide_pending(self, automations: dict[int, Automation]) -> None:
        """The scripted person: decides what waits for people, as its automation says."""
        pending = ApprovalRequest.objects.filter(org=self.org, status="pending")
        for request in pending.select_related("run"):
            automation = automations.get(request.run_id)
            if automation is None:
                continue
            decision = automation.decision_for(request.step_id)
            if decision in ("approve", "reject"):
                path = f"/api/v1/approvals/{request.pk}/decide"
                self.api.post(path, {"decision": decision}, format="json")
            elif decision == "submit":
                path = f"/api/v1/tasks/{request.pk}/submit"
                self.api.post(path, {"answer": {"x": "done"}}, format="json")

    def finish(self, automations: dict[int, Automation]) -> dict[int, Run]:
        deadline = time.monotonic() + RUN_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            self.decide_pending(automations)
            runs = {run.pk: run for run in Run.objects.filter(pk__in=automations)}
            if all(run.status in TERMINAL for run in runs.values()):
                return runs
            time.sleep(0.1)
        stuck = Run.objects.filter(pk__in=automations).exclude(status__in=TERMINAL)
        raise AssertionError(f"runs not finished in {RUN_DEADLINE_SECONDS}s: "
                             f"{[(r.pk, r.status) for r in stuck]}")  # fmt: skip


def check_run(run: Run, automation: Automation, given: RunInput, stubs: Stubs) -> Counter[str]:
    """The run against its prediction; the effect keys it should have made."""
    where = f"run {run.pk} of {json.dumps(automation.definition)} with {given}"
    assert run.status == "succeeded", f"{where}: {run.status} {run.error}"
    rows = Step.objects.filter(run=run).exclude(step_id="~continue")
    errors = [(s.step_id, s.error) for s in rows if "engine_error" in s.error]
    assert not errors, f"{where}: {errors}"
    entered = Counter(rows.values_list("step_id", flat=True))
    assert entered == automation.visits(given), f"{where}: entered {dict(entered)}"
    expected: Counter[str] = Counter()
    for step in automation.steps_of(*EFFECTS):
        if step["type"] == "model":
            continue  # counted by prompt below: a model call carries no key
        for iteration in range(1, entered[step["id"]] + 1):
            expected[f"{run.pk}/{step['id']}/{iteration}"] += 1
    prompts = stubs.model_prompts()
    for step in automation.steps_of("model"):
        seen = prompts[f"{run.pk}/{step['id']}"]
        assert seen == entered[step["id"]], f"{where}: model {step['id']} called {seen} times"
    return expected


def check_automation(driver: Driver, automation: Automation, inputs: list[dict[str, bool]],
                     checked: Checked) -> None:  # fmt: skip
    slug = driver.publish(automation)
    given = [RunInput(key=f"{slug}-r{n}", flags=flags) for n, flags in enumerate(inputs)]
    started: dict[int, Automation] = {}
    inputs_of: dict[int, RunInput] = {}
    for each in given:
        run_id = driver.start(slug, each)
        started[run_id], inputs_of[run_id] = automation, each
        driver.send_signals(automation, each)
    runs = driver.finish(started)
    expected: Counter[str] = Counter()
    for run_id, run in runs.items():
        expected += check_run(run, automation, inputs_of[run_id], driver.stubs)
    seen = driver.stubs.effect_keys()
    mine = Counter({key: n for key, n in seen.items() if key.split("/")[0] in map(str, runs)})
    assert mine == expected, f"{json.dumps(automation.definition)}: effects {mine} != {expected}"
    checked.automations += 1
    checked.runs += len(runs)
    checked.steps += sum(a.visits(inputs_of[r]).total() for r, a in started.items())
    checked.effects += expected.total()
    checked.shapes.update(s["type"] for s in automation.definition["steps"])


def report(checked: Checked, seconds: float) -> None:
    path = os.environ.get("WAYMARK_GENERATED_REPORT")
    if path:
        line = {"automations": checked.automations, "runs": checked.runs, "steps": checked.steps,
                "effects": checked.effects, "seconds": round(seconds, 1),
                "step_types": dict(checked.shapes)}  # fmt: skip
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")


@pytest.mark.django_db(transaction=True)
def test_generated_automations_run_as_their_definitions_say(
    org: Organisation,
    api: APIClient,
    engine: Engine,
    provider_stub: ProviderStub,
    smtp_stub: SmtpStub,
    slack_stub: SlackStub,
    model_stub: ModelStub,
) -> None:
    stubs = Stubs(provider_stub, smtp_stub, slack_stub, model_stub)
    _connect_all(org, stubs)
    driver = Driver(api, org, stubs)
    checked = Checked()
    began = time.monotonic()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(automations(), st.lists(run_inputs(), min_size=RUNS_PER_AUTOMATION,
                                   max_size=RUNS_PER_AUTOMATION))  # fmt: skip
    @example(ISSUE_REPRODUCTION, [NO_FLAGS, NO_FLAGS])
    def runs_as_defined(automation: Automation, inputs: list[dict[str, bool]]) -> None:
        check_automation(driver, automation, inputs, checked)

    try:
        runs_as_defined()
    finally:
        report(checked, time.monotonic() - began)
    assert checked.automations >= 1
    assert not engine.problems(), "\n".join(engine.problems()[:20])
