"""Shapes of parallel branches the engine cannot run as their author means: refused at publish.

A `parallel` with a `next` forks its branches under one join row, and every step a branch
enters belongs to that fork until its path reaches the join or ends (engine/forks.py). Two
shapes make that ambiguous, and each used to be accepted and then run differently from what
the definition says:

- ``join_shared``: one join step named as the meeting point of two parallel steps. Each fork
  opens its own row for it, so the inner fork's branches meet, continue past the join as a
  branch of the outer fork, and the outer join waits for an arrival that may never come (or
  the run ends with the outer join still open).
- ``branch_leaves_fork``: a step reachable from a branch without passing its join, and also
  after the join. A branch reaching it runs it inside the fork, and the run runs it again
  once the branches have met: an email step there is sent twice. An end step is exempt
  (it ends the run wherever it is reached).

Each issue names both steps: the parallel and the step (or the other parallel).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple


class ForkIssue(NamedTuple):
    code: str
    message: str
    step: str
    field: str


def fork_issues(
    steps: Mapping[str, Mapping[str, Any]],
    successors: Mapping[str, list[str]],
    terminal: set[str],
    forking: set[str],
) -> list[ForkIssue]:
    """The issues of every parallel-with-join in ``steps`` (step id -> step, in definition
    order), over the reference graph ``successors``; ``terminal``: ids of end steps;
    ``forking``: ids of the steps whose type forks (StepType.forks: `parallel`)."""
    joins: dict[str, list[str]] = {}
    for sid, step in steps.items():
        join = step.get("next") if sid in forking else None
        if isinstance(join, str) and join in steps:
            joins.setdefault(join, []).append(sid)
    issues = [_shared(join, forks) for join, forks in joins.items() if len(forks) > 1]
    for join, forks in joins.items():
        for fork in forks:
            issue = _leaves(fork, join, steps, successors, terminal)
            if issue is not None:
                issues.append(issue)
    return issues


def _shared(join: str, forks: list[str]) -> ForkIssue:
    first, second = forks[0], forks[1]
    return ForkIssue(
        "join_shared",
        f'join "{join}" is where the branches of parallel "{first}" and of parallel "{second}" '
        "meet: give each parallel a join of its own",
        second,
        "next",
    )


def _leaves(
    fork: str,
    join: str,
    steps: Mapping[str, Mapping[str, Any]],
    successors: Mapping[str, list[str]],
    terminal: set[str],
) -> ForkIssue | None:
    branches = [b for b in steps[fork].get("branches", []) if isinstance(b, str) and b in steps]
    inside = _reached(branches, successors, stop={join})
    after = _reached(successors.get(join, []), successors, stop={fork})
    both = [sid for sid in steps if sid in inside and sid in after and sid not in terminal]
    if not both:
        return None
    return ForkIssue(
        "branch_leaves_fork",
        f'step "{both[0]}" is reached from a branch of parallel "{fork}" without passing its '
        f'join "{join}", and again after the join: it would run inside the branch and once '
        f'more after the branches meet; lead the branch to "{join}" instead',
        fork,
        "branches",
    )


def _reached(
    starts: Iterable[str], successors: Mapping[str, list[str]], *, stop: set[str]
) -> set[str]:
    """Steps reachable from ``starts`` (included) without entering a step of ``stop``."""
    seen = {s for s in starts if s not in stop}
    queue = deque(seen)
    while queue:
        for target in successors.get(queue.popleft(), []):
            if target not in seen and target not in stop:
                seen.add(target)
                queue.append(target)
    return seen
