"""What a replay reads: the run's steps in the order they were entered, in one statement,
each with the outcome it ended with (when its step type has outcomes), sorted by where they
were entered: the top level, or a branch of a ``ctx.parallel`` (engine/forks.py's fork_join
and branch columns). Each branch replays against its own steps only; the top level's steps
are less those a re-run from a step set aside.

A re-run from a step (services/rerun.py, ``rerun_code``) keeps the run's rows and notes a
cut among the run's outputs (under ``REPLAY_CUTS``, an id no step can take): the newest row
the run had then, and how many of the top level's steps read so far its replay keeps.
Reading the rows in order, each cut is applied once the rows read pass its row: the steps
after the kept ones are set aside (their rows stay, for the run page and the history), and
the rows the re-run entered follow the kept ones. Cuts add up: a re-run of a re-run reads the
same way. A re-run needs no cut in a branch: a re-run from a step before its ``ctx.parallel``
sets the parallel aside, and its replay forks anew (another join row, so other places). A
retry that calls a branch's failed ``ctx.run`` function again cuts that branch's rows
(services/control.py): a cut names its place when it is not the top level's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple

from django.db import connection

from ..definitions.registry import registry
from ..definitions.storable import as_stored
from ..engine.sql.rows import fetch_dicts
from ..states import StepStatus
from .context import Recorded

# Every step of the run but the engine's continuations ("~..."), in the order they were
# entered (one decider enters one step at a time, so within one place the order is the
# call order). The run's steps are found by the (org_id, run_id, ...) index every step
# lookup of a run uses. The deciders' own rows are read for what they recorded of the step
# before them (ENDED) and for a branch's return value (RETURNED), not replayed.
RUN_HISTORY = """
SELECT id, step_id, iteration, type, status, output::text AS output, error, fork_join_id,
       branch
  FROM workflows_step
 WHERE org_id = %(org)s AND run_id = %(run)s AND step_id NOT LIKE '~%%'
 ORDER BY id
"""

# The run's newest step row, where a re-run notes its cut.
NEWEST_ROW = """
SELECT max(id) AS newest FROM workflows_step WHERE org_id = %(org)s AND run_id = %(run)s
"""

# Among the run's outputs: the re-runs' cuts, oldest first ({"after_row", "kept"} each).
REPLAY_CUTS = "~replay"

# In a decider turn's output: the outcome of the step that ended before the turn, as the
# engine noted it among the run's outputs (engine/decided.py), recorded by the turn.
ENDED = "ended"
# In a branch decider's last output: what the branch's function returned.
RETURNED = "returned"

Where = tuple[int | None, int | None]  # (fork_join row id, branch); (None, None) on top
TOP: Where = (None, None)


@dataclass(frozen=True)
class Join:
    """A ``ctx.parallel``'s join row: whether its branches have met."""

    status: str


@dataclass
class History:
    """The run's recorded steps, by the place they were entered at."""

    places: dict[Where, list[Recorded]] = field(default_factory=dict)
    joins: dict[int, Join] = field(default_factory=dict)  # by the join row's id
    returned: dict[Where, Any] = field(default_factory=dict)  # a branch's return value
    deciding_at: Where = TOP  # where the deciding turn's own row was entered

    def of(self, where: Where) -> list[Recorded]:
        return self.places.get(where, [])


def read_history(
    *, org_id: int, run_id: int, decider_type: str, decider_id: str,
    latest: Mapping[str, Any] | None, cuts: Any = None, deciding_at: Where | None = None,
) -> History:  # fmt: skip
    """The run's recorded steps. ``decider_id``: the deciding turn's step (the run's decider,
    or a branch's); ``latest``: its output among the run's outputs now, which notes the
    outcome of the step that has just ended where it decides (not yet recorded); ``cuts``:
    the re-runs' cuts among the run's outputs (``REPLAY_CUTS``); ``deciding_at``: where the
    deciding turn is entered, when known (otherwise its newest row's place)."""
    with connection.cursor() as cursor:
        cursor.execute(RUN_HISTORY, {"org": org_id, "run": run_id})
        rows = fetch_dicts(cursor)
    history = History()
    joins = set(registry.joining())
    pending = replay_cuts(cuts)
    history.places.setdefault(TOP, [])
    for row in rows:
        while pending and pending[0].after_row < row["id"]:
            pending.pop(0).apply(history.places)
        # As text, decoded here: Django's cursor hands jsonb back undecoded.
        output = None if row["output"] is None else json.loads(row["output"])
        at: Where = (row["fork_join_id"], row["branch"])
        place = history.places.setdefault(at, [])
        if row["type"] == decider_type:
            if row["step_id"] == decider_id:
                history.deciding_at = at  # its newest row: the turn deciding now
            if isinstance(output, Mapping) and ("call" in output or RETURNED in output):
                _with_outcome(place, output.get(ENDED))  # a turn, not the run's end
                if RETURNED in output and row["status"] == "done":
                    history.returned[at] = output[RETURNED]
            continue
        if row["type"] in joins:
            # Its ctx.parallel's row names it (output.join_row): replay reads it from there.
            history.joins[row["id"]] = Join(status=row["status"])
            continue
        place.append(
            Recorded(step_id=row["step_id"], iteration=row["iteration"], type=row["type"],
                     status=row["status"], output=output, error=row["error"])
        )  # fmt: skip
    for cut in pending:
        cut.apply(history.places)
    for where, place in history.places.items():
        if where != TOP:  # (the top level's cancelled steps are entered again by a re-run's cut)
            history.places[where] = _without_reentered(place)
    if deciding_at is not None:  # a turn run inline: its own row is written after it
        history.deciding_at = deciding_at
    if latest is not None:
        _with_outcome(history.places.setdefault(history.deciding_at, []), ended_before(latest))
    return history


def ended_before(decider_output: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a turn records of the step that ended before it: its id and outcome, as noted
    in the decider's output among the run's outputs."""
    call, outcome = decider_output.get("call"), decider_output.get("outcome")
    if not isinstance(call, Mapping) or not isinstance(outcome, str):
        return None
    return {"step": call.get("id"), "outcome": outcome}


def _with_outcome(history: list[Recorded], ended: Any) -> None:
    """Give the last recorded step the outcome a turn recorded for it (the same step)."""
    if not isinstance(ended, Mapping) or not history:
        return
    last = history[-1]
    if last.step_id == ended.get("step") and isinstance(ended.get("outcome"), str):
        history[-1] = last._replace(outcome=ended["outcome"])


@dataclass(frozen=True)
class Cut:
    """Where a replay stops reading a place's rows: once the rows read pass ``after_row``,
    only the first ``kept`` steps read so far at ``at`` stay (the top level's, or a
    branch's: a retry that calls a branch's failed ``ctx.run`` function again)."""

    after_row: int
    kept: int
    at: Where = TOP

    def apply(self, places: dict[Where, list[Recorded]]) -> None:
        place = places.setdefault(self.at, [])
        if self.at != TOP:
            # A branch's steps counted as its replay reads them (read_history): ``kept`` was
            # counted so, less the steps cancelled and entered again (_without_reentered).
            place[:] = _without_reentered(place)
        del place[self.kept :]

    def stored(self) -> dict[str, Any]:
        """As the run's outputs keep it (``REPLAY_CUTS``)."""
        kept: dict[str, Any] = {"after_row": self.after_row, "kept": self.kept}
        if self.at != TOP:
            kept["at"] = list(self.at)
        return kept


def replay_cuts(cuts: Any) -> list[Cut]:
    """The re-runs' and retries' cuts, in the order they were made."""
    if not isinstance(cuts, list):
        return []
    return [
        Cut(int(cut["after_row"]), int(cut["kept"]), _place_of(cut.get("at")))
        for cut in cuts
        if isinstance(cut, Mapping) and {"after_row", "kept"} <= set(cut)
    ]


def _place_of(stored: Any) -> Where:
    if isinstance(stored, list) and len(stored) == 2:
        return (int(stored[0]), int(stored[1]))
    return TOP


def newest_row(cursor: Any, *, org_id: int, run_id: int) -> int:
    """The run's newest step row (a re-run's cut is after it)."""
    cursor.execute(NEWEST_ROW, {"org": org_id, "run": run_id})
    row = cursor.fetchone()
    return int(row[0] or 0)


class Turn(NamedTuple):
    """What a turn knew when it asked for its step (StepResult.carried): the history it
    replayed, and the step it asked for. (A named tuple: one is made at every turn.)"""

    history: tuple[Recorded, ...]
    asked: Mapping[str, Any]


_STEP_ID = attrgetter("step_id")  # (a count in C: each turn of a long run counts its history)


def history_after(
    turn: Any, *, latest: Mapping[str, Any] | None, outputs: Mapping[str, Any]
) -> list[Recorded] | None:
    """The run's history for the turn after ``turn``, without a query: the history ``turn``
    replayed and the step it asked for, ended with the output the run now holds for it.
    None when ``turn`` is not the run's previous turn (``latest``, the decider's output among
    the run's outputs, asks for another step) or its step has no output yet."""
    if type(turn) is not Turn or latest is None:
        return None
    call, asked = latest.get("call"), turn.asked
    # (Inline, the very step the turn asked: the walk keeps the decider's output it made.)
    if call is not asked and (not isinstance(call, Mapping) or (
            call.get("id"), call.get("type")) != (asked.get("id"), asked.get("type"))):  # fmt: skip
        return None
    step_id = str(asked["id"])
    ended = outputs.get(step_id)
    if (type(ended) is not dict and not isinstance(ended, Mapping)) or "output" not in ended:
        return None
    # One live step at a time: the asked step's iteration follows its earlier ones.
    iteration = 1 + list(map(_STEP_ID, turn.history)).count(step_id)
    # Its outcome, as the decider's output notes it (the same step: it asked for it).
    outcome = latest.get("outcome")
    outcome = outcome if type(outcome) is str else None
    # As the database gives it back, which every replay that reads the history meets: the
    # step's output as its executor made it may differ (a key order, a tuple, a float
    # 1e16), and the code must take the same path from the same record. (The replay hands
    # the workflow's code a copy, Context._replayed.)
    output = as_stored(ended["output"])
    last = Recorded(step_id, iteration, str(asked["type"]), StepStatus.DONE, output, outcome)
    return [*turn.history, last]


def _without_reentered(place: list[Recorded]) -> list[Recorded]:
    """A branch's steps less those cancelled and entered again after (a retry of a run whose
    failure cancelled them, engine/forks.py revive_forks): no call returned from the
    cancelled row, and the replay reads the row entered again instead."""
    later: set[str] = set()
    kept: list[Recorded] = []
    for recorded in reversed(place):
        if not (recorded.status == StepStatus.CANCELLED and recorded.step_id in later):
            kept.append(recorded)
        later.add(recorded.step_id)
    kept.reverse()
    return kept
