"""Runs, their steps, their history, and the outbox.

Steps are first-class rows: a run may have several live steps (parallel branches later), a
waiting step is a row like any other, and a loop enters the same step again with the next
``iteration``. The hot paths (claim, heartbeat, settle, relay) are SQL in
``workflows/engine/sql.py``; these models serve migrations, the admin and the API.
"""

from __future__ import annotations

from django.contrib.postgres.indexes import GinIndex, OpClass
from django.db import models
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Now

from ..states import RunStatus, StepStatus, WaitKind


class SearchText(models.Func):
    """A run's start key, a space and its input as JSON text: what a search of the runs
    reads (``Searched``), and what the trigram index ``run_search`` holds, so the search is
    an index scan at a million runs. One expression for both: the planner uses an
    expression index only for the very same expression."""

    template = "(%(expressions)s)"
    arg_joiner = " || ' ' || "
    output_field = models.TextField()

    def __init__(self) -> None:
        super().__init__(models.F("start_key"), Cast("input", output_field=models.TextField()))


class Searched(models.Func):
    """True for a run whose ``SearchText`` holds ``pattern`` (an ILIKE pattern; pg_trgm's
    GIN index answers ILIKE with three characters or more)."""

    template = "(%(expressions)s)"
    arg_joiner = " ILIKE "
    output_field = models.BooleanField()

    def __init__(self, pattern: str) -> None:
        super().__init__(SearchText(), models.Value(pattern, output_field=models.TextField()))


class Run(models.Model):
    # No index of their own for org (every index below leads with it) or version (versions
    # are never deleted): each index is written on every start and every run update that
    # cannot be HOT, so one that no query needs is pure cost.
    org = models.ForeignKey("workflows.Organisation", on_delete=models.PROTECT, db_index=False)
    automation = models.ForeignKey("workflows.Automation", on_delete=models.PROTECT)
    version = models.ForeignKey(
        "workflows.AutomationVersion", on_delete=models.PROTECT, db_index=False
    )
    start_key = models.CharField(max_length=255)
    start_key_derived = models.BooleanField(default=False)
    input = models.JSONField(default=dict)
    input_digest = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING)
    # What `set` steps wrote, and each finished step's output by step id: the template context.
    vars = models.JSONField(default=dict)
    outputs = models.JSONField(default=dict)
    # Last iteration entered per step id: a loop entering a step again takes the next one.
    entered = models.JSONField(default=dict)
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    steps_executed = models.PositiveIntegerField(default=0)
    max_steps = models.PositiveIntegerField()
    deadline_at = models.DateTimeField()
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    # The W3C traceparent of the span that started the run, written only while tracing is on
    # (engine/tracing.py): each step attempt's span is its child, in whichever process it
    # runs, so a run's spans form one trace. NULL: the run was started untraced.
    trace_context = models.TextField(null=True, blank=True, editable=False)
    # Written by an operator's re-run from a step (services/rerun.py), NULL before any.
    # rerun_reuse: the settled effects the re-run's walk takes instead of calling again, by
    # step id and the new iteration that takes each ({"email": {"2": "<run>/email/1"}}): the
    # effect ledger reads it when a step's effect key has no row yet; a code run's steps
    # called in ctx.parallel branches are listed by place too (under "~places",
    # services/rerun.py). rerun_floor: the id of
    # the run's last step row when it was re-run; rows up to it belong to walks before it (a
    # later retry runs again only what failed since).
    rerun_reuse = models.JSONField(null=True, blank=True, editable=False)
    rerun_floor = models.BigIntegerField(null=True, blank=True, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "start_key"], name="run_start_key_per_org"),
        ]
        # What the run list filters by and orders by (newest id first), per organisation.
        indexes = [
            models.Index(fields=["org", "-id"], name="run_org_id"),
            models.Index(fields=["org", "status", "-id"], name="run_org_status_id"),
            models.Index(fields=["org", "automation", "-id"], name="run_org_automation_id"),
            # The control room's runs by status in the last hour and day: each (organisation,
            # status) a range by time, counted up to a cap (workflows/engine/sql/control_room.py).
            models.Index(fields=["org", "status", "created_at"], name="run_org_status_created"),
            # Search inside the input (a customer's name, an order id) and the start key:
            # trigrams of SearchText, with the organisation (btree_gin) so one index serves
            # a search scoped to it (migration 0022 builds it concurrently).
            GinIndex(
                "org",
                OpClass(SearchText(), name="gin_trgm_ops"),
                name="run_search",
            ),
            # Retention: the oldest finished runs first.
            models.Index(
                fields=["finished_at"],
                name="run_finished",
                condition=models.Q(finished_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.pk}"


# The organisation of a step, an event or an outbox row is its run's, copied by the engine;
# the database checks the run reference, not the organisation one: that check share-locks
# the organisation's row for every row written (about 36 per run), so all of an
# organisation's concurrent transactions meet on one row (MultiXacts). Deleting an
# organisation is still refused while it has any (PROTECT is enforced by Django).
class Step(models.Model):
    # No single-column indexes: (run, step_id, iteration) leads with the run, and every hot
    # query reaches steps through the run or the lane indexes below.
    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.PROTECT, db_index=False, db_constraint=False
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    step_id = models.CharField(max_length=63)
    iteration = models.PositiveIntegerField(default=1)
    # Inside a `parallel` with a join: the join's waiting row this step's branch arrives at,
    # and which branch (0, 1, ...) it is on. A loop's second pass forks anew (another join
    # row), so a join waits for exactly the branches of its own pass.
    fork_join = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    branch = models.PositiveSmallIntegerField(null=True, blank=True)
    type = models.CharField(max_length=40)
    lane = models.CharField(max_length=16)
    status = models.CharField(max_length=16, choices=StepStatus.choices)
    # Fencing token: incremented by every claim; only the newest attempt may write.
    attempt = models.PositiveIntegerField(default=0)
    # Claims handed back (a shutdown, a deferral, a database outage): they do not count
    # against max_attempts.
    release_count = models.PositiveIntegerField(default=0)
    # Claims before an operator's retry started a new series of attempts (not counted either).
    series_offset = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField()
    owner = models.CharField(max_length=100, null=True, blank=True)
    # Nobody may claim the step before this instant: the lease of a running step, the
    # backoff of a step waiting to retry, the entry time of a fresh ready step.
    lease_until = models.DateTimeField(null=True, blank=True)
    # A waiting step: what it waits for, when time wakes it (a retry's backoff, a deadline),
    # and what that wake means (`wait_detail.on_deadline`: the outcome it then takes; without
    # one it becomes ready). A continuation row keeps the step ids still to enter here.
    wait_kind = models.CharField(max_length=16, choices=WaitKind.choices, blank=True, default="")
    wake_at = models.DateTimeField(null=True, blank=True)
    wait_detail = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "step_id", "iteration"], name="step_run_id_iteration"
            ),
        ]
        indexes = [
            # The claim: per lane, per organisation, oldest first, ready steps only. Work that
            # is not yet due waits (status waiting) outside this index, so a backlog of it
            # costs the claim nothing.
            models.Index(
                fields=["lane", "org", "lease_until"],
                name="step_claimable",
                condition=models.Q(status="ready"),
            ),
            # Leases, by when they lapse: the suspects' claim reads the lapsed end of it.
            models.Index(
                fields=["lane", "lease_until"],
                name="step_leases",
                condition=models.Q(status="running"),
            ),
            # Steps waiting for a signal, by what they wait for: a signal that arrives looks
            # here (wait_detail written by wait_signal: {"signal": name, "correlation": key}).
            models.Index(
                KeyTextTransform("signal", "wait_detail"),
                KeyTextTransform("correlation", "wait_detail"),
                name="step_awaits_signal",
                condition=models.Q(status="waiting", wait_kind="external"),
            ),
            # Waiting steps that time wakes, by when: the sweep and the retry promotion read
            # only the due end of it.
            models.Index(
                fields=["wake_at"],
                name="step_wake_due",
                condition=models.Q(status="waiting", wake_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.step_id}#{self.iteration}"

    @property
    def attempts_counted(self) -> int:
        """The claims that count against ``max_attempts`` (sql's ``attempts_used``): the
        fencing token less the claims handed back (a shutdown, a deferral, a database
        outage) and those before an operator's retry began the current series."""
        return max(0, self.attempt - self.release_count - self.series_offset)

    @property
    def tries(self) -> str:
        """The attempts as the run page and ``runs show`` give them: counted of allowed, and
        the claims handed back, which did not count."""
        handed_back = f" (+{self.release_count} handed back)" if self.release_count else ""
        return f"{self.attempts_counted}/{self.max_attempts}{handed_back}"


class RunEvent(models.Model):
    """One transition of a run, append-only. Ordered by id within a run."""

    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.PROTECT, db_index=False, db_constraint=False
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    kind = models.CharField(max_length=40)
    step_id = models.CharField(max_length=63, blank=True, default="")
    iteration = models.PositiveIntegerField(null=True, blank=True)
    attempt = models.PositiveIntegerField(null=True, blank=True)
    worker = models.CharField(max_length=100, blank=True, default="")
    detail = models.JSONField(null=True, blank=True)
    at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["run", "id"], name="event_run_order")]

    def __str__(self) -> str:
        return f"{self.kind} {self.step_id}"


class Outbox(models.Model):
    """Intent to wake someone, written in the transaction that created the work.

    The relay publishes unsent rows (message id = outbox id) and marks them sent; consumers
    treat every message as possibly duplicated, since a relay can die between the two.
    """

    # Read by id only (the relay's batch, the cleanup by sent_at): no index on org.
    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.PROTECT, db_index=False, db_constraint=False
    )
    topic = models.CharField(max_length=63)
    payload = models.JSONField()
    created_at = models.DateTimeField(db_default=Now())
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["id"], name="outbox_unsent", condition=models.Q(sent_at=None)),
            models.Index(fields=["sent_at"], name="outbox_sent", condition=~models.Q(sent_at=None)),
        ]

    def __str__(self) -> str:
        return f"outbox {self.pk} {self.topic}"


class IdleWorker(models.Model):
    """A lane worker waiting for work, so a transaction that makes work for its lane wakes it
    at once instead of leaving that to the relay's next batch (up to a poll interval later).

    Only idle workers are listed, so a busy engine's writes notify nobody: a NOTIFY takes a
    global lock at commit, harmless when the engine is idle, a bottleneck when it is not.
    The table is UNLOGGED (migration 0010): a hint lost in a database crash costs nothing.
    A row past ``idle_until`` is stale (its worker died) and is ignored.
    """

    worker = models.CharField(max_length=200, primary_key=True)
    lane = models.CharField(max_length=32)
    idle_until = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.worker} idle on {self.lane}"


class RunWaiter(models.Model):
    """A caller waiting for a run to end (services/run_waits.py, ``run_wait``): the
    transaction that ends the run notifies it (trigger ``run_ended_notify``, migration 0033)
    only while such a row names the run, so runs nobody waits for take no notification lock
    at commit (see IdleWorker). UNLOGGED, as IdleWorker: a hint lost in a database crash
    costs a waiter one look at the run later. Several callers may wait on one run: each is
    told by its own row's id, and takes its row away by it when its wait times out.
    """

    run_id = models.BigIntegerField()
    since = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run_id"], name="run_waiter_run")]

    def __str__(self) -> str:
        return f"a caller waits for run {self.run_id} since {self.since}"


class SweepLease(models.Model):
    """Who leads the sweep (workflows.engine.sweeper): whoever holds this row's lease, renewed
    every third of a tick. A dead holder's lease lapses and another sweeper takes it."""

    name = models.CharField(max_length=32, primary_key=True)
    holder = models.CharField(max_length=200)
    lease_until = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder} until {self.lease_until}"
