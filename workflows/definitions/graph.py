"""Graph algorithms over step references, for the validator's loop check.

A definition's steps form a directed graph (a step points at the steps its ``next``,
``on_failure`` and type-specific fields name). The validator finds loops as strongly
connected components and reports the shortest cycle through each one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

__all__ = ["shortest_cycle", "strongly_connected_components"]


def shortest_cycle(first: str, members: set[str], successors: dict[str, list[str]]) -> list[str]:
    """The shortest path first -> ... -> first inside one strongly connected component."""
    parent: dict[str, str] = {}
    queue = deque([first])
    while queue:
        node = queue.popleft()
        for target in successors[node]:
            if target == first:
                path = [node]
                while path[-1] != first:
                    path.append(parent[path[-1]])
                return list(reversed(path))
            if target in members and target not in parent:
                parent[target] = node
                queue.append(target)
    return [first]  # not reached for a real cycle


def strongly_connected_components(
    nodes: Iterable[str], successors: Mapping[str, Iterable[str]]
) -> list[list[str]]:
    """Tarjan's algorithm, iterative (definitions may hold thousands of steps)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(successors.get(root, ())))]
        while work:
            node, targets = work[-1]
            descended = False
            for target in targets:
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(successors.get(target, ()))))
                    descended = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components
