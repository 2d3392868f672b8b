"""A drawn automation (tests/generated_automations.py) written again as a code workflow: the
source of a Python module registering ``@workflow(name, version=1)`` functions that enter the
definition's steps one for one (same step ids, same fields, called through ``ctx.step``), with
the definition's control flow written as Python:

- a branch on the input is ``if run_input[flag]: ... else: ...``;
- a loop is its counter's ``set`` steps around a ``for`` loop calling the body's ids again
  (each call of an id enters its next iteration, as the definition's loop back does);
- a signal wait's ``timed_out`` path, an approval's or a task's other outcomes are an ``if``
  on what ``ctx.wait_signal`` or ``ctx.step_result`` gave back;
- parallel branches are ``ctx.parallel(id, branch, branch, complete="all")``, each branch a
  function of its branch context, when the engine has it (``PARALLEL_IN_CODE``);
- the definition's ``end`` is the function's return.

So the definition's ``branch``, ``parallel``, ``join`` and ``end`` steps have no twin row: they
are the Python around the calls (``structural_ids``). Everything else must match row for row.
"""

from __future__ import annotations

from hypothesis import strategies as st

from workflows.plugins.code import Context

from .generated_automations import (
    Automation,
    Block,
    Branch,
    Loop,
    Parallel,
    Person,
    Sequence,
    SignalWait,
    Single,
    Step,
    sequences,
    walk,
)

# ctx.parallel(id, *branches, complete="all") is built on its own; until the engine has it,
# twins are drawn without parallel blocks (and gain them, unchanged, once it is there).
# Parallels nest in code as in a definition: a branch's own ctx.parallel is drawn too.
PARALLEL_IN_CODE = hasattr(Context, "parallel")

# What the definition's end step returns: the twin returns the same.
END_OUTPUT = {"ok": True}
NOT_FIELDS = ("id", "type", "next")
INDENT = "    "


def twin_automations() -> st.SearchStrategy[Automation]:
    """Automations a code workflow can express today: every step type the generated test
    draws, every shape (parallels inside parallels' branches included) but parallel
    branches while ``ctx.parallel`` is missing."""
    return sequences(parallel=PARALLEL_IN_CODE).map(Automation)


def module_source(workflows: dict[str, Automation], *, doc: str = "") -> str:
    """A module registering each automation as the code workflow of its name, version 1."""
    lines = [f'"""{doc or "Code workflows written from drawn automations."}"""', "",
             "from typing import Any", "", "from workflows.plugins.code import Context, workflow"
             ]  # fmt: skip
    for n, (name, automation) in enumerate(workflows.items()):
        lines += ["", "", *function_source(name, f"twin_{n}", automation)]
    return "\n".join(lines) + "\n"


def function_source(name: str, function: str, automation: Automation) -> list[str]:
    """One ``@workflow`` function: the automation's steps called in its order."""
    writer = _Writer(automation)
    setup = writer.step_of("setup")
    body = [writer.call("ctx", setup), *writer.sequence(automation.body, "ctx"),
            f"return {END_OUTPUT!r}"]  # fmt: skip
    return [f"@workflow({name!r}, version=1)",
            f"def {function}(ctx: Context, run_input: dict[str, Any]) -> Any:",
            *_indented(body)]  # fmt: skip


def structural_ids(automation: Automation) -> set[str]:
    """The definition's steps that are Python control flow in the twin (no row of their own
    in the code run): branches (on the input, and each loop's branch back), parallel
    forks and joins, and the end."""
    ids = {"done"}
    for block in walk(automation.body):
        if isinstance(block, Branch | Parallel):
            ids.update(block.ids)
        elif isinstance(block, Loop):
            ids.add(block.ids[2])  # the branch back; its counter's set steps are called
    return ids


def has_parallel(automation: Automation) -> bool:
    return any(isinstance(b, Parallel) for b in walk(automation.body))


class _Writer:
    """Python lines for blocks; ``ctx`` names the context a block's calls go through (the
    run's, or a parallel branch's)."""

    def __init__(self, automation: Automation) -> None:
        self.steps: dict[str, Step] = {s["id"]: s for s in automation.definition["steps"]}

    def step_of(self, step_id: str) -> Step:
        return self.steps[step_id]

    def call(self, ctx: str, step: Step) -> str:
        fields = {k: v for k, v in step.items() if k not in NOT_FIELDS}
        return f"{ctx}.step({step['id']!r}, {step['type']!r}, **{fields!r})"

    def sequence(self, sequence: Sequence, ctx: str) -> list[str]:
        lines: list[str] = []
        for block in sequence.blocks:
            lines += self.block(block, ctx)
        return lines or ["pass"]

    def block(self, block: Block, ctx: str) -> list[str]:
        if isinstance(block, Single):
            return [self.call(ctx, self.step_of(block.ids[0]))]
        if isinstance(block, SignalWait):
            return self.signal_wait(block, ctx)
        if isinstance(block, Person):
            return self.person(block, ctx)
        if isinstance(block, Branch):
            return [f"if run_input[{block.flag!r}]:", *_indented(self.sequence(block.yes, ctx)),
                    "else:", *_indented(self.sequence(block.no, ctx))]  # fmt: skip
        if isinstance(block, Loop):
            init, count, _ = block.ids
            body = [*self.sequence(block.body, ctx), self.call(ctx, self.step_of(count))]
            return [self.call(ctx, self.step_of(init)),
                    f"for _ in range({block.times}):", *_indented(body)]  # fmt: skip
        if isinstance(block, Parallel):
            return self.parallel(block, ctx)
        raise TypeError(block)

    def signal_wait(self, block: SignalWait, ctx: str) -> list[str]:
        sid, marker = block.ids
        wait = self.step_of(sid)
        call = (f"{ctx}.wait_signal({sid!r}, signal={wait['signal']!r}, "
                f"correlation={wait['correlation']!r}, timeout={wait['timeout']!r})")  # fmt: skip
        return [f"if {call}.timed_out:", INDENT + self.call(ctx, self.step_of(marker))]

    def person(self, block: Person, ctx: str) -> list[str]:
        sid, marker = block.ids
        goes_on = "approved" if block.kind == "approval" else "submitted"
        call = self.call(ctx, self.step_of(sid)).replace(f"{ctx}.step(", f"{ctx}.step_result(", 1)
        return [f"if {call}.outcome != {goes_on!r}:", INDENT + self.call(ctx, self.step_of(marker))]

    def parallel(self, block: Parallel, ctx: str) -> list[str]:
        fork = block.ids[0]
        lines: list[str] = []
        names = []
        for n, branch in enumerate(block.branches, start=1):
            name = f"branch_{fork}_{n}"
            names.append(name)
            inner = f"c_{fork}_{n}"  # each branch's calls go through its own context
            body = [*self.sequence(branch, inner), "return None"]
            lines += [f"def {name}({inner}: Context) -> Any:", *_indented(body)]
        lines.append(f"{ctx}.parallel({fork!r}, {', '.join(names)}, complete='all')")
        return lines


def _indented(lines: list[str]) -> list[str]:
    return [INDENT + line for line in lines]
