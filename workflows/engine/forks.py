"""Parallel branches and their join, inside the walk.

Entering a `parallel` step (a type that declares ``forks``) starts each of its `branches`.
When its `next` names a `join` step (a type that declares ``joins``), a waiting row for that
join is written first, and every step of every branch records it
(``fork_join``) and its branch number: steps entered after them inherit both. A branch whose
path reaches the join (or ends) *arrives*: one guarded UPDATE of the join row under the run's
lock (every settle holds it), so two branches settling at the same moment are serialised and
the arrival that completes the join is the only one that sees it complete. The join then
continues along its own `next`, once; if it completed before every branch arrived (`first`,
or a number), the branches still live are cancelled, nested forks included.

A loop that enters the same `parallel` again forks anew, with a new join row: a join counts
exactly the branches of its own pass.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, cast

from psycopg.types.json import Jsonb

from ..definitions.registry import registry
from ..states import StepStatus
from . import sql
from .decided import step_at
from .executors import StepResult
from .places import TOP, Entry, Place
from .run_state import RunState
from .sql.rows import fetch_dict, fetch_dicts

# The wait_kind of a join's waiting row (not a WaitKind: no wake reaches it, only the
# arrivals of its branches, here).
JOIN_WAIT = "join"


def branches_needed(join_step: Mapping[str, Any], branches: int) -> int:
    """How many branches must arrive: `complete` is "all" (the default), "first" or a
    number of branches."""
    complete = join_step.get("complete", "all")
    if complete == "first":
        return 1
    if isinstance(complete, int):
        return max(1, min(complete, branches))
    return branches


class ForkWalk(Protocol):
    """What forks use of the walk that enters them (walk.py's Walk): named here, so that
    this module need not import the walk, which imports it."""

    cursor: Any
    run: RunState
    steps: Mapping[str, Mapping[str, Any]]
    queue: deque[Entry]

    def event(
        self,
        kind: str,
        step_id: str = "",
        *,
        iteration: int | None = None,
        attempt: int | None = None,
        detail: Any = None,
    ) -> None: ...

    def add_step(
        self,
        step_id: str,
        iteration: int,
        step_type: str,
        lane: str,
        status: str,
        *,
        attempt: int = 0,
        max_attempts: int = 1,
        output: Any = None,
        error: str = "",
        wait_kind: str = "",
        wake_in: float | None = None,
        wait_detail: Any = None,
        place: Place = TOP,
        owner: str | None = None,
        lease_seconds: float | None = None,
    ) -> None: ...

    def insert_new_steps(self) -> None: ...

    def record_output(self, step_id: str, result: StepResult) -> None: ...

    def step_succeeded(self, step_id: str, result: StepResult, place: Place = TOP) -> None: ...

    def enter_entries(self, entries: Iterable[Entry]) -> None: ...

    def next_iteration(self, step_id: str) -> int: ...

    def join_opened(self, place: Place, join_row: int) -> None: ...


class Forks:
    def __init__(self, walk: ForkWalk) -> None:
        self.walk = walk
        self.join_steps: dict[int, str] = {}  # join row id -> its step id

    def fork(self, step: Mapping[str, Any], iteration: int, place: Place) -> None:
        """Enter a `parallel` step: start its branches, under a new join row if it has one."""
        walk = self.walk
        branches: list[str] = list(step["branches"])
        join_id = self._open_join(step, len(branches), place)
        row_output: dict[str, Any] = {"branches": branches, "join_row": join_id}
        if "complete" in step:
            # A code run's `parallel` says itself how many branches its join waits for
            # (a definition's join step says it): kept, so a replay whose code calls it with
            # another number is told it took another path (workflows/code, ctx.parallel).
            row_output["complete"] = step["complete"]
        walk.add_step(
            step["id"], iteration, step["type"], "inline", StepStatus.DONE, attempt=1,
            output=row_output, place=place,
        )  # fmt: skip
        walk.event("step.succeeded", step["id"], iteration=iteration, attempt=1,
                   detail={"branches": branches})  # fmt: skip
        walk.record_output(step["id"], StepResult(output={"branches": branches}))
        if join_id is None:  # independent branches, in the fork's own place
            walk.enter_entries(Entry(branch, place) for branch in branches)
            return
        walk.enter_entries(
            Entry(branch, Place(join_id, number)) for number, branch in enumerate(branches)
        )

    def _open_join(self, step: Mapping[str, Any], branches: int, place: Place) -> int | None:
        join_step_id = step.get("next")  # a parallel's next is the join its branches meet at
        if not join_step_id:
            return None
        walk = self.walk
        join_step = step_at(walk.steps, join_step_id, place)
        iteration = walk.next_iteration(join_step_id)
        need = branches_needed(join_step, branches)
        detail = {"need": need, "branches": branches, "arrived": [], "fork": step["id"]}
        walk.cursor.execute(
            sql.INSERT_JOIN_ROW,
            {
                "org": walk.run.org_id, "run": walk.run.id, "step_id": join_step_id,
                "type": join_step["type"], "iteration": iteration, "detail": Jsonb(detail),
                "join_wait": JOIN_WAIT,
                "fork_join": place.fork_join, "branch": place.branch,
            },
        )  # fmt: skip
        row = fetch_dict(walk.cursor)
        assert row is not None
        self.join_steps[row["id"]] = join_step_id
        walk.event("join.waiting", join_step_id, iteration=iteration, detail=detail)
        walk.join_opened(place, int(row["id"]))
        return int(row["id"])

    def join_step_of(self, join_id: int) -> str:
        if join_id not in self.join_steps:
            self.walk.cursor.execute(sql.JOIN_ROW, {"id": join_id})
            row = fetch_dict(self.walk.cursor)
            assert row is not None, f"join row {join_id} is missing"
            self.join_steps[join_id] = row["step_id"]
        return self.join_steps[join_id]

    def arrive(self, place: Place) -> None:
        """A branch of the fork at ``place`` finished; continue past the join if that
        completes it."""
        walk = self.walk
        assert place.fork_join is not None
        walk.cursor.execute(
            sql.JOIN_ARRIVE,
            {"id": place.fork_join, "branch": place.branch, "join_wait": JOIN_WAIT},
        )
        row = cast(sql.JoinArrivalRow | None, fetch_dict(walk.cursor))
        join_step_id = self.join_step_of(place.fork_join)
        if row is None:
            # The join completed without this branch (`first`, or a number of branches), or
            # this branch arrived already (by another of its paths).
            walk.event("join.arrived_late", join_step_id, detail={"branch": place.branch})
            return
        detail = {"branch": place.branch, "arrived": row["wait_detail"]["arrived"]}
        walk.event("join.arrived", join_step_id, iteration=row["iteration"], detail=detail)
        if row["status"] != StepStatus.DONE:
            return
        self._end_rest_of_fork(place.fork_join)
        output = {"arrived": row["wait_detail"]["arrived"]}
        walk.event("step.succeeded", join_step_id, iteration=row["iteration"], attempt=1)
        walk.step_succeeded(
            join_step_id, StepResult(output=output), Place(row["fork_join_id"], row["branch"])
        )

    def _end_rest_of_fork(self, join_id: int) -> None:
        walk = self.walk
        walk.insert_new_steps()  # rows this walk decided must be ended too
        walk.cursor.execute(
            sql.CANCEL_FORK, {"join": join_id, "run": walk.run.id, "joins": registry.joining()}
        )
        for row in cast(list[sql.CancelledStepRow], fetch_dicts(walk.cursor)):
            walk.event("step.cancelled", row["step_id"], iteration=row["iteration"],
                       attempt=row["attempt"], detail={"reason": "its join completed"})  # fmt: skip
        # Entries of the fork still queued in this walk are dropped the same way.
        ended = self._fork_tree(join_id)
        walk.queue = deque(e for e in walk.queue if e.place.fork_join not in ended)

    def _fork_tree(self, join_id: int) -> set[int]:
        """This join row and the join rows nested under it."""
        tree, frontier = {join_id}, [join_id]
        while frontier:
            self.walk.cursor.execute(
                sql.JOIN_ROWS_UNDER,
                {"run": self.walk.run.id, "ids": frontier, "joins": registry.joining()},
            )
            frontier = [row["id"] for row in fetch_dicts(self.walk.cursor)]
            tree.update(frontier)
        return tree


def revive_forks(walk: ForkWalk, place: Place, moved: dict[int, int] | None = None) -> Place:
    """A run that failed inside a parallel is retried at ``place`` (services/control.py):
    where the retried step is now. The failure cancelled the join its branch meets at and
    the other branches still live (the rule every run's end follows); a cancelled row stays
    cancelled, so a new join row continues it, with the arrivals it had, and the fork's rows
    move to it. Each other branch the failure cancelled is entered again at the step it was
    at, so the join can complete. Outward, joins around it the same. A branch that was at a
    parallel of its own (a nested fork) goes on there: its inner join continues the same way
    (_revive_join), and so on inward. ``moved``: each join row continued, by the new row
    that continues it (the places of its branches' rows change with it)."""
    joins = set(registry.joining())
    retried = place
    moved = {} if moved is None else moved
    while place.fork_join is not None:
        revived = _revive_join(walk, place.fork_join, joins, moved, retried_branch=place.branch)
        if revived is None:  # not cancelled: its other branches were not ended
            break
        new, join = revived
        if retried.fork_join == place.fork_join:
            retried = Place(new, retried.branch)
        place = Place(join["fork_join_id"], join["branch"])
    return retried


def _revive_join(
    walk: ForkWalk, old: int, joins: set[str], moved: dict[int, int], *,
    retried_branch: int | None = None,
) -> tuple[int, Mapping[str, Any]] | None:  # fmt: skip
    """Continue join row ``old`` if the failure cancelled it: a new row, with the arrivals
    it had, and its branches that had not arrived entered again where they were (but
    ``retried_branch``, whose step the retry runs itself), inward the same way. The new
    row's id and the cancelled join; None when it was not cancelled (it met, or its other
    branches were not ended)."""
    walk.cursor.execute(sql.CANCELLED_JOIN, {"run": walk.run.id, "id": old})
    join = fetch_dict(walk.cursor)
    if join is None:
        return None
    new = moved[old] = _continue_join(walk, old, join)
    arrived = set(join["wait_detail"]["arrived"])
    walk.cursor.execute(sql.BRANCH_HEADS, {"run": walk.run.id, "join": new})
    heads = [row for row in fetch_dicts(walk.cursor)
             if row["branch"] not in arrived and row["branch"] != retried_branch]  # fmt: skip
    _enter_heads(walk, new, heads, joins, moved)
    return new, join


def _enter_heads(walk: ForkWalk, join_id: int, heads: list[dict[str, Any]],
                 joins: set[str], moved: dict[int, int]) -> None:  # fmt: skip
    """Enter again each branch of join row ``join_id`` the failure cancelled (``heads``: the
    newest row of each branch that had not arrived) at the step it was at; a branch that
    was at a parallel of its own goes on inside it (its inner join revived in turn)."""
    walk.enter_entries(
        Entry(row["step_id"], Place(join_id, row["branch"]))
        for row in heads
        if row["status"] == StepStatus.CANCELLED and row["type"] not in joins
    )
    for row in heads:
        # A fork's row names its join row (any other row's output is not read: a code run's
        # ctx.run result may hold a key of that name).
        joined = row["join_row"] if registry.forking(str(row["type"])) else None
        joined = json.loads(joined) if isinstance(joined, str) else joined
        if isinstance(joined, int) and not isinstance(joined, bool):
            _revive_join(walk, joined, joins, moved)


def _continue_join(walk: ForkWalk, old: int, join: Mapping[str, Any]) -> int:
    """A new waiting row for the join of cancelled row ``old`` (its next iteration, with the
    arrivals it had, in its place), the fork's rows moved to it."""
    iteration = walk.next_iteration(join["step_id"])
    detail = dict(join["wait_detail"])
    walk.cursor.execute(
        sql.INSERT_JOIN_ROW,
        {
            "org": walk.run.org_id, "run": walk.run.id, "step_id": join["step_id"],
            "type": join["type"], "iteration": iteration, "detail": Jsonb(detail),
            "join_wait": JOIN_WAIT, "fork_join": join["fork_join_id"], "branch": join["branch"],
        },
    )  # fmt: skip
    row = fetch_dict(walk.cursor)
    assert row is not None
    new = int(row["id"])
    walk.join_opened(Place(join["fork_join_id"], join["branch"]), new)
    for statement in (sql.MOVE_FORK, sql.MOVE_FORK_STEP):
        walk.cursor.execute(statement, {"run": walk.run.id, "old": old, "new": new})
    walk.event("join.waiting", join["step_id"], iteration=iteration,
               detail={**detail, "continues_iteration": join["iteration"],
                       "reason": "the run is retried"})  # fmt: skip
    return new


def branch_paths(cursor: Any, run_id: int) -> Callable[[int | None, int | None], str]:
    """How the run's places are named by their branch path, the same on every pass of a
    fork and after a retry continued its join: the join step and branch number of each fork
    around the place, outermost first (``fan.join:1/inner.join:0``); "" at the top level. A
    code run's branches may call steps of the same id, which only their places tell apart
    (a re-run's reuse of their settled effects, services/rerun.py and the effects ledger)."""
    cursor.execute(sql.JOIN_ROWS_OF_RUN, {"run": run_id})
    joins = {int(row["id"]): row for row in fetch_dicts(cursor)}

    def path(fork_join: int | None, branch: int | None) -> str:
        parts: list[str] = []
        while fork_join is not None and fork_join in joins:
            join = joins[fork_join]
            parts.append(f"{join['step_id']}:{branch}")
            fork_join, branch = join["fork_join_id"], join["branch"]
        return "/".join(reversed(parts))

    return path
