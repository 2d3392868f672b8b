"""Group settles: hops that finish together in one worker commit together, as one statement.

A step thread whose successful result can hop (hops.plan_hop) hands it to its worker's
GroupSettler. A thread that arrives while fewer than ``leaders`` groups are in flight settles
its result at once; otherwise it waits. When a group is done, its slot goes to the first
waiting thread, which leads what waits (its own result first, up to ``max_group``): it settles
it as one statement (hops.hops_together: each member exactly as its hop alone, in run id
order, the one lock order, in one transaction), hands each member's thread its answer (waking
exactly that thread) and returns.
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

A run's last hop that claims a step of its lane with it (TakeNext.claim_lane) does so in a
group too: the group claims, in its transaction, one step for each such hop it settled
(hops.hops_together), and each goes to that hop's thread as its next step.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from django.db import connection

from .executors import StepResult
from .hops import PlannedHop, hop_planned, hops_together, plan_hop
from .steps import ClaimedStep, Settled, settle_and_take_next, settled_by_hop
from .transient import away
from .walk import TakeNext

logger = logging.getLogger(__name__)

MAX_GROUP = 16


@dataclass
class _Member:
    step: ClaimedStep
    hop: PlannedHop
    take: TakeNext | None  # what the hop was planned with
    done: bool = False
    outcome: Settled | None = None  # None once done: its thread settles it alone
    group: list[_Member] | None = None  # the group it was handed to lead
    # Held while its thread waits; released once, by whoever has its answer (done) or hands
    # it a group to lead. A lock of its own: waking exactly the threads that have something
    # to do (a Condition's notify_all woke every waiting thread after each group, and the
    # wake-ups were a sixth of a busy worker's Python time on 2 cores).
    wake: threading.Lock = field(default_factory=threading.Lock)


class GroupSettler:
    def __init__(self, worker: str, max_group: int = MAX_GROUP, leaders: int = 1) -> None:
        self.worker = worker
        self.max_group = max_group
        self.leaders = leaders  # groups settling at once
        # Results waiting for a group; only ever while `leaders` groups are in flight.
        self.waiting: list[_Member] = []
        self.leading = 0
        self.lock = threading.Lock()
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
        member.wake.acquire()
        with self.lock:
            leads = self.leading < self.leaders
            if leads:  # then nothing is waiting: a free slot is always handed on at once
                self.leading += 1
                member.group = [member]
            else:
                self.waiting.append(member)
        if not leads:
            member.wake.acquire()  # until its group has settled, or it is to lead one
            if member.done:
                return member.outcome
        assert member.group is not None and member.group[0] is member
        group, member.group = member.group, None  # (it holds the member: a cycle to the collector)
        try:
            self._settle(group)
        finally:
            self._hand_on(group)
        return member.outcome

    def _hand_on(self, group: list[_Member]) -> None:
        """After a group: its members are done, and its slot goes to the first waiting
        result, which leads what waits (its own first, up to max_group), or is freed."""
        with self.lock:
            for each in group:
                each.done = True
            successor = None
            if self.waiting:
                successor = self.waiting[0]
                successor.group = self.waiting[: self.max_group]
                self.waiting = self.waiting[self.max_group :]
            else:
                self.leading -= 1
        for each in group[1:]:
            each.wake.release()
        if successor is not None:
            successor.wake.release()

    def _settle(self, group: list[_Member]) -> None:
        """One statement for the group (and, in its transaction, the claim for the runs it
        ends); each member's outcome, or None (settle it alone). A group of one is a hop
        alone (a run's last one claims for its lane with it)."""
        group = sorted(group, key=lambda m: (m.step.run_id, m.step.id))
        try:
            if len(group) == 1:
                answers = [hop_planned(group[0].hop, group[0].take)]
            else:
                answers = hops_together([member.hop for member in group], group[0].take)
        except Exception as exc:
            if away(exc) is None:  # an outage is reported by each member's retry
                logger.warning("a group of %s hops failed; settling each alone", len(group),
                               exc_info=True)  # fmt: skip
            connection.close()
            return
        if len(group) > 1:
            self.groups += 1
        for member, answer in zip(group, answers, strict=True):
            member.outcome = None if answer is None else settled_by_hop(member.step, answer)
