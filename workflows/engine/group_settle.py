"""Group settles: hops that finish together in one worker commit together, as one statement.

A step thread whose successful result can hop (hops.plan_hop) hands it to its worker's
GroupSettler and waits. The first thread to arrive while fewer than ``leaders`` groups are in
flight leads: it takes what is waiting (its own result first, up to ``max_group``), settles it
as one statement (hops.hops_together: each member exactly as its hop alone, in run id order,
the one lock order, in one transaction), hands each waiting thread its answer and returns.
A lone result is settled by its own thread at once, without a thread switch: an idle engine
pays nothing for grouping, a busy one pays one statement and one commit for many steps.
Nothing is acknowledged before that commit: a waiting thread returns only once its group has
committed.

What a group does not settle goes back to its thread, which settles it alone: the same hop
on its own, then the slow settle (steps.settle_and_take_next) if that finds the run changed.
So go a result that cannot hop (straight to the slow settle); a hop whose run changed since
the walk saw it; a hop whose run another transaction has locked (the group skips it rather than wait
for it: one long-held lock must not hold up every step of the worker); every member, when
the statement failed. A fenced-out member writes nothing, as its hop alone would not.

In a group, a run's last hop claims no step of the lane with it (TakeNext.claim_lane): the
worker's claim loop claims for the slots the group frees, in one claim.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from django.db import connection

from .executors import StepResult
from .hops import PlannedHop, hop_planned, hops_together, plan_hop
from .steps import ClaimedStep, Settled, settle_and_take_next, settled_by_hop
from .walk import TakeNext

logger = logging.getLogger(__name__)

MAX_GROUP = 16


@dataclass
class _Member:
    step: ClaimedStep
    hop: PlannedHop
    take: TakeNext | None  # what the hop was planned with
    taken: bool = False  # in a group being settled (by whichever thread leads it)
    done: bool = False
    outcome: Settled | None = None  # None once done: its thread settles it alone


class GroupSettler:
    def __init__(self, worker: str, max_group: int = MAX_GROUP, leaders: int = 1) -> None:
        self.worker = worker
        self.max_group = max_group
        self.leaders = leaders  # groups settling at once
        self.waiting: list[_Member] = []
        self.leading = 0
        self.turn = threading.Condition()
        self.groups = 0  # statements that settled more than one hop (for tests)

    def settle(self, step: ClaimedStep, result: StepResult, take: TakeNext | None) -> Settled:
        """Called by a step thread: settle its successful result, with others waiting if it
        can hop, alone the ordinary way otherwise. Returns once the settle has committed (or
        raises what it raised, for the worker's retry)."""
        planned = plan_hop(step, result, worker=self.worker, take=take)
        if planned is None:  # it cannot hop: the slow settle, without planning it again
            return settle_and_take_next(step, result, worker=self.worker, take=take, hop=False)
        outcome = self._in_a_group(_Member(step, planned, take))
        if outcome is not None:
            return outcome
        # Handed back: the same hop alone (it waits there for a run another transaction
        # held), then the slow settle if its run changed; its walk is not planned again.
        hopped = hop_planned(planned, take)
        if hopped is not None:
            return settled_by_hop(step, hopped)
        return settle_and_take_next(step, result, worker=self.worker, take=take, hop=False)

    def _in_a_group(self, member: _Member) -> Settled | None:
        with self.turn:
            self.waiting.append(member)
            # Wait while another thread's group holds it, or while enough groups are in flight.
            while not member.done and (member.taken or self.leading >= self.leaders):
                self.turn.wait()
            if member.done:
                return member.outcome
            self.leading += 1
            # Its own first: a leader never leaves without its own answer.
            others = [each for each in self.waiting if each is not member]
            group = [member, *others[: self.max_group - 1]]
            self.waiting = others[self.max_group - 1 :]
            for each in group:
                each.taken = True
        try:
            self._settle(group)
        finally:
            with self.turn:
                self.leading -= 1
                for each in group:
                    each.done = True
                self.turn.notify_all()
        return member.outcome

    def _settle(self, group: list[_Member]) -> None:
        """One statement for the group; each member's outcome, or None (settle it alone). A
        group of one is a hop alone (a run's last one claims for its lane with it)."""
        group = sorted(group, key=lambda m: (m.step.run_id, m.step.id))
        try:
            if len(group) == 1:
                answers = [hop_planned(group[0].hop, group[0].take)]
            else:
                answers = hops_together([member.hop for member in group])
        except Exception:
            logger.warning("a group of %s hops failed; settling each alone", len(group),
                           exc_info=True)  # fmt: skip
            connection.close()
            return
        if len(group) > 1:
            self.groups += 1
        for member, answer in zip(group, answers, strict=True):
            member.outcome = None if answer is None else settled_by_hop(member.step, answer)
