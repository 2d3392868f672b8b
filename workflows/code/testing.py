"""A test helper for a host's own tests of its code workflows
(docs/how-to/test-a-code-workflow.md). FOR TESTS ONLY: it moves a run's waits to now and runs
steps in the calling process; it refuses to run where ``WAYMARK_PRODUCTION`` is set.

It drives the real engine on the real database: a run is started through the ordinary start
path, its steps are claimed, executed and settled through a real Worker's code path (in this
process, lane after lane, until none is ready), signals go through the signal service, and
time is skipped on the real wait rows: the run's pending waits are made due now (its timers,
through the apps that keep them, and the deadlines on its steps) and fired through the real
sweep path, which compares instants with the database's clock. Nothing patches a clock.

The engine commits in transactions of its own: a test that uses it runs with
``@pytest.mark.django_db(transaction=True)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models.functions import Now

from ..definitions.registry import WORKER_LANES
from ..engine.lanes import lane_policy
from ..engine.steps import claim, promote_due_retries
from ..engine.sweep import sweep_once
from ..engine.worker import Attempt, Worker
from ..models import Organisation, Run, Step
from ..production import in_production
from ..services.runs import run_start
from ..services.signals import signal_send
from ..states import RUN_FINISHED, StepStatus
from .publish import publish_code_workflow
from .steptypes import CODE

TESTER = "workflow-test"  # the worker and sweeper name the steps and events it drives show

# What an app that keeps a kind of wait of its own (the timers app: a sleep's timer; the
# approvals app: a request's expiry) does to skip time for one run: make the run's pending
# waits of that kind due now, by the database's clock, and fire those its app fires through
# its real firing path; returns how many it fired (the deadlines kept on steps are fired
# after, by the engine's sweep). Registered from the app's AppConfig.ready() with
# register_time_skip; called only by this helper.
TimeSkip = Callable[[int, int], int]  # (org_id, run_id) -> fired
TIME_SKIPS: dict[str, TimeSkip] = {}

# What an app that keeps a kind of human decision (the approvals app) does to decide the
# run's pending request at a step as a named user, through its real decision service with
# its permission checks: (org_id, run_id, step_id, user, decision, comment, answer) -> None,
# raising WorkflowTestError when the request is missing or the decision refused.
Decider = Callable[[int, int, str, Any, str, str, Mapping[str, Any] | None], None]
DECIDERS: dict[str, Decider] = {}


class WorkflowTestError(AssertionError):
    """What the helper found instead of what the test asked for (a run still waiting, a
    refused decision); an AssertionError, so pytest reports it as the test's failure."""


def register_time_skip(name: str, skip: TimeSkip) -> None:
    """Have ``WorkflowTest.skip_time`` call ``skip(org_id, run_id)`` (see TimeSkip)."""
    TIME_SKIPS[name] = skip


def register_decider(name: str, decider: Decider) -> None:
    """Have ``WorkflowTest.decide`` call ``decider(...)`` (see Decider)."""
    DECIDERS[name] = decider


@dataclass(frozen=True)
class StepView:
    step_id: str
    iteration: int
    type: str
    status: str
    output: Any
    wait_kind: str


@dataclass(frozen=True)
class RunView:
    """A run as the test reads it: its row's state and its steps, in the order entered (the
    code workflow's own steps: neither the deciders' turns nor the engine's continuations)."""

    id: int
    status: str
    output: Any
    error: str
    steps: list[StepView]

    @property
    def waiting(self) -> list[StepView]:
        return [s for s in self.steps if s.status == StepStatus.WAITING]

    def step(self, step_id: str, iteration: int = 1) -> StepView:
        for found in self.steps:
            if (found.step_id, found.iteration) == (step_id, iteration):
                return found
        raise WorkflowTestError(f"run {self.id} has no step {step_id!r} iteration {iteration}")


def refuse_in_production() -> None:
    if in_production():
        raise WorkflowTestError(
            "test_helper_in_production: the workflow test helper runs in tests only "
            "(WAYMARK_PRODUCTION is set)"
        )


def refuse_in_a_transaction() -> None:
    """The engine commits in transactions of its own, as in production: under a test's
    wrapping transaction (Django's TestCase, pytest-django's default) nothing it did could
    be seen as committed, and a worker refuses to run a step there."""
    if connection.in_atomic_block:
        raise WorkflowTestError(
            "test_helper_in_transaction: the workflow test helper drives the engine, which "
            "commits as it goes: use django.test.TransactionTestCase, or "
            "@pytest.mark.django_db(transaction=True), not TestCase"
        )


class WorkflowTest:
    """One run of a code workflow driven by a test.

    For example::

        t = WorkflowTest(org=org)
        t.start("order-fulfilment", version=2, input={"order": "o-1"}, start_key="t1")
        t.run_until_waiting()          # the run waits: a sleep, a signal, an approval
        t.skip_time()                  # its sleeps and timeouts end now
        t.signal("paid", correlation="o-1", payload={"amount": 12})
        run = t.run_until_finished()   # the run with its steps; raises if it still waits
    """

    def __init__(self, *, org: Organisation, max_turns: int = 200) -> None:
        refuse_in_production()
        self.org = org
        self.max_turns = max_turns
        self.run_id: int | None = None

    # --- starting ---------------------------------------------------------------------------

    def start(
        self,
        name: str,
        *,
        version: int,
        input: Mapping[str, Any] | None = None,  # the run's input, as the API names it
        start_key: str = "test",
    ) -> RunView:
        """Publish ``name`` at ``version`` for the organisation and start a run of it through
        the ordinary start path (start keys, quotas, the input checked as the API checks
        it); nothing runs yet."""
        refuse_in_a_transaction()
        publish_code_workflow(org=self.org, name=name, version=version)
        # A mapping as the object it is; anything else as given, for the start to refuse.
        given = dict(input) if isinstance(input, Mapping) else {} if input is None else input
        started = run_start(org=self.org, automation_slug=name, run_input=given,
                            start_key=start_key)  # fmt: skip
        self.run_id = started.run_id
        return self.run()

    # --- driving ----------------------------------------------------------------------------

    def run_until_waiting(self, *, max_turns: int | None = None) -> RunView:
        """Run every ready step (every lane, in this process, through a real Worker) until
        none is: the run has finished or waits on something outside it. Retries and
        deferrals are not waited out: they run at once."""
        budget = self.max_turns if max_turns is None else max_turns
        turns = 0
        while True:
            ran = self._drive_once()
            turns += ran
            if not ran:
                return self.run()
            if turns > budget:
                raise WorkflowTestError(
                    f"run {self._id()} took more than {budget} steps and is still going: "
                    "a loop in the workflow? (raise max_turns if it is meant)"
                )

    def run_until_finished(self, *, max_turns: int | None = None) -> RunView:
        """Run the run's ready steps until it has finished; return it. A run that is left
        waiting (for a signal that was not sent, a decision not taken, a sleep whose time
        was not skipped) raises WorkflowTestError naming the steps it waits on: it never
        hangs."""
        run = self.run_until_waiting(max_turns=max_turns)
        if run.status in RUN_FINISHED:
            return run
        waits = "; ".join(self._describe(s) for s in run.waiting) or "no step (nothing ready)"
        raise WorkflowTestError(
            f"run {run.id} is {run.status}, not finished: it waits on {waits}. "
            "Send the signal (signal), decide the request (decide) or skip_time() first."
        )

    # --- what the outside world does ----------------------------------------------------------

    def skip_time(self) -> int:
        """Make the run's pending waits due now and fire them through the real sweep path:
        its sleeps end (a 3-day sleep at once), its timeouts pass. Returns how many fired.
        Run the run on (run_until_waiting/finished) to see what follows."""
        refuse_in_production()
        run_id = self._id()
        # Deadlines kept on the steps themselves (a signal wait's timeout, a human step's):
        # the engine's sweep fires them when wake_at has passed, by the database's clock.
        # Only those pending now: a wait that a firing below enters (a definition's sleep
        # walks on inline into a signal wait) has not begun to wait yet.
        pending = list(
            Step.objects.filter(org_id=self.org.pk, run_id=run_id, status=StepStatus.WAITING,
                                wake_at__isnull=False)
            .exclude(wait_kind="retry")
            .values_list("pk", flat=True)
        )  # fmt: skip
        fired = sum(skip(self.org.pk, run_id) for skip in TIME_SKIPS.values())
        deadlines = Step.objects.filter(
            org_id=self.org.pk, pk__in=pending, status=StepStatus.WAITING
        ).update(wake_at=Now())
        if deadlines:
            fired += sweep_once(name=TESTER).deadlines
        return fired

    def signal(self, name: str, *, correlation: str = "", payload: Any = None) -> None:
        """Send a signal through the signal service, as the API's ``POST /api/v1/signals``."""
        signal_send(org=self.org, name=name, correlation=correlation, payload=payload)

    def decide(
        self,
        step_id: str,
        *,
        user: Any,
        decision: str = "approve",
        comment: str = "",
        answer: Mapping[str, Any] | None = None,
    ) -> None:
        """Decide the request the run waits on at ``step_id`` as ``user`` (a Django user),
        through the approvals service with its permission checks: a user who may not decide
        it is refused (WorkflowTestError naming why)."""
        refuse_in_production()
        if not DECIDERS:
            raise WorkflowTestError("no app that keeps decisions is installed (approvals)")
        for decider in DECIDERS.values():
            decider(self.org.pk, self._id(), step_id, user, decision, comment, answer)

    # --- reading ------------------------------------------------------------------------------

    def run(self) -> RunView:
        """The run now, with its steps."""
        row = Run.objects.get(org_id=self.org.pk, pk=self._id())
        steps = (
            Step.objects.filter(org_id=self.org.pk, run_id=row.pk)
            .exclude(type=CODE.name)  # the decider's turns, a branch's too
            .exclude(step_id__startswith="~")
            .order_by("id")
        )
        return RunView(
            id=row.pk, status=row.status, output=row.output, error=row.error,
            steps=[StepView(s.step_id, s.iteration, s.type, s.status, s.output, s.wait_kind)
                   for s in steps],
        )  # fmt: skip

    # --- inside -------------------------------------------------------------------------------

    def _id(self) -> int:
        if self.run_id is None:
            raise WorkflowTestError("no run yet: call start() first")
        return self.run_id

    def _drive_once(self) -> int:
        """One round over every worker lane: what ran."""
        refuse_in_production()
        refuse_in_a_transaction()
        ran = 0
        for lane in WORKER_LANES:
            worker = Worker(lane_policy(lane), concurrency=1, name=TESTER)
            # A retry or a deferral of this run is time too: taken at once.
            Step.objects.filter(org_id=self.org.pk, run_id=self._id(), status=StepStatus.WAITING,
                                wait_kind="retry").update(wake_at=Now())  # fmt: skip
            ran += run_due_steps(worker)
        return ran

    @staticmethod
    def _describe(step: StepView) -> str:
        return f"step {step.step_id!r} ({step.type}, {step.wait_kind or 'waiting'})"


def run_due_steps(worker: Worker, limit: int = 10) -> int:
    """Promote the worker's lane's due retries, claim up to ``limit`` ready steps and run each
    through the worker's own code path (execute, settle, and any next step the settle hands
    it), in this process; return how many attempts ran (0: nothing was ready)."""
    promote_due_retries(lane=worker.policy.name, worker=worker.name)
    ran = 0
    for step in claim(policy=worker.policy, worker=worker.name, limit=limit):
        attempt: Attempt | None = Attempt(step, deadline=time.monotonic() + 60,
                                          extended=time.monotonic())  # fmt: skip
        while attempt is not None:
            # Held while it runs and let go after, as the worker's own threads do
            # (Worker._execute_one): a next step the settle hands over is held by _adopt, and
            # the worker's fair share counts what it holds.
            with worker.lock:
                worker.inflight[attempt.key] = attempt
            finished, attempt = attempt, worker._execute(attempt)
            with worker.lock:
                worker.inflight.pop(finished.key, None)
            ran += 1
    return ran
