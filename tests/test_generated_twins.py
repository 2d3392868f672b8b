"""Generated automations and their code twins run on the same real engine, and must agree.

Hypothesis draws automations as tests/test_generated_automations.py does (every step type,
branches on the input, loops, signal waits with and without their signal, approvals and tasks
decided by a scripted person), and tests/generated_twins.py writes each one again as a code
workflow: a generated Python module registering ``@workflow(name, version=1)`` functions,
step for step with the same ids and fields. The module is written to a temporary directory
and named in the engine processes' ``WAYMARK_EXTRA_STEP_MODULES`` (with the directory on
their ``PYTHONPATH``), as a host's module would be; the definitions are published through the
API, the code workflows with ``publish_code_workflow``. Each automation runs both ways, on the
same inputs, on the same ``runengine`` processes, with the same stub providers and the same
scripted person and sender, and the two runs must have:

- made the same effects: the same (step, iteration) pairs at the stubs, each as often;
- entered the same steps: the same (step id, iteration, type, status) rows in the same
  order (as multisets where parallel branches interleave), leaving out the code run's own
  rows (its deciders' turns, ``ctx.*`` records, ctx.parallel's fork and join) and the
  definition's control flow (branches, the loop's branch back, parallel and join, the end),
  which the twin writes as Python;
- ended the same (status and output); and both entered what the input predicts.

A difference fails, naming the pair's definition and its twin's source, and Hypothesis
shrinks the batch's automations (for up to its five minutes of shrinking). The engine's
processes import the modules at start, so each Hypothesis example is a batch of up to 8
automations, on an engine started for it. ``WAYMARK_GENERATED_EXAMPLES`` sets about how
many automations one test run draws (8 here, in batches of 8),
``WAYMARK_GENERATED_REPORT`` a file where it appends what it checked (one JSON line);
``benchmarks/generated_automations.py --twin`` runs the long form.
"""

from __future__ import annotations

import importlib
import itertools
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from workflows.code.registry import unregister
from workflows.models import Organisation, Run, Step
from workflows.plugins.code import publish_code_workflow

from .engine_harness import Engine, Harness, make_harness, stub_servers
from .generated_automations import Automation, RunInput, model_marker, run_inputs
from .generated_twins import has_parallel, module_source, structural_ids, twin_automations
from .test_generated_automations import RUNS_PER_AUTOMATION, People

pytestmark = [pytest.mark.long_running, pytest.mark.django_db(transaction=True)]

EXAMPLES = int(os.environ.get("WAYMARK_GENERATED_EXAMPLES", "8"))
# Automations per engine: the engine's processes register the twins when they start.
BATCH = min(EXAMPLES, 8)
BATCHES = math.ceil(EXAMPLES / BATCH)
# The code run's own rows: its deciders' turns (``decide``, and a parallel branch's
# ``<id>.<n>``), and ctx.parallel's fork and meeting (the definition's parallel and join
# steps are left out as control flow too: generated_twins.structural_ids).
CODE_OWN_TYPES = ("code", "parallel", "join")
Row = tuple[str, int, str, str]  # step id, iteration, type, status


@dataclass
class Checked:
    automations: int = 0
    runs: int = 0
    steps: int = 0
    effects: int = 0
    engines: int = 0
    step_types: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class Twins:
    """One input's two runs: by the definition and by its code twin."""

    automation: Automation
    given: RunInput
    by_definition: int
    by_code: int


def test_code_twins_of_generated_automations_do_what_their_definitions_do(
    org: Organisation, tmp_path: Path
) -> None:
    people = People()
    checked = Checked()
    numbers = itertools.count()
    began = time.monotonic()

    with stub_servers() as stubs:
        harness = make_harness(org, stubs, Engine(tmp_path / "unused.log"))

        # One organisation and one set of stubs for every example; an engine per example
        # (the health check would object to the function-scoped fixtures; it is meant).
        @settings(max_examples=BATCHES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(st.lists(st.tuples(twin_automations(), inputs()), min_size=BATCH,
                        max_size=BATCH))  # fmt: skip
        def twins_agree(batch: list[tuple[Automation, list[dict[str, bool]]]]) -> None:
            # Hypothesis tries the simplest batch first: one automation (a lone effect step)
            # over and over. It says nothing one copy would not, and would cost an engine's
            # start: rejected, so every batch run is a drawn one.
            assume(len({json.dumps(automation.definition) for automation, _ in batch}) > 1)
            number = next(numbers)
            directory = tmp_path / f"example-{number}"
            with (
                twin_module(directory, number, batch) as (module, names),
                engine_for(harness, module),
            ):
                check_batch(harness, people, batch, names, checked)

        try:
            twins_agree()
        finally:
            report(checked, time.monotonic() - began)
    assert checked.automations >= 1


def inputs() -> st.SearchStrategy[list[dict[str, bool]]]:
    return st.lists(run_inputs(), min_size=RUNS_PER_AUTOMATION, max_size=RUNS_PER_AUTOMATION)


# --- the twins' module and the engine that registers it -------------------------------------


@dataclass(frozen=True)
class Module:
    name: str
    directory: Path


@contextmanager
def twin_module(directory: Path, number: int, batch: list[Any]
                ) -> Iterator[tuple[Module, dict[str, Automation]]]:  # fmt: skip
    """The batch's twins written as one module in ``directory`` and imported here (so they
    are published from this process), unregistered afterwards: the module, and each
    twin's workflow name with its automation."""
    names = {f"twin-{number}-{n}": automation for n, (automation, _) in enumerate(batch)}
    module = Module(f"waymark_twins_{os.getpid()}_{number}", directory)
    directory.mkdir(parents=True)
    source = module_source(names, doc="Code twins of drawn automations.")
    (directory / f"{module.name}.py").write_text(source)
    sys.path.insert(0, str(directory))
    try:
        importlib.import_module(module.name)
        yield module, names
    finally:
        for name in names:
            unregister(name, 1)
        sys.modules.pop(module.name, None)
        sys.path.remove(str(directory))


@contextmanager
def engine_for(harness: Harness, module: Module) -> Iterator[Engine]:
    """``runengine`` as processes whose every child imports the twins' module at start (its
    directory on PYTHONPATH, its name in WAYMARK_EXTRA_STEP_MODULES, as a host's own module
    would be named), as the harness's engine until the block ends; its log must be clean."""
    path = os.pathsep.join(p for p in (str(module.directory), os.environ.get("PYTHONPATH")) if p)
    engine = Engine(
        module.directory / "engine.log",
        WAYMARK_EFFECTS_CIRCUIT_FAILURES="1000",  # as the shared harness's engine
        PYTHONPATH=path,
        WAYMARK_EXTRA_STEP_MODULES=f"tests.probe_steps,{module.name}",
    )
    harness.engine, harness.log_from = engine.start(), 0
    try:
        yield engine
        harness.assert_clean_logs()
    finally:
        engine.stop()


# --- the check ------------------------------------------------------------------------------


def check_batch(harness: Harness, people: People, batch: list[Any],
                names: dict[str, Automation], checked: Checked) -> None:  # fmt: skip
    """Start every automation's runs both ways, answer them alike, and compare each pair."""
    pairs = []
    stub_url = harness.stubs.provider.url
    for (name, automation), (_, flags_of_runs) in zip(names.items(), batch, strict=True):
        slug = harness.publish(automation.definition)
        publish_code_workflow(org=harness.org, name=name, version=1)
        for n, flags in enumerate(flags_of_runs):
            drawn = RunInput(key=f"{slug}-r{n}", flags=flags)
            soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
            ids = []
            for automation_slug in (slug, name):
                key = f"{automation_slug}-r{n}"
                run_input = RunInput(key, flags).as_json(soon=soon, api_url=stub_url)
                run_id = harness.start(automation_slug, run_input, start_key=key)
                people.automation_of[run_id] = automation
                ids.append(run_id)
            pairs.append(Twins(automation, drawn, *ids))
    run_ids = [run for pair in pairs for run in (pair.by_definition, pair.by_code)]
    finished = harness.wait_finished(run_ids, script=people.script(), timeout=600)
    at_stubs = harness.keys_at_stubs()
    for pair in pairs:
        checked.effects += compare(harness, pair, finished, at_stubs, source_of(pair, names))
        checked.runs += 2
        checked.steps += 2 * pair.automation.visits(pair.given).total()
    checked.automations += len(names)
    checked.engines += 1
    for automation in names.values():
        checked.step_types.update(s["type"] for s in automation.definition["steps"])


def source_of(pair: Twins, names: dict[str, Automation]) -> str:
    name = next(n for n, a in names.items() if a is pair.automation)
    return module_source({name: pair.automation})


def compare(harness: Harness, pair: Twins, finished: dict[int, Run], at_stubs: Counter[str],
            source: str) -> int:  # fmt: skip
    """The twins against each other and the prediction: how many effects each made."""
    automation = pair.automation
    defined, coded = finished[pair.by_definition], finished[pair.by_code]
    where = (f"runs {defined.pk} (definition) and {coded.pk} (code) with {pair.given.flags} of "
             f"{json.dumps(automation.definition)}\nand its twin:\n{source}")  # fmt: skip
    left_out = structural_ids(automation)
    by_definition = entered(defined.pk, leave_out=left_out)
    by_code = [row for row in entered(coded.pk, leave_out=left_out)
               if not row[0].startswith("ctx.") and row[2] not in CODE_OWN_TYPES]  # fmt: skip
    if has_parallel(automation):  # branches interleave as their steps end: order is theirs
        assert Counter(by_code) == Counter(by_definition), f"{where}: steps differ"
    else:
        assert by_code == by_definition, f"{where}:\nsteps {by_definition}\nvs   {by_code}"
    effects = effects_of(defined.pk, at_stubs, automation, harness)
    assert effects_of(coded.pk, at_stubs, automation, harness) == effects, f"{where}: effects"
    ended = (coded.status, coded.output, coded.error)
    assert ended == (defined.status, defined.output, defined.error), f"{where}: ended {ended}"
    assert defined.status == "succeeded", f"{where}: {defined.status} {defined.error}"
    predicted = automation.visits(pair.given)
    for structural in left_out:
        del predicted[structural]
    assert Counter(row[0] for row in by_code) == +predicted, f"{where}: not as predicted"
    errors = Step.objects.filter(run_id__in=(defined.pk, coded.pk), error__contains="engine_error")
    assert not errors.exists(), f"{where}: {list(errors.values_list('step_id', 'error'))}"
    return effects.total()


def entered(run_id: int, *, leave_out: set[str]) -> list[Row]:
    """The run's step rows in the order entered, but those left out."""
    rows = Step.objects.filter(run_id=run_id).exclude(step_id__in={*leave_out, "~continue"})
    rows = rows.order_by("id")
    return [(s.step_id, s.iteration, s.type, s.status) for s in rows]


def effects_of(run_id: int, at_stubs: Counter[str], automation: Automation,
               harness: Harness) -> Counter[tuple[str, int]]:  # fmt: skip
    """(step, iteration) -> how often its effect reached a stub: keys are run/step/iteration,
    so the run's id is dropped to compare two runs; a model call, which carries no key, is
    counted by the prompt naming its run and step, as (step, 0)."""
    made: Counter[tuple[str, int]] = Counter()
    prefix = f"{run_id}/"
    for key, times in at_stubs.items():
        if key.startswith(prefix):
            step_id, _, iteration = key[len(prefix) :].rpartition("/")
            made[(step_id, int(iteration))] += times
    for model in automation.steps_of("model"):
        calls = harness.model_hits(model_marker(str(run_id), model["id"]))
        if calls:
            made[(model["id"], 0)] += calls
    return made


def report(checked: Checked, seconds: float) -> None:
    path = os.environ.get("WAYMARK_GENERATED_REPORT")
    if path:
        line = {"automations": checked.automations, "runs": checked.runs, "steps": checked.steps,
                "effects": checked.effects, "engines": checked.engines,
                "seconds": round(seconds, 1), "step_types": dict(checked.step_types)}  # fmt: skip
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")
