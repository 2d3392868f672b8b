"""A run whose steps are decided as it goes (a code workflow's, workflows/code) instead of
read from its definition.

Such a definition has one step, of a type that declares ``decides`` (StepType): its
executor, on a worker, says which step the run enters next by returning the whole step as
its output (``{"call": {...}}``), or ends the run. The walk keeps the run's outputs, so the
step a decider asked for is found there by every path that walks the run (a settle, a wake
from a timer or a signal, a worker reading the step it runs), and it is entered exactly as a
definition's step is: same row, same events, same effect key. A step asked for goes back to
the decider when it ends, which decides again; the outcome it ended with (a mapped
``next``'s choice in a definition) is noted in the decider's output among the run's outputs,
where the decider's next turn reads it.

A walk ahead of its transaction (a hop's, speculative.py) looks such a run's steps up as
the ordinary walk does: they are read from the run's row, whose version the hop checks.
Only the decider's turn reads more (the run's history): the walk runs it ahead only from
the history the run's previous turn knew (Walk.carried), and hands it to the ordinary walk
otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..definitions.registry import registry

Steps = Mapping[str, Mapping[str, Any]]


def steps_of(
    definition: Mapping[str, Any], outputs: Mapping[str, Any], *, speculative: bool
) -> Steps:
    """The run's steps by id: the definition's, or, for a deciding definition, the decider
    and the step it last asked for (read from the run's ``outputs`` when looked up)."""
    steps = definition["steps"]
    decider = deciding_step(definition)
    if decider is not None:
        return DecidedSteps(decider, outputs, speculative=speculative)
    return {step["id"]: step for step in steps}


def deciding_step(definition: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The definition's decider, when its one step is of a type that decides."""
    steps = definition["steps"]
    if len(steps) != 1:
        return None
    step_type = registry.get(steps[0]["type"])
    return steps[0] if step_type is not None and step_type.decides else None


def step_of(
    definition: Mapping[str, Any], step_id: str, outputs: Mapping[str, Any]
) -> Mapping[str, Any]:
    """One step of the run (a worker's, for the step it claimed)."""
    return steps_of(definition, outputs, speculative=False)[step_id]


def asked_step(decider_output: Any) -> Mapping[str, Any] | None:
    """The step a decider's output asks for, if it asks for one."""
    if isinstance(decider_output, Mapping):
        call = decider_output.get("call")
        if isinstance(call, Mapping):
            return call
    return None


class DecidedSteps(Mapping[str, Mapping[str, Any]]):
    """A deciding run's steps: the decider goes on to the step it asked for; that step, and
    any other the run entered, goes back to the decider."""

    def __init__(self, decider: Mapping[str, Any], outputs: Mapping[str, Any], *,
                 speculative: bool) -> None:  # fmt: skip
        self.decider = decider
        self.outputs = outputs  # the run's, as the walk updates them
        self.speculative = speculative

    def __getitem__(self, step_id: str) -> Mapping[str, Any]:
        decider_id = self.decider["id"]
        asked = asked_step(self.outputs.get(decider_id))
        if step_id == decider_id:
            return {**self.decider, "next": asked["id"]} if asked else self.decider
        if asked is not None and asked["id"] == step_id:
            return {**asked, "next": decider_id}
        # Not the step the decider last asked for: only one step of such a run is live at a
        # time, so this is a bug, and going back to the decider would decide twice (and
        # enter its step twice). The walk fails loudly instead.
        raise KeyError(step_id)

    def outcome_noted(self, step_id: str, outcome: str | None) -> dict[str, Any] | None:
        """The decider's output with the outcome of the step it asked for, which just ended,
        noted as ``outcome`` (the step's row keeps only its output; the decider's next turn
        reads the outcome here and records it); None when there is none to note."""
        decider_output = self.outputs.get(self.decider["id"])
        asked = asked_step(decider_output)
        if outcome is None or asked is None or asked["id"] != step_id:
            return None
        assert isinstance(decider_output, Mapping)
        return {**decider_output, "outcome": outcome}

    def __iter__(self) -> Iterator[str]:
        asked = asked_step(self.outputs.get(self.decider["id"]))
        return iter([self.decider["id"], *([asked["id"]] if asked else [])])

    def __len__(self) -> int:
        return len(list(iter(self)))
