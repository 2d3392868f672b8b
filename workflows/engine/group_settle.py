"""Group settles: successful steps that finish together in one worker commit together.

A worker's step threads hand their successful results to one settler thread and wait. The
settler takes everything waiting (up to ``MAX_GROUP``) and settles it in one transaction,
run by run in run id order (the one lock order, so two workers' groups cannot deadlock each
other), each step exactly as a settle of its own would (the run lock, the fenced transition,
the walk, the run's next step taken for this worker). Nothing is acknowledged before that
commit: a step thread returns only once its group has committed.

A lone result settles alone, as before; a group only forms while a settle is in flight, so
an idle engine pays nothing for it and a busy one pays one commit for many steps. If any
settle of a group raises, the group is rolled back and each of its steps is settled alone, so
one bad step cannot fail the others.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field, replace

from django.db import connection, transaction

from .executors import StepResult
from .hops import PlannedHop, hops_together, plan_hop
from .steps import (
    ClaimedStep,
    Settled,
    settle_and_take_next,
    settled_by_hop,
    settles_join_this_transaction,
)
from .walk import TakeNext

logger = logging.getLogger(__name__)

MAX_GROUP = 3


@dataclass
class _Request:
    step: ClaimedStep
    result: StepResult
    take: TakeNext | None
    done: threading.Event = field(default_factory=threading.Event)
    outcome: Settled | None = None
    error: BaseException | None = None


class GroupSettler:
    def __init__(self, worker: str, max_group: int = MAX_GROUP) -> None:
        self.worker = worker
        self.max_group = max_group
        self.requests: queue.Queue[_Request] = queue.Queue()
        self.groups = 0  # transactions committed with more than one settle (for tests)

    def settle(self, step: ClaimedStep, result: StepResult, take: TakeNext | None) -> Settled:
        """Called by a step thread: returns once the step's settle has committed (or raises
        what it raised, for the worker's retry)."""
        request = _Request(step, result, take)
        self.requests.put(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.outcome is not None
        return request.outcome

    def run(self, halt: threading.Event) -> None:
        """The settler thread's loop, until ``halt``."""
        while not halt.is_set():
            try:
                first = self.requests.get(timeout=0.5)
            except queue.Empty:
                continue
            batch = [first]
            while len(batch) < self.max_group:
                try:
                    batch.append(self.requests.get_nowait())
                except queue.Empty:
                    break
            self._settle(batch)
        connection.close()

    def _settle(self, batch: list[_Request]) -> None:
        try:
            if len(batch) == 1:
                self._alone(batch[0])
            else:
                self._together(batch)
        finally:
            for request in batch:
                request.done.set()

    def _together(self, batch: list[_Request]) -> None:
        batch.sort(key=lambda r: (r.step.run_id, r.step.id))
        batch = self._hop_together(batch)
        if len(batch) == 1:
            self._alone(batch[0])
            return
        if not batch:
            return
        try:
            with transaction.atomic(durable=True), settles_join_this_transaction():
                outcomes = [
                    settle_and_take_next(r.step, r.result, worker=self.worker, take=r.take)
                    for r in batch
                ]
        except Exception:
            logger.warning("a group of %s settles failed; settling each alone", len(batch),
                           exc_info=True)  # fmt: skip
            connection.close()
            for request in batch:
                self._alone(request)
            return
        self.groups += 1
        for request, outcome in zip(batch, outcomes, strict=True):
            request.outcome = outcome

    def _hop_together(self, batch: list[_Request]) -> list[_Request]:
        """Settle as one statement those of the batch that can hop (hops.hops_together), in
        the batch's order; return the others, to settle the slow way. A run's last hop claims
        no step of the lane here (the worker's claim loop claims for the slots it frees).
        Raises nothing: if the statement fails, none of them was written and all are
        returned."""
        planned: list[tuple[_Request, PlannedHop]] = []
        rest: list[_Request] = []
        for request in batch:
            take = request.take
            if take is not None and take.claim_lane:
                take = replace(take, claim_lane=False)
            hop = plan_hop(request.step, request.result, worker=self.worker, take=take)
            if hop is None:
                rest.append(request)
            else:
                planned.append((request, hop))
        if len(planned) < 2:
            return batch  # nothing to group: each settles as it would alone
        try:
            hopped = hops_together([hop for _, hop in planned])
        except Exception:
            logger.warning("a group of %s hops failed; settling each alone", len(planned),
                           exc_info=True)  # fmt: skip
            connection.close()
            return batch
        self.groups += 1
        for (request, _), answer in zip(planned, hopped, strict=True):
            if answer is None:
                rest.append(request)  # its run changed: the slow way, from the run as it is
            else:
                request.outcome = settled_by_hop(request.step, answer)
        return sorted(rest, key=lambda r: (r.step.run_id, r.step.id))

    def _alone(self, request: _Request) -> None:
        try:
            request.outcome = settle_and_take_next(
                request.step, request.result, worker=self.worker, take=request.take
            )
        except BaseException as exc:  # handed to the step thread, which retries or fails
            request.error = exc
