"""Valid automations drawn from the whole step-type catalogue, with the path each input takes.

An automation is drawn as a sequence of *blocks* (Hypothesis strategies, so a failure shrinks
to a small definition): an effect, a wait, a signal wait whose signal is sent or not, an
approval or a task decided by a scripted person, a branch on the run's input, parallel
branches that meet at a join, and a loop with a bound. Each block compiles to steps that lead
to the next block, and predicts, for one run's input, how many times each of its steps is
entered (``Visits``): the run's step rows must show exactly that, an effect step's provider
must have been called once per entry (its iteration), and the run must succeed.

The blocks know their own meaning, so the prediction is not a second engine: a branch takes
the side its input flag names, a loop runs its body ``times`` times, a signal wait whose
signal was sent is received, else it times out, a person decides as scripted.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

Visits = Counter[str]  # step id -> how many times one run enters it
Step = dict[str, Any]

# Effect step types and the step each makes (connections named as the harness makes them).
EFFECTS = ("http", "email", "slack_message", "model", "crm_upsert")
PAST = "2000-01-01T00:00:00+00:00"  # a wait_until whose moment has passed fires at once


@dataclass(frozen=True)
class RunInput:
    """What one run is given: its correlation key and the flags its branches read."""

    key: str
    flags: dict[str, bool]

    def as_json(self, *, soon: str, api_url: str) -> dict[str, Any]:
        return {"key": self.key, "soon": soon, "api_url": api_url, **self.flags}


class Ids:
    """Step ids in the order they are made: s1, s2, ..."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def new(self) -> str:
        return f"s{next(self._next)}"


@dataclass(eq=False)
class Block:
    """A piece of an automation: compile(ids, next_id) gives its first step's id and its
    steps; visits(run) what one run enters. ``ids``: its own steps' ids, once compiled."""

    ids: tuple[str, ...] = field(default=(), init=False, repr=False)

    def compile(self, ids: Ids, next_id: str) -> tuple[str, list[Step]]:
        raise NotImplementedError

    def visits(self, run: RunInput) -> Visits:
        raise NotImplementedError


@dataclass(eq=False)
class Single(Block):
    """One step that goes on to the next block whatever happens: an effect, a set, a noop, a
    wait of 1 or 2 s, a wait_until (a moment past, or a second after the start)."""

    kind: str
    seconds: int = 0

    def compile(self, ids: Ids, next_id: str) -> tuple[str, list[Step]]:
        sid = ids.new()
        self.ids = (sid,)
        return sid, [{"id": sid, **_fields(self.kind, sid, self.seconds), "next": next_id}]

    def visits(self, run: RunInput) -> Visits:
        return Counter({self.ids[0]: 1})


def _fields(kind: str, sid: str, seconds: int) -> Step:
    if kind == "set":
        return {"type": "set", "values": {f"v_{sid}": "{{ input.key }}"}}
    if kind == "noop":
        return {"type": "noop", "output": {"at": sid}}
    if kind == "wait":
        return {"type": "wait", "duration": f"{seconds}s"}
    if kind == "wait_until":
        return {"type": "wait_until", "at": "{{ input.soon }}" if seconds else PAST}
    if kind == "http":
        return {"type": "http", "connection": "api",
                "request": {"method": "POST", "url": "{{ vars.api_url }}/items",
                            "body": {"run": "{{ run.id }}", "step": sid}}}  # fmt: skip
    if kind == "email":
        return {"type": "email", "connection": "mail", "to": "{{ input.key }}@example.com",
                "subject": f"{sid}", "body": "Hello from {{ run.id }}"}  # fmt: skip
    if kind == "slack_message":
        return {"type": "slack_message", "connection": "slack", "channel": "C0GEN",
                "text": f"{sid} of {{{{ run.id }}}}"}  # fmt: skip
    if kind == "model":
        return {"type": "model", "connection": "model", "prompt": model_marker("{{ run.id }}", sid)}
    if kind == "crm_upsert":
        return {"type": "crm_upsert", "connection": "crm", "object": "contacts",
                "external_id": f"{{{{ run.id }}}}-{sid}", "fields": {"step": sid}}  # fmt: skip
    raise ValueError(kind)


def model_marker(run: str, sid: str) -> str:
    """A model step's prompt, which names its run and step (the model API gets no key)."""
    return f"<model {run}/{sid}>"


@dataclass(eq=False)
class SignalWait(Block):
    """A wait_signal on the run's key: the signal is sent (received) or not (timed_out after
    ``timeout`` seconds, through a marker step)."""

    sent: bool
    timeout: int

    def compile(self, ids: Ids, next_id: str) -> tuple[str, list[Step]]:
        sid, marker = ids.new(), ids.new()
        self.ids = (sid, marker)
        # A signal that is sent gets an hour: the test sends it once it sees the step wait,
        # and on a busy machine a second can pass first (the prediction would not hold).
        timeout = "1h" if self.sent else f"{self.timeout}s"
        wait = {"id": sid, "type": "wait_signal", "signal": f"sig.{sid}",
                "correlation": "{{ input.key }}", "timeout": timeout,
                "next": {"received": next_id, "timed_out": marker}}  # fmt: skip
        note = {"id": marker, "type": "set", "values": {f"timed_out_{sid}": True},
                "next": next_id}  # fmt: skip
        return sid, [wait, note]

    def visits(self, run: RunInput) -> Visits:
        sid, marker = self.ids
        return Counter({sid: 1} if self.sent else {sid: 1, marker: 1})


@dataclass(eq=False)
class Person(Block):
    """An approval (approve, reject, or nobody within a second: timed_out) or a task
    (submitted), each outcome through its own path so the run's steps show which."""

    kind: str  # "approval" | "task"
    decision: str  # approval: "approve" | "reject" | "timeout"; task: "submit"

    def compile(self, ids: Ids, next_id: str) -> tuple[str, list[Step]]:
        sid, marker = ids.new(), ids.new()
        self.ids = (sid, marker)
        deadline = "1s" if self.decision == "timeout" else "1h"
        if self.kind == "approval":
            outcomes = {"approved": next_id, "rejected": marker, "timed_out": marker}
            ask = {"id": sid, "type": "approval", "approvers": ["*"], "deadline": deadline,
                   "message": f"{sid} for {{{{ input.key }}}}?", "next": outcomes}  # fmt: skip
        else:
            ask = {"id": sid, "type": "task", "assignees": ["*"], "deadline": deadline,
                   "message": f"{sid}", "form": {"fields": [{"name": "x", "type": "text"}]},
                   "next": {"submitted": next_id, "timed_out": marker}}  # fmt: skip
        note = {"id": marker, "type": "noop", "next": next_id}
        return sid, [ask, note]

    def visits(self, run: RunInput) -> Visits:
        sid, marker = self.ids
        goes_on = self.decision in ("approve", "submit")
        return Counter({sid: 1} if goes_on else {sid: 1, marker: 1})


@dataclass(eq=False)
class Sequence(Block):
    blocks: tuple[Block, ...]

    def compile(self, ids: Ids, next_id: str) -> tuple[str, list[Step]]:
        steps: list[Step] = []
        first = next_id
        compiled = []
        for block in reversed(self.blocks):
            first, made = block.compile(ids, first)
            compiled.append(made)
        for made in reversed(compiled):
            steps.extend(made)
        return first, steps

    def visits(self, run: RunInput) -> Visits:
        total: Visits = Counter()
        for block in self.blocks:
            total += block.visits(run)
        return total


@dataclass(eq=False)
class Branch(Block):
    """A branch on the input flag ``flag``: ``yes`` when it is true, else ``no``."""

    flag: str
    yes: Sequence
    no: Sequence

    def compile(self, ids: Ids, next_id: str) -> tuple[str, list[Step]]:
        sid = ids.new()
        self.ids = (sid,)
        yes_first, yes_steps = self.yes.compile(ids, next_id)
        no_first, no_steps = self.no.compile(ids, next_id)
        when = [{"outcome": "yes", "if": f"input.{self.flag}"}]
        branch = {"id": sid, "type": "branch", "when": when,
                  "next": {"yes": yes_first, "default": no_first}}  # fmt: skip
        return sid, [branch, *yes_steps, *no_steps]

    def visits(self, run: RunInput) -> Visits:
        side = self.yes if run.flags[self.flag] else self.no
        return Counter({self.ids[0]: 1}) + side.visits(run)


@dataclass(eq=False)
class Parallel(Block):
    """Branches that meet at a join (all of them), then go on."""

    branches: tuple[Sequence, ...]

    def compile(self, ids: Ids, next_id: str) -> tuple[str, list[Step]]:
        sid, join = ids.new(), ids.new()
        self.ids = (sid, join)
        firsts, steps = [], []
        for branch in self.branches:
            first, made = branch.compile(ids, join)
            firsts.append(first)
            steps.extend(made)
        fork = {"id": sid, "type": "parallel", "branches": firsts, "next": join}
        meet = {"id": join, "type": "join", "wait_for": firsts, "next": next_id}
        return sid, [fork, *steps, meet]

    def visits(self, run: RunInput) -> Visits:
        total = Counter(dict.fromkeys(self.ids, 1))
        for branch in self.branches:
            total += branch.visits(run)
        return total


@dataclass(eq=False)
class Loop(Block):
    """``body`` run ``times`` times: a counter set before it, counted up after it, and a
    branch back while it is below ``times``."""

    body: Sequence
    times: int

    def compile(self, ids: Ids, next_id: str) -> tuple[str, list[Step]]:
        init, count, again = ids.new(), ids.new(), ids.new()
        self.ids = (init, count, again)
        name = f"n_{init}"
        body_first, body_steps = self.body.compile(ids, count)
        steps = [
            {"id": init, "type": "set", "values": {name: 0}, "next": body_first},
            *body_steps,
            {"id": count, "type": "set", "values": {name: f"{{{{ (vars.{name} | int) + 1 }}}}"},
             "next": again},
            {"id": again, "type": "branch",
             "when": [{"outcome": "again", "if": f"(vars.{name} | int) < {self.times}"}],
             "next": {"again": body_first, "default": next_id}},
        ]  # fmt: skip
        return init, steps

    def visits(self, run: RunInput) -> Visits:
        init, count, again = self.ids
        total: Visits = Counter({init: 1, count: self.times, again: self.times})
        body = self.body.visits(run)
        for _ in range(self.times):
            total += body
        return total


# --- the strategies ----------------------------------------------------------------------

FLAGS = ("f1", "f2", "f3")


def singles() -> st.SearchStrategy[Block]:
    return st.one_of(
        st.sampled_from(EFFECTS).map(Single),
        st.sampled_from(["set", "noop"]).map(Single),
        st.builds(Single, st.just("wait"), st.integers(1, 2)),
        st.builds(Single, st.just("wait_until"), st.integers(0, 1)),
        st.builds(SignalWait, st.booleans(), st.integers(1, 2)),
        st.builds(Person, st.just("approval"), st.sampled_from(["approve", "reject", "timeout"])),
        st.builds(Person, st.just("task"), st.just("submit")),
    )


def blocks(depth: int = 2, *, parallel: bool = True) -> st.SearchStrategy[Block]:
    """Mostly single steps (so every type meets every other often), sometimes a shape (a
    parallel's branches may hold parallels of their own). ``parallel=False`` leaves parallel
    branches out."""
    if depth == 0:
        return singles()
    inner = sequences(depth - 1, max_size=3, parallel=parallel)
    shapes = [
        singles(),
        singles(),
        singles(),
        st.builds(Branch, st.sampled_from(FLAGS), inner, inner),
        st.builds(Loop, inner, st.integers(1, 2)),
    ]
    if parallel:
        shapes.insert(4, st.builds(Parallel, st.lists(inner, min_size=2, max_size=3).map(tuple)))
    return st.one_of(*shapes)


def sequences(
    depth: int = 2, *, max_size: int = 6, parallel: bool = True
) -> st.SearchStrategy[Sequence]:
    drawn = blocks(depth, parallel=parallel)
    return st.lists(drawn, min_size=1, max_size=max_size).map(lambda items: Sequence(tuple(items)))


@dataclass
class Automation:
    """A drawn automation: its definition, and what each of its steps is."""

    body: Sequence
    definition: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        # Each draw is compiled anew (Hypothesis reuses block objects across examples).
        self.body = _fresh(self.body)
        first, steps = self.body.compile(Ids(), "done")
        setup = {"id": "setup", "type": "set", "values": {"api_url": "{{ input.api_url }}"},
                 "next": first}  # fmt: skip
        self.definition = {
            "start": "setup",
            "limits": {"max_steps": 2000},
            "steps": [setup, *steps, {"id": "done", "type": "end", "output": {"ok": True}}],
        }

    def visits(self, run: RunInput) -> Visits:
        return Counter({"setup": 1, "done": 1}) + self.body.visits(run)

    def steps_of(self, *types: str) -> Iterator[Step]:
        return (s for s in self.definition["steps"] if s["type"] in types)

    def decision_for(self, step_id: str) -> str:
        """What the scripted person answers at ``step_id`` (an approval or a task)."""
        for block in walk(self.body):
            if isinstance(block, Person) and block.ids[0] == step_id:
                return block.decision
        raise KeyError(step_id)

    def signal_sent(self, step_id: str) -> bool:
        """Whether the signal of the signal wait ``step_id`` is sent (else it times out)."""
        return any(isinstance(b, SignalWait) and b.sent and b.ids[0] == step_id
                   for b in walk(self.body))  # fmt: skip


def walk(block: Block) -> Iterator[Block]:
    yield block
    children: tuple[Block, ...] = ()
    if isinstance(block, Sequence):
        children = block.blocks
    elif isinstance(block, Branch):
        children = (block.yes, block.no)
    elif isinstance(block, Parallel):
        children = block.branches
    elif isinstance(block, Loop):
        children = (block.body,)
    for child in children:
        yield from walk(child)


def _fresh(block: Block) -> Any:
    """A copy of ``block``'s tree with no ids assigned (each Automation compiles its own)."""
    copy: Callable[[Any], Any] = _fresh
    if isinstance(block, Sequence):
        return Sequence(tuple(copy(b) for b in block.blocks))
    if isinstance(block, Branch):
        return Branch(block.flag, copy(block.yes), copy(block.no))
    if isinstance(block, Parallel):
        return Parallel(tuple(copy(b) for b in block.branches))
    if isinstance(block, Loop):
        return Loop(copy(block.body), block.times)
    if isinstance(block, Single):
        return Single(block.kind, block.seconds)
    if isinstance(block, SignalWait):
        return SignalWait(block.sent, block.timeout)
    if isinstance(block, Person):
        return Person(block.kind, block.decision)
    raise TypeError(block)


def automations() -> st.SearchStrategy[Automation]:
    return sequences().map(Automation)


def run_inputs() -> st.SearchStrategy[dict[str, bool]]:
    return st.fixed_dictionaries({flag: st.booleans() for flag in FLAGS})
