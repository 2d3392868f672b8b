"""A lane worker: claims no more steps than it has free slots, runs them, settles them.

Threads:
- the main thread claims (one statement for up to ``free slots`` steps) and dispatches;
- ``concurrency`` daemon threads execute steps and settle them;
- a heartbeat thread extends the leases of running steps on its own connection, so a busy
  step or a slow settle cannot starve it;
- a listener thread turns notifications for the lane into wake-ups (polling is the truth).

On SIGTERM/SIGINT the worker stops claiming, lets running steps finish within the grace
period, then releases the rest with lease_until = now() so another worker takes them at once.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import InterfaceError, OperationalError, connection
from opentelemetry.trace import SpanKind

from . import logcontext, metrics, sql, tracing
from .compensation import is_compensation_step
from .definition_cache import version_label
from .executors import StepDeferred, StepFailure, StepResult, executor_for, message_of
from .faults import crash_point, heartbeats_paused
from .group_settle import GroupSettler
from .lanes import FairShare, LanePolicy, engine_setting
from .steps import (
    ClaimedStep,
    PreparedClaims,
    Settled,
    claim,
    claim_suspect,
    fail_step_and_run,
    heartbeat,
    next_after_org,
    plan_claims_generically_from_now_on,
    promote_due_retries,
    release,
    retries,
    run_context,
    settle_and_take_next,
    settle_continuation,
    settle_deferred,
    settle_failure,
    step_context,
)
from .stop_signals import on_stop_signal
from .transient import (
    Outage,
    away,
    database_answers,
    is_transient,
    log_failure,
    lost_connection,
)
from .transport import Transport, default_transport, own_connection
from .walk import QuickStepRetry, TakeNext

logger = logging.getLogger(__name__)

# An attempt whose executor met a transient database error (a lost connection, a restart, no
# free connection, lock_timeout) is run again after this long without counting: the
# database's absence or contention is not the step's fault.
DATABASE_DEFER_SECONDS = 1.0
# A slot idle this long closes its database connection. Held by idle slots (32 an io
# worker), connections run out on a server several hosts share; then the one settle that
# needs a connection cannot get one and nothing gives one back (three hosts against
# max_connections 100 stalled so). A busy slot keeps its connection: no reconnect per step.
IDLE_CONNECTION_SECONDS = 10.0
IDLE_SECOND_LOOK_SECONDS = 0.002  # after listing itself idle (see _claim_loop)
EXIT_REPLACE_ME = 75  # EX_TEMPFAIL: hung executors; start a fresh process in this one's place


@dataclass
class Attempt:
    """One claimed attempt in flight in this worker: everything the threads share about it.

    Keyed by (step id, attempt): after a lost lease this worker may claim the same step
    again as a newer attempt while the old one is still running here."""

    step: ClaimedStep
    deadline: float  # when the attempt times out (monotonic)
    extended: float  # last lease extension (monotonic)
    lost: threading.Event = field(default_factory=threading.Event)  # stop: result dropped
    timed_out: bool = False
    alone: bool = False  # a suspect: nothing else is claimed while it runs

    @property
    def key(self) -> tuple[int, int]:
        return (self.step.id, self.step.attempt)


class Worker:
    def __init__(
        self,
        policy: LanePolicy,
        *,
        concurrency: int | None = None,
        transport: Transport | None = None,
        poll_seconds: float | None = None,
        grace_seconds: float | None = None,
        name: str | None = None,
        suspects_only: bool = False,
    ) -> None:
        self.policy = policy
        # A suspects-only worker runs one suspect at a time and nothing else (runengine starts
        # one per lane, so suspects are never starved by a busy lane).
        self.suspects_only = suspects_only
        self.concurrency = 1 if suspects_only else (concurrency or policy.concurrency)
        self.transport = transport or default_transport()
        self.poll_seconds = poll_seconds or engine_setting("WORKER_POLL_SECONDS")
        self.grace_seconds = (
            grace_seconds if grace_seconds is not None else engine_setting("SHUTDOWN_GRACE_SECONDS")
        )
        # A settle meeting a transient database error is tried again, with growing pauses,
        # this long (120 s by default): past the time a server takes to restart and past the
        # default idle_in_transaction_session_timeout that ends a stuck lock holder. Giving
        # up earlier would let the lease lapse and count an attempt the step never spent.
        self.settle_patience = float(engine_setting("SETTLE_PATIENCE_SECONDS"))
        role = f"{policy.name}:suspects" if suspects_only else policy.name
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{role}"
        self.stop = threading.Event()  # stop claiming
        self.halt = threading.Event()  # stop every thread
        self.wake = threading.Event()
        self.tasks: queue.Queue[Attempt | None] = queue.Queue()
        self.inflight: dict[tuple[int, int], Attempt] = {}  # guarded by self.lock
        self.lock = threading.Lock()
        self.slot_free = threading.Condition(self.lock)
        self.after_org = 0
        self.completed = 0
        self.next_promotion = 0.0
        self.next_suspect_look = 0.0
        self.listed_idle = False  # in workflows_idleworker (see _list_idle)
        self.second_look_at = 0.0  # when to claim again after listing (0: no second look)
        self.idle_refresh_at = 0.0
        self.claims = PreparedClaims()  # the claim loop's own connection
        # A database outage is one warning per loop (and one when it is back), not a
        # traceback per try: the claims, the settles (all slots share it), the heartbeat.
        self.claims_outage = Outage(f"worker {self.name}: claims", logger)
        self.settles_outage = Outage(f"worker {self.name}: settles", logger)
        self.heartbeat_outage = Outage(f"worker {self.name}: heartbeat", logger)
        # Counted by a slot that found its connection lost (a restart, a failover): every
        # slot's connection went with it. A slot that has not seen the count yet opens a new
        # connection before its next attempt (no round trip: it closes the old one), instead
        # of finding out in that attempt, which cost the step a deferral and said the outage
        # again (engine/transient.py, Outage) once per slot.
        self.connections_lost = 0
        self._slot = threading.local()  # a slot thread's own: the count it has seen
        # A settle may claim the run's next step for this worker (not for a suspects-only
        # worker: its one slot is for suspects).
        self.take_next = (
            None
            if suspects_only
            else TakeNext(self.name, policy.name, policy.lease_seconds,
                          claim_lane=bool(engine_setting("SETTLE_CLAIMS")))
        )  # fmt: skip
        # Successful steps that finish together commit together (group_settle.py); a
        # suspects-only worker runs one step at a time and has nothing to group.
        grouped = engine_setting("GROUP_SETTLES") and not suspects_only
        self.settler = (
            GroupSettler(self.name, engine_setting("GROUP_MAX"), engine_setting("GROUP_SETTLERS"))
            if grouped
            else None
        )
        # Executors past their timeout that never returned; past this many the process asks
        # to be replaced (``replace_requested``): a hung thread cannot be killed, only left.
        configured = engine_setting("WORKER_MAX_HUNG")
        self.max_hung = configured or max(1, self.concurrency // 4)
        self.replace_requested = False

    # --- lifecycle --------------------------------------------------------------------------

    def run(self) -> None:
        with on_stop_signal(self.request_stop):
            self._run()

    def _run(self) -> None:
        plan_claims_generically_from_now_on()
        threads = [
            threading.Thread(target=self._execute_loop, name=f"step-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        threads.append(threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True))
        if not self.suspects_only:  # suspects come from lapsed leases, not wake-ups: it polls
            threads.append(
                threading.Thread(
                    target=self.transport.subscribe,
                    args=(self.policy.name, self.wake, self.halt),
                    name="listener",
                    daemon=True,
                )
            )
        for thread in threads:
            thread.start()
        logger.info("worker %s: lane %s, %s slots", self.name, self.policy.name, self.concurrency)
        try:
            self._claim_loop()
            self._drain()
        finally:
            self._strike_off_idle()
            self.claims.close()
            self.halt.set()
            for _ in range(self.concurrency):
                self.tasks.put(None)
            connection.close()
        logger.info("worker %s stopped after %s steps", self.name, self.completed)

    def request_stop(self) -> None:
        self.stop.set()
        self.wake.set()
        with self.slot_free:
            self.slot_free.notify_all()

    # --- claiming ---------------------------------------------------------------------------

    def _claim_loop(self) -> None:
        while not self.stop.is_set():
            with self.slot_free:
                while self._no_slot() and not self.stop.is_set():
                    self.slot_free.wait(self.poll_seconds)
                free = self.concurrency - len(self.inflight)
                idle = not self.inflight
                share = self._fair_share()
            if self.stop.is_set():
                return
            self.wake.clear()
            # Listed before the claim, not after it finds nothing: a start that read the
            # listing too early to notify this worker then commits before the claim, or just
            # after (the second look, below), and not while the claim's round trip runs.
            newly_listed = idle and not self.listed_idle and self._list_idle()
            # Whether this pass asked the database anything: only an answer says it is back
            # (a suspects-only worker's pass often asks nothing, its looks being due seldom).
            asked = not self.suspects_only or self._promotion_due()
            try:
                promoted = self._promote_due_retries()
                claimed = [] if self.suspects_only else claim(
                    policy=self.policy, worker=self.name, limit=free, after_org=self.after_org,
                    share=share, on=self.claims,
                )  # fmt: skip
                alone = False
                if not claimed and idle and self._suspects_due():
                    asked = True
                    claimed = self._claim_suspect()
                    alone = bool(claimed)
            except Exception as exc:
                # The pause grows while the database stays away, capped well below the poll
                # interval (which may be long: it is only the backstop for lost wake-ups).
                pause = min(self.poll_seconds, self.claims_outage.failed(exc))
                connection.close()
                self.stop.wait(pause)
                continue
            if asked:
                self.claims_outage.ok()
            if claimed:
                metrics.steps_claimed(self.policy.name, len(claimed))
                self._strike_off_idle()
                self.after_org = next_after_org(claimed, self.after_org)
                now = time.monotonic()
                attempts = [
                    Attempt(step, deadline=now + self.policy.timeout_seconds, extended=now,
                            alone=alone)
                    for step in claimed
                ]  # fmt: skip
                with self.lock:
                    for attempt in attempts:
                        self.inflight[attempt.key] = attempt
                for attempt in attempts:
                    self.tasks.put(attempt)
            if not claimed and not promoted:
                if newly_listed:
                    # Claim once more shortly: a transaction that looked for idle workers
                    # just before the listing committed notified nobody, and may commit
                    # only after the claim.
                    self.second_look_at = time.monotonic() + IDLE_SECOND_LOOK_SECONDS
                elif idle:
                    self._list_idle()  # kept fresh, once per poll interval
                # Nothing to take: sleep until woken (a notification, a finished step, or
                # shutdown) or until the poll interval has passed. A short batch is no reason
                # to sleep: the fair share per organisation may have capped it while one
                # organisation still has a backlog, so claim again at once.
                self.wake.wait(self._sleep_seconds())

    def _sleep_seconds(self) -> float:
        if not self.second_look_at:
            return self.poll_seconds
        left, self.second_look_at = self.second_look_at - time.monotonic(), 0.0
        return max(0.0, left)

    def _list_idle(self) -> bool:
        """List this worker as idle (sql.MARK_IDLE), so a transaction that makes work for
        its lane notifies it at once instead of leaving that to the relay's next batch.
        Refreshed once per poll interval while idle; a dead worker's listing lapses after
        three. True when it was not listed before."""
        now = time.monotonic()
        if self.suspects_only or now < self.idle_refresh_at:
            return False  # a suspects-only worker does not listen for work
        ttl = 3 * self.poll_seconds
        params = {"worker": self.name, "lane": self.policy.name, "ttl": ttl}
        if not self._hint(sql.MARK_IDLE, params):
            return False
        newly, self.listed_idle = not self.listed_idle, True
        self.idle_refresh_at = now + self.poll_seconds
        return newly

    def _strike_off_idle(self) -> None:
        """Busy again: writers to this lane need not notify (a busy worker claims again after
        every step it finishes)."""
        if self.listed_idle and self._hint(sql.MARK_BUSY, {"worker": self.name}):
            self.listed_idle, self.idle_refresh_at = False, 0.0

    def _hint(self, statement: str, params: dict[str, object]) -> bool:
        """Write the idle listing; it is only a hint (the relay wakes the lane anyway), so
        a failure is logged and the claim loop goes on."""
        try:
            self.claims.rowcount(statement, params)
        except Exception as exc:
            # An outage is the claims' to report (they meet it too, and say it once, not at
            # every pass); a bug is shown whole.
            if not is_transient(exc):
                logger.warning("worker %s could not update its idle listing", self.name,
                               exc_info=True)  # fmt: skip
            return False
        return True

    def _fair_share(self, settling: ClaimedStep | None = None) -> FairShare:
        """This worker's slots as a claim may share them out now (lanes.FairShare); call
        with ``self.lock`` held. ``settling``: a step whose settle claims, its slot given back."""
        held = [
            attempt.step.org_id for attempt in self.inflight.values()
            if settling is None or attempt.step is not settling
        ]  # fmt: skip
        return self.policy.fair_share(self.concurrency, held)

    def _no_slot(self) -> bool:
        """No claim while every slot is taken, or while a suspect runs alone."""
        full = len(self.inflight) >= self.concurrency
        return full or any(attempt.alone for attempt in self.inflight.values())

    def _suspects_due(self) -> bool:
        """Look for suspects at most once per poll interval: an idle worker that found no
        ready step should not pay a second query each time it is woken."""
        now = time.monotonic()
        if now < self.next_suspect_look:
            return False
        self.next_suspect_look = now + self.poll_seconds
        return True

    def _claim_suspect(self) -> list[ClaimedStep]:
        """Holding nothing, take one suspect (its last attempt never settled) to run alone:
        if it kills this process, it costs no other step an attempt."""
        suspect = claim_suspect(policy=self.policy, worker=self.name, on=self.claims)
        if suspect is None:
            return []
        logger.warning("worker %s runs suspect step %s (attempt %s) alone", self.name,
                       suspect.id, suspect.attempt)  # fmt: skip
        return [suspect]

    def _promotion_due(self) -> bool:
        return time.monotonic() >= self.next_promotion

    def _promote_due_retries(self) -> int:
        """Make this lane's due retries ready: at most once per poll interval (the sweep is
        the backstop), so a busy worker pays one cheap statement a second for it."""
        now = time.monotonic()
        if now < self.next_promotion:
            return 0
        self.next_promotion = now + self.poll_seconds
        return promote_due_retries(lane=self.policy.name, worker=self.name, on=self.claims)

    def _drain(self) -> None:
        """Let running steps finish within the grace period, then release the rest."""
        deadline = time.monotonic() + self.grace_seconds
        with self.slot_free:
            while self.inflight and time.monotonic() < deadline:
                self.slot_free.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            # A hung attempt is not handed back: its lease lapses, so it is claimed again as a
            # suspect (alone) and the attempt counts; handing it back would let it hang forever.
            held = [key for key, attempt in self.inflight.items() if not attempt.timed_out]
            # Their executors (and queued steps not started yet) stop at the next safe point:
            # another worker owns them once they are released.
            for attempt in self.inflight.values():
                attempt.lost.set()
            self.inflight.clear()
        if held:
            count = release(held=held, worker=self.name)
            logger.info("worker %s released %s step(s) on shutdown", self.name, count)

    # --- executing --------------------------------------------------------------------------

    def _execute_loop(self) -> None:
        while not self.halt.is_set():
            attempt = self._next_task()
            # A settle may hand back the run's next step, claimed for this worker in the same
            # transaction: it runs here next, in the same slot, without a claim.
            while attempt is not None:
                attempt = self._execute_one(attempt)
            if self.halt.is_set():
                break
        connection.close()

    def _next_task(self) -> Attempt | None:
        """The slot's next attempt. A slot idle for IDLE_CONNECTION_SECONDS gives its
        database connection back first (see there)."""
        try:
            return self.tasks.get(timeout=IDLE_CONNECTION_SECONDS)
        except queue.Empty:
            connection.close()
            return self.tasks.get()

    def _execute_one(self, attempt: Attempt) -> Attempt | None:
        taken = None
        try:
            taken = self._execute(attempt)
        except Exception as exc:
            log_failure(logger, exc, "step %s attempt %s: settle failed", *attempt.key)
            connection.close()
        finally:
            with self.slot_free:
                self.inflight.pop(attempt.key, None)
                self.completed += 1
                if taken is None:
                    self.slot_free.notify_all()
            if taken is None:
                # A slot is free, and the finished step may have made work ready: look now.
                # Not when the settle handed this slot the run's next step: nothing was freed,
                # and the claim would mostly come back empty (a commit for nothing); other
                # work the walk made ready is woken through the outbox.
                self.wake.set()
        return taken

    def _adopt(self, step: ClaimedStep) -> Attempt | None:
        """Take on the step a settle claimed for this worker; hand it straight back when the
        worker is stopping (the drain may already have released what it held)."""
        metrics.steps_claimed(step.lane, 1)
        now = time.monotonic()
        attempt = Attempt(step, deadline=now + self.policy.timeout_seconds, extended=now)
        with self.lock:
            stopping = self.stop.is_set()
            if not stopping:
                self.inflight[attempt.key] = attempt
        if stopping:
            release(held=[attempt.key], worker=self.name)
            return None
        return attempt

    def _execute(self, attempt: Attempt) -> Attempt | None:
        """Run one attempt and settle it; return the run's next step when the settle claimed
        it for this worker. What is logged meanwhile names the run and the step (with
        WAYMARK_LOG_FORMAT=json: logcontext.py)."""
        if not logcontext.on():
            return self._execute_traced(attempt)
        step = attempt.step
        with logcontext.bound(run_id=step.run_id, step=step.step_id, iteration=step.iteration,
                              attempt=step.attempt, org_id=step.org_id):  # fmt: skip
            return self._execute_traced(attempt)

    def _execute_traced(self, attempt: Attempt) -> Attempt | None:
        """The attempt, traced: a span, the child of its run's start (tracing.py)."""
        if not tracing.on():
            return self._execute_attempt(attempt)
        step = attempt.step
        parent = tracing.parent_of_run(step.trace_context)
        with tracing.span("waymark.step", kind=SpanKind.CONSUMER, parent=parent,
                          attributes=_step_attributes(step)):  # fmt: skip
            taken = self._execute_attempt(attempt)
        if taken is not None and taken.step.run_id == step.run_id:
            # A step the settle's walk claimed for this worker comes without the run's row:
            # it is the same run, so the same trace.
            taken.step = replace(taken.step, trace_context=step.trace_context)
        return taken

    def _execute_attempt(self, attempt: Attempt) -> Attempt | None:
        step, lost = attempt.step, attempt.lost
        if lost.is_set():
            return None  # handed back on shutdown before it started
        refused = self._refused(step)
        if refused is not None:
            if tracing.on():
                _trace_outcome(None, refused)
            self._fail(step, refused)
            return None
        if step.is_continuation:
            # Walk on from where an earlier walk stopped: no executor, just the settle.
            try:
                continued = self._settle(step, lambda: settle_continuation(step, worker=self.name))
            except QuickStepRetry as retry:  # its walk rolled back: try again after backoff
                self._fail(step, retry.failure)
                return None
            _count_settle(step, continued, "continued")
            return None
        crash_point("worker.after_claim")
        result, failure = self._run_executor(attempt)
        if attempt.timed_out:
            failure = self._timeout_failure()  # whatever it returned, it was too late
        elif self._abandoned(step, lost):
            metrics.step_fenced_out(step.lane)
            if tracing.on():
                tracing.current().set_attribute(tracing.OUTCOME, "fenced_out")
            return None
        if tracing.on():
            _trace_outcome(result, failure)
        if isinstance(failure, StepDeferred):
            deferred = failure
            later = self._settle(step, lambda: settle_deferred(step, deferred, worker=self.name))
            _count_settle(step, later, "deferred")
        elif failure is not None:
            self._fail(step, failure)
        elif result is not None:
            settled = self._settle(step, self._success(step, result))
            _count_settle(step, settled, "succeeded" if result.park is None else "waiting")
            if isinstance(settled, Settled) and settled.next_step is not None:
                if settled.from_lane:  # the lane's fair claim served an organisation
                    # A hint for fairness, as in the claim loop: no lock (a lost update only
                    # serves one organisation again).
                    self.after_org = next_after_org([settled.next_step], self.after_org)
                return self._adopt(settled.next_step)
        return None

    @staticmethod
    def _refused(step: ClaimedStep) -> StepFailure | None:
        """Why the step fails without running, if it does."""
        if step.poisoned:
            return StepFailure(
                f"attempts exhausted: {step.max_attempts} claim(s) never settled "
                "(the step may kill its worker)",
                retryable=False,
            )
        if step.run_expired and not is_compensation_step(
            step.version_id, step.step_id, step.run_outputs
        ):
            # No work for a run past its max age: the failed step makes the walk end the run.
            # (A compensation is not held by it: engine/compensation.py.)
            return StepFailure("max_age_exceeded: the run is past its max age", retryable=False)
        return None

    def _success(self, step: ClaimedStep, result: StepResult) -> Callable[[], Settled]:
        """The settle of a successful attempt: through the group settler, unless it parks
        (a park is its own kind of settle) or the worker settles alone."""
        take = None if self.stop.is_set() else self.take_next
        if take is not None and take.claim_lane:
            # A settle's claim is the lane's fair claim: it goes on from where this worker's
            # claims left off (after_org), as the claim loop's would, and within each
            # organisation's share of the slots, this step's own given back.
            with self.lock:
                share = self._fair_share(settling=step)
            take = replace(take, after_org=self.after_org, share=share)
        settler = self.settler
        if settler is not None and result.park is None:
            return lambda: settler.settle(step, result, take)
        return lambda: settle_and_take_next(step, result, worker=self.name, take=take)

    def _run_executor(
        self, attempt: Attempt
    ) -> tuple[StepResult | None, StepFailure | StepDeferred | None]:
        step = attempt.step
        ctx = step_context(step, deadline=attempt.deadline, lost=attempt.lost)
        assert not connection.in_atomic_block, "executors never run inside a transaction"
        self._renew_a_lost_connection()
        try:
            step_def, context = run_context(step)
            return executor_for(step.type)(step_def, context, ctx), None
        except (StepFailure, StepDeferred) as failure:
            return None, failure
        except Exception as exc:
            transient = away(exc)
            if transient is not None:
                # The database went away under the executor (a restart, a terminated
                # backend, no free connection) or kept it waiting (lock_timeout behind a slow
                # transaction, a deadlock): not the step's fault, so the attempt does not
                # count, and no traceback. The deferral's settle waits for the database (see
                # _settle); an effect whose answer was not recorded is looked up again.
                lost = lost_connection(transient)
                if lost:
                    connection.close()
                self._database_failed(transient)
                code = "database_unavailable" if lost else "database_busy"
                return None, StepDeferred(DATABASE_DEFER_SECONDS, f"{code}: {type(exc).__name__}")
            # A bug or an outage in the step: retry it, never crash.
            logger.exception("step %s attempt %s raised", step.id, step.attempt)
            return None, StepFailure(f"{type(exc).__name__}: {message_of(exc)}")

    def _database_failed(self, transient: BaseException) -> None:
        """A settle or an executor met a transient error (its connection, if lost, closed):
        the settles' outage, unless only this slot's connection was lost while a new one
        answers. That connection ended with an outage already over (a restart ends every
        connection, and a slot finds its own dead only when it next uses it): saying the
        outage again, and then that it is over, would be a second pair of lines for one
        outage, one per slot. The next try is on a new connection either way."""
        if lost_connection(transient):
            self._count_a_lost_connection()
            # Asked only while no outage is being said: then it is said as before.
            if self.settles_outage.since is None and database_answers():
                return
        self.settles_outage.failed(transient)

    def _count_a_lost_connection(self) -> None:
        """This slot's connection was lost (and closed): so was every other slot's (see
        connections_lost)."""
        with self.lock:
            self.connections_lost += 1
            self._slot.lost_seen = self.connections_lost

    def _renew_a_lost_connection(self) -> None:
        """Before an attempt: a new connection for this slot if another slot found theirs
        lost since this one last looked (its own may have died with it, unused since)."""
        lost = self.connections_lost
        if getattr(self._slot, "lost_seen", 0) != lost:
            self._slot.lost_seen = lost
            connection.close()

    def _fail(self, step: ClaimedStep, failure: StepFailure) -> None:
        final = not retries(step, failure)
        failed = self._settle(
            step, lambda: settle_failure(step, failure, worker=self.name, policy=self.policy)
        )
        if failed is True:
            metrics.step_failed(step.lane, final=final)
        elif failed is False:
            metrics.step_fenced_out(step.lane)

    def _settle(self, step: ClaimedStep, write: Callable[[], object]) -> object:
        """Run a settle, retrying on a transient database error (a dropped connection, a
        server restarting, a deadlock, a lock timeout) with a fresh connection, pausing
        longer each time, for up to self.settle_patience (WAYMARK_SETTLE_PATIENCE_SECONDS).

        Safe to repeat: the settle is fenced, so a retry after a commit whose answer was lost
        is simply refused. A failure that is not the database's (the walk raised) fails the
        step and its run without walking, instead of re-running the step until poisoned.
        """
        give_up = time.monotonic() + self.settle_patience
        tries = 0
        while True:
            # No health check up front (it would cost a round trip per step): a dead
            # connection fails the settle, which is then retried on a fresh one.
            try:
                settled = write()
            except QuickStepRetry:
                raise
            except Exception as exc:
                # Any error met while the database does not answer is the outage's (tried
                # again, as a transient one): only with the database answering is an error
                # that is not transient the walk's own, failing the run.
                transient = away(exc)
                if transient is None and not isinstance(exc, OperationalError | InterfaceError):
                    self._walk_failed(step, exc)
                    return None
                tries += 1
                if tries == 1:
                    self._keep_through_settle(step, give_up)
                connection.close()
                pause = min(2.0, 0.05 * 2 ** min(tries - 1, 6))
                if transient is None:
                    logger.warning("settle of step %s failed (try %s); retrying", step.id, tries,
                                   exc_info=True)  # fmt: skip
                    if tries >= 3:
                        break
                else:
                    self._database_failed(transient)  # (the connection closed above)
                if time.monotonic() + pause > give_up or self.halt.wait(pause):
                    break
                continue
            self.settles_outage.ok()
            return settled
        logger.error("gave up settling step %s after %s tries; its lease will lapse and it will "
                     "re-run", step.id, tries)  # fmt: skip
        return None

    def _keep_through_settle(self, step: ClaimedStep, give_up: float) -> None:
        """A settle being retried keeps its attempt within its timeout until it gives up:
        the executor is done, so the heartbeat goes on holding the lease (and the attempt is
        not taken for a hung executor) while the database keeps the settle waiting."""
        with self.lock:
            attempt = self.inflight.get((step.id, step.attempt))
            if attempt is not None and not attempt.timed_out:
                attempt.deadline = max(attempt.deadline, give_up)

    def _walk_failed(self, step: ClaimedStep, exc: Exception) -> None:
        """The settle's walk raised an error of its own: fail the step and its run."""
        logger.exception("the walk failed for step %s attempt %s", step.id, step.attempt)
        if fail_step_and_run(step, f"engine_error: {type(exc).__name__}: {message_of(exc)}",
                             worker=self.name):  # fmt: skip
            metrics.step_failed(step.lane, final=True)

    def _timeout_failure(self) -> StepFailure:
        return StepFailure(f"timed out after {self.policy.timeout_seconds:g} s")

    def _abandoned(self, step: ClaimedStep, lost: threading.Event) -> bool:
        """A newer attempt owns the step: drop this attempt's result without writing."""
        if lost.is_set():
            logger.warning(
                "worker %s: step %s attempt %s lost its lease; result dropped",
                self.name, step.id, step.attempt,
            )  # fmt: skip
        return lost.is_set()

    # --- heartbeats -------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        interval = self.policy.lease_seconds / 3
        conn = None
        while not self.halt.wait(interval):
            self._time_out_attempts()
            with self.lock:
                held = [key for key, a in self.inflight.items() if not a.timed_out]
            if not held or heartbeats_paused():
                continue
            try:
                if conn is None or conn.closed:
                    conn = own_connection()
                    # Rows locked by another transaction are skipped, not waited for; this
                    # bounds anything else (a lock on the table, say).
                    conn.execute("SET lock_timeout = '2s'")
                beat = heartbeat(conn, held=held, lease_seconds=self.policy.lease_seconds)
            except Exception as exc:
                self.heartbeat_outage.failed(exc)  # the next beat is the next try
                if conn is not None:
                    conn.close()
                conn = None
                self._give_up_stale_leases()
                continue
            self.heartbeat_outage.ok()
            now = time.monotonic()
            with self.lock:
                for key in held:
                    attempt = self.inflight.get(key)
                    if attempt is None:
                        continue
                    if key in beat.extended:
                        attempt.extended = now
                    elif key in beat.lost:
                        # Taken over, cancelled or settled: tell its executor to stop (the
                        # slot is then freed without a settle that would be refused).
                        attempt.lost.set()
        if conn is not None:
            conn.close()

    def _time_out_attempts(self) -> None:
        """Past its lane's timeout an attempt gets no more heartbeats and is told to stop; its
        executor's return then records a retryable failure. An executor that never returns
        lets the lease lapse, so the claim counts the attempt and poison detection ends it."""
        now = time.monotonic()
        with self.lock:
            for key, attempt in self.inflight.items():
                if attempt.deadline <= now and not attempt.timed_out:
                    logger.warning("worker %s: step %s attempt %s timed out", self.name, *key)
                    attempt.timed_out = True
                    attempt.lost.set()
            # Told to stop a lease ago and still not returned: hung for good.
            hung = sum(
                1 for a in self.inflight.values()
                if a.timed_out and a.deadline + self.policy.lease_seconds <= now
            )  # fmt: skip
        if hung >= self.max_hung and not self.replace_requested:
            logger.error(
                "worker %s: %s executor(s) hung past their timeout (%s slots); handing the "
                "other steps back and asking to be replaced", self.name, hung, self.concurrency,
            )  # fmt: skip
            self.replace_requested = True
            self.request_stop()

    def _give_up_stale_leases(self) -> None:
        """Cut off from the database, assume leases not extended for most of their length
        are lost. The worker's clock is used only to give up early, never to claim."""
        horizon = time.monotonic() - 0.9 * self.policy.lease_seconds
        with self.lock:
            for attempt in self.inflight.values():
                if attempt.extended < horizon:
                    attempt.lost.set()


def _count_settle(step: ClaimedStep, settled: object, result: str) -> None:
    """Count what a settle did: ``result`` when it committed, fenced out when it was refused
    (a newer attempt owns the step). None: nothing was written (the settle gave up, or the
    engine failed the run, counted as a failure where that happened)."""
    if settled is None:
        return
    ok = settled.ok if isinstance(settled, Settled) else bool(settled)
    if ok:
        # Steps of this lane run in this settle with the turn that asked them: each is a step
        # of the lane done, as if claimed and settled on its own (counted with this one's
        # success in one increment: each costs the worker a locked write to its file).
        ran = settled.ran_with_turn if isinstance(settled, Settled) else 0
        succeeded = ran + (result == "succeeded")
        if result != "succeeded":
            metrics.step_settled(step.lane, result)
        if succeeded:
            metrics.step_settled(step.lane, "succeeded", succeeded)
        if ran:
            metrics.steps_claimed(step.lane, ran)
        for _ in range(settled.failed_with_turn if isinstance(settled, Settled) else 0):
            metrics.step_failed(step.lane, final=True)
    else:
        metrics.step_fenced_out(step.lane)


def _step_attributes(step: ClaimedStep) -> dict[str, Any]:
    """What a step attempt's span says of it (engine/tracing.py)."""
    automation, number = version_label(step.version_id)
    return {
        tracing.RUN_ID: step.run_id, tracing.ORG_ID: step.org_id,
        tracing.AUTOMATION: automation, tracing.VERSION: number,
        tracing.VERSION_ID: step.version_id, tracing.STEP: step.step_id,
        tracing.ITERATION: step.iteration, tracing.ATTEMPT: step.attempt,
        tracing.LANE: step.lane, tracing.STEP_TYPE: step.type,
    }  # fmt: skip


def _trace_outcome(result: StepResult | None, failure: StepFailure | StepDeferred | None) -> None:
    """What the attempt's executor did, on its span: a failure is the span's error; a
    deferral (not the step's fault, no attempt spent) is not."""
    span = tracing.current()
    if isinstance(failure, StepDeferred):
        span.set_attribute(tracing.OUTCOME, "deferred")
    elif failure is not None:
        span.set_attribute(tracing.OUTCOME, "failed")
        tracing.failed(span, failure, message=str(failure))
    elif result is not None:
        span.set_attribute(tracing.OUTCOME, "succeeded" if result.park is None else "waiting")
