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

A step asked for that fails for good goes back to the decider too (its ``on_failure``): the
function is told at the call (workflows/code, ``StepFailed``) and may go on. A run that fails
compensates what its function registered (``ctx.compensate_with``, recorded as steps
``COMPENSATION_RECORD``) through the engine's sagas (compensation.py): each compensation is
entered as the step the decider's output asks for, marked ``COMPENSATING``, so every path
that looks a step up finds it, and it never goes back to the decider.

A walk ahead of its transaction (a hop's, speculative.py) looks such a run's top-level steps
up as the ordinary walk does: they are read from the run's row, whose version the hop
checks. Only the decider's turn reads more (the run's history): the walk runs it ahead only
from the history the run's previous turn knew (Walk.carried), and hands it to the ordinary
walk otherwise. A ``ctx.parallel``'s fork, its branches and a compensation are walked the
ordinary way only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..definitions.registry import registry
from .places import TOP, Place
from .speculative import NeedsTransaction

Steps = Mapping[str, Mapping[str, Any]]

# The id of the steps that record a code run's compensations (ctx.compensate_with): their
# output names the execution undone and the whole compensation step (compensation.py). A dot
# is not allowed in a step id a workflow calls, so it never meets a call's own id.
COMPENSATION_RECORD = "ctx.compensate"
# In the decider's output: the step it asks for is an entry of the run's compensation plan.
COMPENSATING = "compensating"


def steps_of(
    definition: Mapping[str, Any], outputs: Mapping[str, Any], *, speculative: bool
) -> Steps:
    """The run's steps by id: the definition's, or, for a deciding definition, the decider
    and the step it last asked for (read from the run's ``outputs`` when looked up)."""
    known = _shapes.get(id(definition))
    if known is None or known[0] is not definition:
        known = _shape_of(definition)
    decider, by_id = known[1], known[2]
    if decider is not None:
        return DecidedSteps(decider, outputs, speculative=speculative)
    return by_id


# By definition (the published versions' definitions are cached for good, definition_cache.py,
# and every walk asks): its decider, or its steps by id, which nobody changes. The definition
# is kept with them, so its id is not reused while the entry lives.
_shapes: dict[int, tuple[Mapping[str, Any], Mapping[str, Any] | None, Steps]] = {}
_SHAPES_KEPT = 512


def _shape_of(
    definition: Mapping[str, Any],
) -> tuple[Mapping[str, Any], Mapping[str, Any] | None, Steps]:
    decider = deciding_step(definition)
    by_id = {} if decider is not None else {step["id"]: step for step in definition["steps"]}
    if len(_shapes) >= _SHAPES_KEPT:  # a definition that is not a published one (a replay's)
        _shapes.clear()
    known = _shapes[id(definition)] = (definition, decider, by_id)
    return known


def deciding_step(definition: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The definition's decider, when its one step is of a type that decides."""
    steps = definition["steps"]
    if len(steps) != 1:
        return None
    step_type = registry.get(steps[0]["type"])
    return steps[0] if step_type is not None and step_type.decides else None


def step_of(
    definition: Mapping[str, Any],
    step_id: str,
    outputs: Mapping[str, Any],
    place: Place = TOP,
) -> Mapping[str, Any]:
    """One step of the run (a worker's, for the step it claimed, entered at ``place``)."""
    return step_at(steps_of(definition, outputs, speculative=False), step_id, place)


def step_at(steps: Steps, step_id: str, place: Place) -> Mapping[str, Any]:
    """The step ``step_id`` entered at ``place``: a decided run's branches may each ask a
    step of the same id at once (decided by the branch's own decider); a definition's ids
    are unique."""
    if isinstance(steps, DecidedSteps):
        return steps.at(step_id, place)
    return steps[step_id]


def asked_step(decider_output: Any) -> Mapping[str, Any] | None:
    """The step a decider's output asks for, if it asks for one."""
    if _is_mapping(decider_output):
        call = decider_output.get("call")
        if _is_mapping(call):
            return call  # type: ignore[no-any-return]
    return None


def compensation_asked(decider_output: Any) -> Mapping[str, Any] | None:
    """The compensation step the decider's output names while the run compensates."""
    if _is_mapping(decider_output) and decider_output.get(COMPENSATING):
        return asked_step(decider_output)
    return None


def _is_mapping(value: Any) -> bool:
    """isinstance(value, Mapping), a dict (what JSON gives) found without the ABC's check:
    a walk of a decided run asks it several times per transition."""
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


# In a decider's output among the run's outputs, once the `parallel` it asked has forked:
# the id of the join row its branches meet at (every step of those branches records it as
# its place's ``fork_join``), by which a branch's place finds its decider.
JOIN_ROW = "join_row"


def join_id(parallel_id: str) -> str:
    """The id of the join a decider's `parallel` step's branches meet at (a dot: no id a
    decider asks for itself can take it)."""
    return f"{parallel_id}.join"


def branch_decider_id(parallel_id: str, branch: int, within: Sequence[int] = ()) -> str:
    """The id of the decider of branch ``branch`` (from 0) of a decider's `parallel`, asked
    by the decider of the branch at ``within`` (the branch numbers from the top level down;
    empty: the run's own decider). Two deciders live at once never share a place in the tree
    of branches, so their ids differ even when they ask parallels of the same id."""
    return ".".join([parallel_id, *map(str, within), str(branch)])


class DecidedSteps(Mapping[str, Mapping[str, Any]]):
    """A deciding run's steps: the decider goes on to the step it asked for; that step goes
    back to the decider. A `parallel` step it asked for forks into branches, each started
    by a decider of its own (``branch_decider_id``) that asks its branch's steps the same
    way and, once its branch has nothing more to ask, ends the branch (it arrives at the
    join, ``join_id``); the join goes back to the decider that asked the `parallel`.

    A step is found from where it is entered (``at``): at the top level, from the run's
    decider; on branch ``n`` of a fork, from that branch's decider. A branch's decider may
    ask a `parallel` too (they nest): the fork's join row, noted in the asking decider's
    output (``JOIN_ROW``), leads a place to its decider. So the live steps of a run are
    exactly the ones its live deciders ask for, one per decider."""

    def __init__(self, decider: Mapping[str, Any], outputs: Mapping[str, Any], *,
                 speculative: bool) -> None:  # fmt: skip
        self.decider = decider
        self.outputs = outputs  # the run's, as the walk updates them
        self.speculative = speculative
        # The compensation step the run is in, found from the run decider's output for as
        # long as that output is the very object the outputs hold: the walk replaces a
        # decider's output (record_output), never changes it in place, and asks at every
        # step it enters (eight times in the settle of a code run's step).
        self._seen_output: Any = _UNSEEN
        self._compensators: frozenset[str] = _NONE
        self._top_output: Any = _UNSEEN  # the output the top level's steps were found from
        self._top_steps: dict[str, Mapping[str, Any]] = {}

    def __getitem__(self, step_id: str) -> Mapping[str, Any]:
        return self.at(step_id, TOP)

    def at(self, step_id: str, place: Place) -> Mapping[str, Any]:
        """The step ``step_id`` entered at ``place``."""
        if place.fork_join is None:
            # The top level's steps, as the run decider's output (replaced, never changed
            # in place, by the walk) last made them: a settle looks up the step that ended,
            # the decider, then (its turn's new output) the decider and the step it asks.
            output = self.outputs.get(self.decider["id"])
            if output is not self._top_output:
                self._top_steps = self._live_steps(self.decider, output)
                self._top_output = output
            steps = self._top_steps
        else:
            if self.speculative:
                raise NeedsTransaction("a branch of a decided run's parallel")
            decider = self.decider_at(place)
            steps = self._live_steps(decider, self.outputs.get(decider["id"]))
        found = steps.get(step_id)
        if found is None:
            # Not the step this place's decider last asked for: one step per decider is
            # live, so this is a bug, and going back to the decider would decide twice (and
            # enter its step twice). The walk fails loudly instead.
            raise KeyError(step_id)
        return found

    def _live_steps(self, decider: Mapping[str, Any], output: Any) -> dict[str, Mapping[str, Any]]:
        """The live steps of ``decider``'s place by id, as its ``output`` makes them: the
        decider, and the step it asks for (with a parallel's join)."""
        decider_id = decider["id"]
        asked = asked_step(output)
        if asked is None:
            return {decider_id: decider}
        asked_id = asked["id"]
        forks = _forks(asked)
        compensating = bool(output.get(COMPENSATING))
        if self.speculative and (forks or compensating):
            raise NeedsTransaction("a decided run's parallel or compensation")
        steps: dict[str, Mapping[str, Any]] = {}
        if forks:
            join = join_id(asked_id)
            steps[join] = {"id": join, "type": JOIN_TYPE, "complete": asked.get("complete", "all"),
                           "next": decider_id}  # fmt: skip
            steps[asked_id] = {**asked, "next": join}
        elif compensating:
            steps[asked_id] = asked  # the plan goes on from it (compensation.py), not the decider
        else:
            # Failing for good, it goes back to the decider too: the function is told.
            steps[asked_id] = {**asked, "next": decider_id, "on_failure": decider_id}
        steps[decider_id] = {**decider, "next": asked_id}  # (written last: the decider wins)
        return steps

    def decider_at(self, place: Place) -> Mapping[str, Any]:
        """The decider of ``place``: the run's at the top level; on branch ``n`` of a
        `parallel` a live decider asked for (the run's, or a branch's: parallels nest), that
        branch's, whose ``within`` lists the parallels and branches from the top level down (a
        branch's decider is the one with a ``within``)."""
        if place.fork_join is None:
            return self.decider
        found = self._asker_of(place.fork_join)
        branch = place.branch if place.branch is not None else -1
        if found is None or not 0 <= branch < len(found[1]["branches"]):
            raise KeyError(f"no branch {place.branch} of a parallel step live")
        asker, fork = found
        within = [*asker.get("within", ()), [fork["id"], branch]]
        return {**self.decider, "id": fork["branches"][branch], "within": within}

    def _asker_of(self, join_row: int) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
        """The live decider whose `parallel` forked at ``join_row``, and that parallel: found
        from the run's decider down through the branches of the parallels live deciders
        asked (one step live per decider, so few)."""
        frontier: list[Mapping[str, Any]] = [self.decider]
        while frontier:
            decider = frontier.pop()
            output = self.outputs.get(decider["id"])
            fork = _parallel_asked(output)
            if fork is None or compensation_asked(output) is not None:
                continue
            assert isinstance(output, Mapping)
            noted = output.get(JOIN_ROW)
            if noted == join_row or (noted is None and decider is self.decider):
                # (Noted None at the top: a run forked before forks were noted; it has no
                # other.)
                return decider, fork
            if noted is None:
                continue
            within = decider.get("within", ())
            frontier.extend(
                {"id": branch_id, "within": [*within, [fork["id"], number]]}
                for number, branch_id in enumerate(fork["branches"])
            )
        return None

    def join_noted(self, place: Place, join_row: int) -> tuple[str, dict[str, Any]] | None:
        """The decider of ``place``, whose `parallel` just forked (or whose join a retry
        continues) at ``join_row``, and its output with that row noted (``JOIN_ROW``); None
        when that decider asked no parallel (a definition's fork is not a decided one)."""
        decider_id = self.decider_at(place)["id"]
        output = self.outputs.get(decider_id)
        if _parallel_asked(output) is None:
            return None
        assert isinstance(output, Mapping)
        return decider_id, {**output, JOIN_ROW: join_row}

    def outcome_noted(
        self, step_id: str, outcome: str | None, place: Place = TOP
    ) -> tuple[str, dict[str, Any]] | None:
        """The decider that asked for ``step_id``, which just ended, and its output with
        the step's outcome noted as ``outcome`` (the step's row keeps only its output; the
        decider's next turn reads the outcome here and records it); None when there is
        none to note."""
        if outcome is None:
            return None
        decider_id = self.decider_at(place)["id"]
        decider_output = self.outputs.get(decider_id)
        asked = asked_step(decider_output)
        if asked is None or asked["id"] != step_id:
            return None
        assert isinstance(decider_output, Mapping)
        return decider_id, {**decider_output, "outcome": outcome}

    def compensators(self) -> frozenset[str]:
        """The compensation step the run is in, if it compensates (compensation.py)."""
        output = self.outputs.get(self.decider["id"])
        if output is not self._seen_output:
            asked = compensation_asked(output)
            self._compensators = frozenset([asked["id"]]) if asked is not None else _NONE
            self._seen_output = output
        return self._compensators

    def decides(self, step_id: str, place: Place) -> bool:
        """Whether ``step_id`` at ``place`` is a decider (the run's, or a branch's): the only
        steps of a deciding type a decided run has (code cannot call one)."""
        return bool(step_id == self.decider_at(place)["id"])

    def __iter__(self) -> Iterator[str]:
        asked = asked_step(self.outputs.get(self.decider["id"]))
        return iter([self.decider["id"], *([asked["id"]] if asked else [])])

    def __len__(self) -> int:
        return len(list(iter(self)))


_NONE: frozenset[str] = frozenset()
_UNSEEN = object()  # no output looked at yet (None is an output: the decider's not run yet)

JOIN_TYPE = "join"  # the step type a decider's `parallel` branches meet at (steptypes.JOIN)


def _parallel_asked(decider_output: Any) -> Mapping[str, Any] | None:
    """The `parallel` a decider's output asks for, if it asks for one."""
    asked = asked_step(decider_output)
    return asked if asked is not None and _forks(asked) else None


def _forks(step: Mapping[str, Any]) -> bool:
    return registry.forking(str(step.get("type")))
