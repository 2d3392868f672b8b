from __future__ import annotations

from typing import Any

import factory

from workflows.definitions.validator import definition_digest
from workflows.models import Automation, AutomationVersion, Organisation


def linear_definition(*step_ids: str) -> dict:
    """A valid definition: a chain of `set` steps ending in `end`."""
    ids = list(step_ids) or ["first"]
    steps: list[dict] = []
    for index, step_id in enumerate(ids):
        nxt = ids[index + 1] if index + 1 < len(ids) else "finish"
        steps.append({"id": step_id, "type": "set", "values": {step_id: index}, "next": nxt})
    steps.append({"id": "finish", "type": "end"})
    return {"start": ids[0], "steps": steps}


# One io step (noop) and an end: a run that waits for an io worker.
IO_DEFINITION: dict = {
    "start": "work",
    "steps": [{"id": "work", "type": "noop", "next": "done"}, {"id": "done", "type": "end"}],
}


# A run that waits a day for signal "order.paid" correlated by its input's "order".
SIGNAL_WAIT_DEFINITION: dict = {
    "start": "wait",
    "steps": [
        {"id": "wait", "type": "wait_signal", "signal": "order.paid",
         "correlation": "{{ input.order }}", "timeout": "1d", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}  # fmt: skip

# An http step through connection "slow" to ``input.url`` (a host that may never answer), and
# one through connection "api" to ``input.api`` (the provider stub): the fair-share test's and
# benchmarks/noisy_neighbour.py's tenants.
SLOW_CALL_DEFINITION: dict = {"start": "call", "steps": [
    {"id": "call", "type": "http", "connection": "slow", "next": "done",
     "request": {"method": "POST", "url": "{{ input.url }}/pay", "body": {"n": "{{ input.n }}"}}},
    {"id": "done", "type": "end"},
]}  # fmt: skip
QUICK_CALL_DEFINITION: dict = {"start": "call", "steps": [
    {"id": "call", "type": "http", "connection": "api", "next": "done",
     "request": {"method": "POST", "url": "{{ input.api }}/items", "body": {"quick": True}}},
    {"id": "done", "type": "end"},
]}  # fmt: skip


class OrganisationFactory(factory.django.DjangoModelFactory[Organisation]):
    class Meta:
        model = Organisation

    slug = factory.Sequence(lambda n: f"org-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())


class AutomationFactory(factory.django.DjangoModelFactory[Automation]):
    class Meta:
        model = Automation

    org = factory.SubFactory(OrganisationFactory)
    slug = factory.Sequence(lambda n: f"automation-{n}")
    name = factory.LazyAttribute(lambda o: o.slug)


class DraftVersionFactory(factory.django.DjangoModelFactory[AutomationVersion]):
    class Meta:
        model = AutomationVersion

    automation = factory.SubFactory(AutomationFactory)
    org = factory.LazyAttribute(lambda o: o.automation.org)
    number = factory.Sequence(lambda n: n + 1)
    definition = factory.LazyFunction(lambda: linear_definition("a", "b"))
    digest = factory.LazyAttribute(lambda o: definition_digest(o.definition))


def timer_sweeper(name: str, *, tick: float, firers: int) -> Any:
    """A sweeper (the engine's) whose only service is the timers' firing, with ``firers``
    firing threads: for tests that run one on a thread of their own."""
    from timers.sweep import TimerFiring
    from workflows.engine.sweeper import Sweeper

    sweeper = Sweeper(name, tick=tick)
    sweeper.services = [TimerFiring(sweeper.sweep, firers=firers)]
    return sweeper
