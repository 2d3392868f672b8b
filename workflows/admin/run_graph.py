"""The picture of a run on its page: its version's graph, drawn as SVG on the server.

Steps are laid out in layers down from ``start`` (a step's layer is the longest path to it
once the edges that close loops are set aside), ordered within a layer by where their
predecessors stand, and drawn with their edges: ``next`` (one step, or an outcome each),
``on_failure``, a ``parallel``'s branches and the join its branches meet at. Each step is
coloured by what the run did there (its newest entry's status), the edges the run took are
drawn bold, and each step links to its row on the page (``#step-<id>``, or the page of
that step's rows when they are not in the window shown).

No script and no outside service: the page's SVG is plain markup, so it is drawn the same in
every browser and refreshed by replacing it (run_live.py). A definition may hold thousands
of steps; only the first ``MAX_NODES`` (by layer) are drawn, and the picture says how many
were left out.

A run whose steps are decided as it goes (a code workflow's: its definition holds one
deciding step) is drawn from the steps it took instead, in the order it called them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.db.models.fields.json import KeyTextTransform

from ..definitions.registry import registry
from ..engine.decided import deciding_step
from ..models import Run, Step
from ..states import StepStatus

MAX_NODES = 200
MAX_TAKEN_ROWS = 5_000  # a decided run's steps read for its picture (steps_taken)
NODE_WIDTH, NODE_HEIGHT = 160, 42
GAP_X, GAP_Y = 36, 58
MARGIN = 24
LOOP_REACH = 70  # how far a loop's edge bulges out to the right of its steps
WAYPOINT_WIDTH = 14  # the room a link passing through a layer takes in it
MAX_ROUTED_SPAN = 12  # layers a link may pass through between the steps
MAX_WAYPOINTS = 2_000
LABEL_CHARS = 20
BARYCENTER_SWEEPS = 4

# What the picture says of a step, from its newest entry's status.
NOT_REACHED = "not-reached"
SHOWN_STATUS: dict[str, str] = {
    StepStatus.DONE: "done",
    StepStatus.READY: "running",  # due to run: as good as running, for the picture
    StepStatus.RUNNING: "running",
    StepStatus.WAITING: "waiting",
    StepStatus.FAILED: "failed",
    StepStatus.CANCELLED: "cancelled",
}
CURRENT = {"running", "waiting"}  # where the run is now


@dataclass(frozen=True)
class Link:
    """One reference of the definition: ``source`` leads to ``target``."""

    source: str
    target: str
    label: str  # an outcome, "on failure", "branch 1", "join"; "" for a plain next
    kind: str  # next, outcome, failure, branch, join
    order: int  # its position among its source's references


@dataclass(frozen=True)
class StepMark:
    """What the run did at one step: its newest entry."""

    status: str
    entries: int  # how often the run entered it (its newest iteration)
    outcome: str | None  # a step whose output names an outcome (a branch's)


@dataclass(frozen=True)
class DrawnNode:
    step_id: str
    type: str
    label: str
    state: str
    entries: int
    x: int
    y: int
    current: bool
    href: str  # its row on the run page

    @property
    def title(self) -> str:
        entered = f", entered {self.entries} times" if self.entries > 1 else ""
        return f"{self.step_id} ({self.type}): {self.state.replace('-', ' ')}{entered}"


@dataclass(frozen=True)
class DrawnEdge:
    path: str
    label: str
    label_x: int
    label_y: int
    kind: str
    taken: bool


@dataclass(frozen=True)
class Picture:
    nodes: list[DrawnNode]
    edges: list[DrawnEdge]
    width: int
    height: int
    left_out: int  # steps of the definition not drawn (beyond MAX_NODES)

    node_width: int = NODE_WIDTH
    node_height: int = NODE_HEIGHT

    @property
    def legend(self) -> list[str]:
        return ["done", "running", "waiting", "failed", "cancelled", NOT_REACHED]


# --- the definition's graph ------------------------------------------------------------------


def definition_steps(definition: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Step id -> step, in definition order (a published definition is valid: ids unique)."""
    steps = definition.get("steps")
    if not isinstance(steps, list):
        return {}
    found: dict[str, Mapping[str, Any]] = {}
    for step in steps:
        if isinstance(step, Mapping) and isinstance(step.get("id"), str):
            found.setdefault(step["id"], step)
    return found


def links(steps: Mapping[str, Mapping[str, Any]]) -> list[Link]:
    """Every reference between steps that exist: next, on_failure, and the type's own
    (a parallel's branches). A parallel's ``next`` is where its branches meet: a join."""
    found: list[Link] = []
    for sid, step in steps.items():
        step_type = registry.get(str(step.get("type")))
        forks = step_type is not None and step_type.forks
        refs: list[tuple[str, str, str]] = []
        nxt = step.get("next")
        if isinstance(nxt, str):
            refs.append((nxt, "join" if forks else "", "join" if forks else "next"))
        elif isinstance(nxt, Mapping):
            refs += [(str(target), str(key), "outcome") for key, target in nxt.items()]
        if isinstance(step.get("on_failure"), str):
            refs.append((step["on_failure"], "on failure", "failure"))
        if step_type is not None:
            try:
                own = step_type.references(step)
            except Exception:  # a plugin's bug must not break the run page
                own = {}
            for number, target in enumerate(own.values(), start=1):
                refs.append((str(target), f"branch {number}" if forks else "", "branch"))
        found += [
            Link(sid, target, label, kind, order)
            for order, (target, label, kind) in enumerate(refs)
            if target in steps
        ]
    return found


def layers(start: str | None, order: list[str], edges: list[Link]) -> dict[str, int]:
    """Each step's layer: the longest path from ``start`` once loops' closing edges (those
    back to a step still being explored, found depth first) are set aside. Steps ``start``
    does not reach (a draft's) follow, layered from themselves. Iterative throughout:
    definitions may hold thousands of steps."""
    successors: dict[str, list[str]] = {sid: [] for sid in order}
    for edge in edges:
        successors[edge.source].append(edge.target)
    roots = ([start] if start in successors else []) + order
    finished: list[str] = []  # depth-first postorder
    state: dict[str, int] = {}  # 1: on the path being explored, 2: done
    forward: dict[str, list[str]] = {sid: [] for sid in order}
    for root in roots:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(successors[root]))]
        while stack:
            node, targets = stack[-1]
            for target in targets:
                if state.get(target) == 1:
                    continue  # closes a loop: not a layering edge
                forward[node].append(target)
                if target not in state:
                    state[target] = 1
                    stack.append((target, iter(successors[target])))
                    break
            else:
                stack.pop()
                state[node] = 2
                finished.append(node)
    layer = dict.fromkeys(order, 0)
    for node in reversed(finished):  # a topological order of the forward edges
        for target in forward[node]:
            layer[target] = max(layer[target], layer[node] + 1)
    return layer


@dataclass(frozen=True)
class Arrangement:
    """The rows of the picture, left to right: step ids, and the waypoints (``~<link>:<k>``)
    a link that skips layers passes through, so it runs between the steps, not across them.
    ``routes``: each such link's waypoints, top to bottom, by its index in the links."""

    rows: list[list[str]]
    routes: dict[int, list[str]]

    def steps_by_row(self) -> list[list[str]]:
        return [[item for item in row if not item.startswith("~")] for row in self.rows]


def arrange(layer: Mapping[str, int], order: list[str], edges: list[Link]) -> Arrangement:
    """The steps of each layer, left to right: first in definition order, then each moved
    towards the mean position of what leads to it (a few sweeps down). A link down more than
    one layer gets a waypoint in each layer between (up to ``MAX_ROUTED_SPAN`` layers, and
    ``MAX_WAYPOINTS`` in all: the rest are drawn round the side, as loops are)."""
    rows: list[list[str]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for sid in order:
        rows[layer[sid]].append(sid)
    predecessors: dict[str, list[str]] = {sid: [] for sid in order}
    routes: dict[int, list[str]] = {}
    budget = MAX_WAYPOINTS
    for index, edge in enumerate(edges):
        span = layer[edge.target] - layer[edge.source]
        if span < 1:
            continue  # a loop's way back: drawn round the side
        before = edge.source
        if 1 < span <= MAX_ROUTED_SPAN and span - 1 <= budget:
            budget -= span - 1
            routes[index] = []
            for k in range(1, span):
                waypoint = f"~{index}:{k}"
                rows[layer[edge.source] + k].append(waypoint)
                predecessors[waypoint] = [before]
                routes[index].append(waypoint)
                before = waypoint
        predecessors[edge.target].append(before)
    for _ in range(BARYCENTER_SWEEPS):
        position = {item: index for row in rows for index, item in enumerate(row)}
        for row in rows[1:]:
            row.sort(key=lambda item: _barycenter(item, predecessors[item], position))
            position.update({item: index for index, item in enumerate(row)})
    return Arrangement(rows=rows, routes=routes)


def _barycenter(item: str, before: list[str], position: Mapping[str, int]) -> float:
    if not before:
        return float(position[item])
    return sum(position[p] for p in before) / len(before)


# --- the steps a decided run took ----------------------------------------------------------------


def _decider(definition: Mapping[str, Any]) -> Mapping[str, Any] | None:
    steps = definition.get("steps")
    if isinstance(steps, list) and len(steps) == 1 and isinstance(steps[0], Mapping):
        step = steps[0]
        if isinstance(step.get("id"), str) and isinstance(step.get("type"), str):
            return deciding_step(definition)
    return None


def steps_taken(run: Run, decider_type: str) -> tuple[dict[str, Mapping[str, Any]], list[Link]]:
    """A decided run's graph (engine/decided.py): the steps it entered, in the order it first
    entered them, linked in the order it called them (a step called again closes a loop).
    Its deciders' turns, between every two of them, are left out: they say nothing the
    order does not. A ``ctx.parallel`` is drawn as a definition's fork: the `parallel` step,
    each branch's steps in their own order from it, and its join after them. The first
    ``MAX_TAKEN_ROWS`` rows are read (by the run's index)."""
    rows = (
        Step.objects.filter(run_id=run.pk)
        .exclude(type=decider_type)
        .exclude(step_id__startswith="~")
        .order_by("id")
        .values_list("id", "step_id", "type", "fork_join_id", "branch")[:MAX_TAKEN_ROWS]
    )
    taken = _Taken()
    joins, forks = set(registry.joining()), {t.name for t in registry if t.forks}
    for row_id, step_id, step_type, fork_join_id, branch in rows:
        fork_join: int | None = fork_join_id  # null at the top level
        place = (fork_join, branch)
        taken.steps.setdefault(step_id, {"id": step_id, "type": step_type})
        if step_type in joins:  # its row is written as its fork is entered, just before it
            taken.joins[row_id] = step_id
            taken.opening_at[place] = row_id
        elif fork_join is None:
            taken.link(taken.top, step_id, "next")
            taken.top = step_id
            opening = taken.opening_at.pop(place, None)
            if step_type in forks and opening is not None:
                taken.forks[opening] = step_id
                taken.top = taken.joins[opening]  # the top level goes on after it
        else:
            on_branch = (fork_join, branch)
            before = taken.branch_last.get(on_branch)
            taken.link(before or taken.forks.get(fork_join), step_id,
                       "next" if before else "branch")  # fmt: skip
            taken.branch_last[on_branch] = step_id
            opening = taken.opening_at.pop(place, None)
            if step_type in forks and opening is not None:  # a parallel nested in a branch
                taken.forks[opening] = step_id
                taken.branch_last[on_branch] = taken.joins[opening]  # it goes on after it
    for (fork_join, _), last in taken.branch_last.items():
        if fork_join in taken.joins:
            taken.link(last, taken.joins[fork_join], "join")
    return taken.steps, list(taken.found.values())


class _Taken:
    """The steps a decided run took and the links between them, followed at the top level
    and on each branch of each fork (engine/places.py)."""

    def __init__(self) -> None:
        self.steps: dict[str, Mapping[str, Any]] = {}
        self.found: dict[tuple[str, str], Link] = {}
        self.leaving: dict[str, int] = {}
        self.top: str | None = None  # the top level's last step
        self.branch_last: dict[tuple[int, int | None], str] = {}  # each branch's last step
        self.joins: dict[int, str] = {}  # join row id -> its step id
        self.forks: dict[int, str] = {}  # join row id -> the parallel step that opened it
        self.opening_at: dict[tuple[int | None, int | None], int] = {}  # place -> join row

    def link(self, before: str | None, step_id: str, kind: str) -> None:
        if before is None or (before, step_id) in self.found:
            return
        order = self.leaving.get(before, 0)
        self.leaving[before] = order + 1
        self.found[(before, step_id)] = Link(before, step_id, "", kind, order)


# --- what the run did ---------------------------------------------------------------------------


def step_marks(run: Run, step_ids: Iterable[str]) -> dict[str, StepMark]:
    """Each step's newest entry (by iteration: the unique index on run, step id, iteration
    serves it), one query for the steps drawn."""
    newest = (
        Step.objects.filter(run_id=run.pk, step_id__in=list(step_ids))
        .order_by("step_id", "-iteration")
        .distinct("step_id")
        .annotate(outcome=KeyTextTransform("outcome", "output"))
        .values_list("step_id", "status", "iteration", "outcome")
    )
    return {
        sid: StepMark(status=status, entries=iteration, outcome=outcome)
        for sid, status, iteration, outcome in newest
    }


def taken(link: Link, marks: Mapping[str, StepMark]) -> bool:
    """Whether the run went along ``link``: both ends entered, and the source ended the way
    the link leaves it (done, with the outcome a mapped next names when its output says
    which, as a branch's does; failed, for on_failure). A step entered more than once (a
    loop) finished at least once. A fork's branches and join are taken once it is entered."""
    source, target = marks.get(link.source), marks.get(link.target)
    if source is None or target is None:
        return False
    if link.kind == "failure":
        return source.status == StepStatus.FAILED or source.entries > 1
    if link.kind in ("branch", "join"):
        return True  # a fork enters its branches and opens its join when it is entered
    finished = source.status == StepStatus.DONE or source.entries > 1
    if link.kind == "outcome" and source.outcome is not None:
        return finished and source.outcome == link.label
    return finished


# --- drawing ---------------------------------------------------------------------------------


def picture(run: Run, definition: Mapping[str, Any], *, on_page: Set[str] = frozenset()) -> Picture:
    """The run's picture over ``definition`` (its version's), or, for a run whose steps are
    decided as it goes (a code workflow's), over the steps it took. A step links to its row,
    ``#step-<id>``, on this page when ``on_page`` holds it, else on the page of its rows."""
    decider = _decider(definition)
    took = steps_taken(run, str(decider["type"])) if decider is not None else None
    decided = took is not None and bool(took[0])  # before its first step: the decider alone
    if took is not None and decided:
        steps, every_link = took
        start: Any = next(iter(steps))
    else:
        steps = definition_steps(definition)
        start = definition.get("start")
        every_link = links(steps)
    layer = layers(start if isinstance(start, str) else None, list(steps), every_link)
    # The first MAX_NODES steps by layer (definition order within one): a top of the graph.
    drawn_ids = sorted(steps, key=layer.__getitem__)[:MAX_NODES]
    drawn = set(drawn_ids)
    shown_links = [link for link in every_link if link.source in drawn and link.target in drawn]
    arranged = arrange({sid: layer[sid] for sid in drawn_ids},
                       [sid for sid in steps if sid in drawn], shown_links)  # fmt: skip
    marks = step_marks(run, drawn_ids)
    place, width, height = _places(arranged.rows)
    row_of = {item: number for number, row in enumerate(arranged.rows) for item in row}
    nodes = [
        _node(sid, steps[sid], place[sid], marks.get(sid), sid in on_page) for sid in drawn_ids
    ]
    edges = [
        # A decided run's links are the steps it went along, each of them taken (a step
        # that failed and whose StepFailed the code caught was left for the next one too).
        _edge(link, place, row_of, arranged.routes.get(index, []), decided or taken(link, marks))
        for index, link in enumerate(shown_links)
    ]
    edges.sort(key=lambda edge: edge.taken)  # the path taken last: drawn over the others
    return Picture(nodes=nodes, edges=edges, width=width, height=height,
                   left_out=len(steps) - len(drawn_ids))  # fmt: skip


def _places(rows: list[list[str]]) -> tuple[dict[str, tuple[int, int]], int, int]:
    """Each item's top left corner (rows centred on the widest), and the picture's size."""

    def size(item: str) -> int:
        return WAYPOINT_WIDTH if item.startswith("~") else NODE_WIDTH

    def row_width(row: list[str]) -> int:
        return sum(size(item) for item in row) + GAP_X * max(len(row) - 1, 0)

    widest = max((row_width(row) for row in rows), default=0)
    place: dict[str, tuple[int, int]] = {}
    for number, row in enumerate(rows):
        x = MARGIN + (widest - row_width(row)) // 2
        y = MARGIN + number * (NODE_HEIGHT + GAP_Y)
        for item in row:
            place[item] = (x, y)
            x += size(item) + GAP_X
    width = 2 * MARGIN + widest + LOOP_REACH + 20
    height = 2 * MARGIN + len(rows) * NODE_HEIGHT + max(len(rows) - 1, 0) * GAP_Y
    return place, width, height


def _node(
    sid: str, step: Mapping[str, Any], at: tuple[int, int], mark: StepMark | None, here: bool
) -> DrawnNode:
    state = SHOWN_STATUS.get(mark.status, NOT_REACHED) if mark else NOT_REACHED
    label = sid if len(sid) <= LABEL_CHARS else sid[: LABEL_CHARS - 1] + "…"
    href = f"#step-{sid}" if here else f"?{urlencode({'step': sid})}#step-{sid}"
    return DrawnNode(step_id=sid, type=str(step.get("type", "")), label=label, state=state,
                     entries=mark.entries if mark else 0, x=at[0], y=at[1],
                     current=state in CURRENT, href=href)  # fmt: skip


Point = tuple[int, int]


def _edge(
    link: Link,
    place: Mapping[str, Point],
    row_of: Mapping[str, int],
    waypoints: list[str],
    was_taken: bool,
) -> DrawnEdge:
    (sx, sy), (tx, ty) = place[link.source], place[link.target]
    if row_of[link.target] - row_of[link.source] == 1 or waypoints:
        # Down: from the source's bottom (spread by the link's order, so a branch's
        # outcomes leave from different points) through each waypoint to the target's top.
        stops = [(sx + NODE_WIDTH // 2 + (link.order % 5 - 2) * 12, sy + NODE_HEIGHT)]
        for waypoint in waypoints:
            wx, wy = place[waypoint]
            stops += [(wx + WAYPOINT_WIDTH // 2, wy), (wx + WAYPOINT_WIDTH // 2, wy + NODE_HEIGHT)]
        stops.append((tx + NODE_WIDTH // 2, ty))
        path = f"M{stops[0][0]},{stops[0][1]}"
        for hop, ((x1, y1), (x2, y2)) in enumerate(zip(stops[0::2], stops[1::2], strict=True)):
            if hop:
                path += f" L{x1},{y1}"  # down through a waypoint's layer
            bend = max((y2 - y1) // 2, 12)
            path += f" C{x1},{y1 + bend} {x2},{y2 - bend} {x2},{y2}"
        (x1, y1), (x2, y2) = stops[0], stops[1]
        bend = max((y2 - y1) // 2, 12)
        mid = _middle((x1, y1), (x1, y1 + bend), (x2, y2 - bend), (x2, y2))
    else:
        # Back up (a loop), sideways, or too far down to route: out of the source's right
        # side and round, into the target's right side.
        start, end = (
            (sx + NODE_WIDTH, sy + NODE_HEIGHT // 2 + 6),
            (tx + NODE_WIDTH, ty + NODE_HEIGHT // 2 - 6),
        )
        reach = LOOP_REACH + 8 * (link.order % 3)
        c1, c2 = (start[0] + reach, start[1]), (end[0] + reach, end[1])
        path = f"M{start[0]},{start[1]} C{c1[0]},{c1[1]} {c2[0]},{c2[1]} {end[0]},{end[1]}"
        mid = _middle(start, c1, c2, end)
    return DrawnEdge(path=path, label=link.label, label_x=mid[0], label_y=mid[1],
                     kind=link.kind, taken=was_taken)  # fmt: skip


def _middle(p0: Point, p1: Point, p2: Point, p3: Point) -> Point:
    """The middle of a cubic Bézier curve (t = 1/2): where its label goes."""
    return (p0[0] + 3 * p1[0] + 3 * p2[0] + p3[0]) // 8, (
        p0[1] + 3 * p1[1] + 3 * p2[1] + p3[1]
    ) // 8
