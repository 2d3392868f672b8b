"""What a published definition's steps lead to: the ordinary edges (``next``, ``on_failure``
and the step ids a type refers to, such as a parallel's branches), what is reached from a
step, and which parallel's fork a step runs inside. A re-run from a step (services/rerun.py)
asks these of the run's version; the validator has made sure every reference is a step."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from .registry import registry

__all__ = ["enclosing_fork", "reached", "successors"]


def successors(definition: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each step's ordinary edges, as the validator collects them."""
    edges: dict[str, list[str]] = {}
    for step in definition["steps"]:
        targets: list[str] = []
        following = step.get("next")
        if isinstance(following, str):
            targets.append(following)
        elif isinstance(following, dict):
            targets += [t for t in following.values() if isinstance(t, str)]
        if isinstance(step.get("on_failure"), str):
            targets.append(step["on_failure"])
        step_type = registry.get(step["type"])
        if step_type is not None:
            targets += [t for t in step_type.references(step).values() if isinstance(t, str)]
        edges[step["id"]] = targets
    return edges


def reached(
    origins: Iterable[str], edges: Mapping[str, list[str]], *, stop: Iterable[str] = ()
) -> set[str]:
    """The steps reachable from ``origins`` (included) without entering a step of ``stop``."""
    stopped = set(stop)
    seen = {s for s in origins if s not in stopped}
    queue = deque(seen)
    while queue:
        for target in edges.get(queue.popleft(), []):
            if target not in seen and target not in stopped:
                seen.add(target)
                queue.append(target)
    return seen


def enclosing_fork(definition: Mapping[str, Any], step_id: str) -> str | None:
    """The id of the parallel (with a join) whose branches reach ``step_id`` before the join:
    the step runs inside that fork. None for a step of the top level (a parallel without a
    join runs its branches there)."""
    edges = successors(definition)
    for step in definition["steps"]:
        step_type = registry.get(step["type"])
        join = step.get("next")
        if step_type is None or not step_type.forks or not isinstance(join, str):
            continue
        if step_id in reached(step.get("branches", []), edges, stop=[join]):
            return str(step["id"])
    return None
