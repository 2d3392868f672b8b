"""Hops: a successful step's settle and the walk after it, in one statement.

The slow settle (steps._settling) costs four round trips (BEGIN; the run's lock with the
step's fenced transition; the walk's writes; COMMIT) and six statements, and psycopg's work
per statement was most of a busy worker's CPU (py-spy, docs/how-to/benchmarks.md). A hop walks
first, from the run's row as the worker last saw it (the row its claim returned, or the one
its previous hop wrote), then sends what the walk decided in one call of a server-side
function (sql.functions.SETTLE_HOP_V1), as a transaction of its own: the statement commits
before its answer comes back, so no result is acknowledged before its commit.

The function writes only while the run's row is still that version (its xmin: every UPDATE
of the row makes a new one) and the step's attempt is still the newest running one (the
fencing token, as SETTLE_DONE). A hop's walk reads nothing but the run's row and the step's
result, so under those checks it decided what the slow settle would have decided under the
run's lock. Otherwise nothing is written and the step settles the slow way, from the row as
it is now: a hop never decides anything a locked settle would not.

What a hop cannot carry goes the slow way before any round trip: a walk that reads or writes
the database itself (forks and joins, a path's end that counts the run's live steps, an inline
step that queries), wakes a lane or leaves a continuation; a parked result; a run past its
max age. Hops that finish together in one worker go as one statement (hops_together,
group_settle.py).

A run's last settle, when the worker asked to claim another step of its lane with it
(TakeNext.claim_lane), must commit that claim with the settle, and only when the hop wrote:
BEGIN, that hop, the claim and COMMIT go in one round trip (rows.transaction_pipelined; five
the slow way). The claim goes before the hop's answer is known, so it is the claim that
finds out whether the hop wrote (sql.CLAIM_AFTER_HOPS).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from django.db import connection
from psycopg.types.json import Jsonb

from ..states import RunStatus
from . import sql
from .claimed import ClaimedStep
from .definition_cache import definition_for
from .executors import StepResult
from .faults import crash_point
from .speculative import NoDatabase, walked_ahead
from .sql.rows import (
    dumps_cells,
    json_or_null,
    json_params,
    query_prepared,
    transaction_pipelined,
)
from .walk import RunState, TakeNext, Walk


@dataclass(frozen=True)
class Hop:
    """A hop that reached the database: written (``ok``), or fenced out (nothing written)."""

    ok: bool
    walk: Walk
    taken_id: int | None = None  # the run's next step, written claimed for this worker
    seen: str | None = None  # the run row's version the hop wrote (for the next hop)
    claimed: sql.ClaimedRow | None = None  # a step of the lane claimed with it (claim_lane)


@dataclass(frozen=True)
class PlannedHop:
    """A hop's walk and its writes (SETTLE_HOP's parameters), before any round trip."""

    walk: Walk
    params: dict[str, Any]
    claims_lane: bool  # the run's last hop, with the lane's claim (TakeNext.claim_lane)


def plan_hop(
    step: ClaimedStep, result: StepResult, *, worker: str, take: TakeNext | None
) -> PlannedHop | None:
    """The hop that would settle ``step`` with ``result``; None: it cannot be one (nothing
    was written), and the caller settles the slow way."""
    if step.run_seen is None or step.run_expired or result.park is not None:
        return None
    walk = _speculative_walk(step, result, worker=worker, take=take)
    if walk is None:
        return None
    writes = walk.hop(step.run_seen)
    if writes is None:
        return None
    params = {**writes, "step": step.id, "attempt": step.attempt,
              "step_output": json_or_null(result.output)}  # fmt: skip
    claims = walk.finish is not None and take is not None and take.claim_lane
    return PlannedHop(walk, params, claims)


def hop(step: ClaimedStep, result: StepResult, *, worker: str, take: TakeNext | None) -> Hop | None:
    """Settle ``step`` with ``result`` as a hop; None: it was not one (nothing was written),
    and the caller settles the slow way."""
    planned = plan_hop(step, result, worker=worker, take=take)
    return None if planned is None else hop_planned(planned, take)


def hop_planned(planned: PlannedHop, take: TakeNext | None) -> Hop | None:
    """Write a planned hop (``take``: the one it was planned with), alone: one statement, or,
    for a run's last hop claiming for its lane, the hop and the claim in one transaction."""
    # As in the slow settle: a crash here has written nothing.
    crash_point("settle.after_step_update")
    if planned.claims_lane:
        assert take is not None
        return _hop_and_claim(planned, take)
    # In autocommit, as every settle is called (the slow one opens a durable transaction),
    # the statement is a transaction of its own.
    with connection.cursor() as cursor:
        answer = query_prepared(cursor, sql.SETTLE_HOP, _one_hop(planned.params))[0]
    return _answered(planned, cast(sql.HopAnswerRow, answer))


def hops_together(planned: list[PlannedHop], take: TakeNext | None = None) -> list[Hop | None]:
    """Several hops in one statement, one transaction (sql.SETTLE_HOPS), in run id order;
    each hop's answer as ``hop`` gives it, and None too for a hop whose run another
    transaction held (it wrote nothing). A statement that fails writes none of them.

    A run's last hop that asks to claim for its lane (PlannedHop.claims_lane) gets its claim
    as it would alone (Hop.claimed), in the group's transaction: one claim (sql.
    CLAIM_AFTER_HOPS, with ``take``'s fairness) for as many steps as such hops wrote, sent
    with the group's statement and committed with it, in one round trip. Otherwise each of
    those slots would cost the worker's claim loop a claim and a commit of its own, and
    commits are what a start waits behind (docs/how-to/benchmarks.md)."""
    crash_point("settle.after_step_update")
    hops = {"hops": Jsonb([json_params(each.params) for each in planned], dumps=dumps_cells)}
    claiming = [n for n, each in enumerate(planned) if each.claims_lane]
    if take is None or not claiming:
        with connection.cursor() as cursor:  # in autocommit: a transaction of its own
            answers = query_prepared(cursor, sql.SETTLE_HOPS, hops)
        return _all_answered(planned, cast(list[sql.HopsAnswerRow], answers))
    claim = take.claim_after_hops_params([planned[n].params["step"] for n in claiming])
    with connection.cursor() as cursor:
        answers, claimed = transaction_pipelined(
            cursor, [(sql.SETTLE_HOPS, hops), (sql.CLAIM_AFTER_HOPS, claim)]
        )
    hopped = _all_answered(planned, cast(list[sql.HopsAnswerRow], answers))
    takers = [n for n in claiming if (each := hopped[n]) is not None and each.ok]
    claimed_rows = cast(list[sql.ClaimedRow], claimed)
    for n, row in zip(takers, claimed_rows, strict=False):  # fewer rows: nothing more was ready
        settled = hopped[n]
        assert settled is not None
        hopped[n] = replace(settled, claimed=row)
    return hopped


def _all_answered(
    planned: list[PlannedHop], answers: Sequence[sql.HopAnswerRow]
) -> list[Hop | None]:
    return [_answered(each, answer) for each, answer in zip(planned, answers, strict=True)]


def _answered(planned: PlannedHop, answer: sql.HopAnswerRow) -> Hop | None:
    if answer["outcome"] == "fenced":
        return Hop(False, planned.walk)
    if answer["outcome"] != "settled":
        return None  # the run changed since the walk's view of it (or, in a group, was busy)
    return Hop(True, planned.walk, answer["taken_id"], answer["run_xmin"])


def _one_hop(params: dict[str, Any]) -> dict[str, str]:
    """SETTLE_HOP's parameter: the hop as one JSON document (as a member of SETTLE_HOPS)."""
    return {"hop": dumps_cells(json_params(params))}


def _hop_and_claim(planned: PlannedHop, take: TakeNext) -> Hop | None:
    """The run's last hop and the lane's claim (sql.CLAIM_AFTER_HOPS: none when the hop wrote
    nothing) as one transaction, in one round trip."""
    claim = take.claim_after_hops_params([planned.params["step"]])
    with connection.cursor() as cursor:
        (answer,), claimed = transaction_pipelined(
            cursor, [(sql.SETTLE_HOP, _one_hop(planned.params)), (sql.CLAIM_AFTER_HOPS, claim)]
        )
    hopped = _answered(planned, cast(sql.HopAnswerRow, answer))
    if hopped is None or not hopped.ok or not claimed:
        return hopped
    return replace(hopped, claimed=cast(sql.ClaimedRow, claimed[0]))


def _speculative_walk(
    step: ClaimedStep, result: StepResult, *, worker: str, take: TakeNext | None
) -> Walk | None:
    """The slow settle's walk (steps.settle_and_take_next), on the run as the worker saw it;
    None if it tried to touch the database."""
    run = RunState(
        id=step.run_id, org_id=step.org_id, version_id=step.version_id,
        status=RunStatus.RUNNING, input=step.run_input, vars=dict(step.run_vars),
        outputs=dict(step.run_outputs), entered=dict(step.run_entered),
        steps_executed=step.run_steps_executed, max_steps=step.run_max_steps, expired=False,
        created_at=step.run_created_at,
    )  # fmt: skip
    walk = Walk(NoDatabase(), run, definition_for(run.version_id), worker=worker,
                take_next=take, speculative=True, decide_inline=True)  # fmt: skip
    # What the code run's turn that asked for this step knew: its next turn may run ahead
    # from it, the run's row (whose version the hop checks) unchanged since.
    walk.carried = step.carried

    def succeeded() -> None:
        walk.worker_step_succeeded(step.step_id, step.iteration, step.attempt, result, step.place)

    return walk if walked_ahead(succeeded, run_id=step.run_id) else None
