"""The invariants a chaos run must keep (tests/chaos.py;
docs/explanation/how-the-guarantees-are-tested.md, "Chaos runs"), read from the database, the stub
providers and the processes' logs once the engine drained."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from approvals.models import ApprovalRequest
from effects.models import Effect
from workflows.models import Run, RunEvent, Signal, Step

from .chaos import FINAL, Load, Pool, parked_reason
from .engine_harness import Harness
from .generated_automations import EFFECTS, Automation, RunInput, model_marker

# --- the invariants ---------------------------------------------------------------------------

SETTLES = ("step.succeeded", "step.failed")
WAKES = ("step.signal", "step.approval", "step.timer_fired", "step.deadline_passed")


@dataclass(frozen=True)
class AtStubs:
    """What reached the stub providers, read once when the engine has drained: checking
    each run against a fresh read would cost every run a parse of every message sent."""

    keys: Counter[str]  # effect key: how often it reached a stub (Harness.keys_at_stubs)
    created: Counter[str]  # effect key: items the idempotent provider stub created

    @classmethod
    def read(cls, harness: Harness) -> AtStubs:
        return cls(keys=harness.keys_at_stubs(), created=created_at_stub(harness))


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    runs: Counter[str] = field(default_factory=Counter)  # kind/status: how many
    parked: Counter[str] = field(default_factory=Counter)  # provider: runs parked for review
    parked_why: list[str] = field(default_factory=list)  # run: the reasons, as the effects say
    steps: int = 0
    effects: int = 0  # effects made (settled), all providers
    model_repeats: int = 0  # model calls beyond one per entry (no key: repeated by design)
    outcome_unknown_seen: int = 0  # effects that went outcome_unknown (then reconciled)
    timers_fired: int = 0
    signals_consumed: int = 0
    decisions: int = 0

    def fail(self, what: str) -> None:
        self.violations.append(what)


def check(load: Load, pool: Pool, *, minutes: float, floor: float) -> Report:
    report = Report()
    harness = load.harness
    at_stubs = AtStubs.read(harness)
    for run_id, started in load.runs.items():
        run = Run.objects.get(pk=run_id)
        reason = "" if run.status in FINAL else parked_reason(run_id)
        report.runs[f"{started.kind}/{run.status if not reason else 'parked'}"] += 1
        if reason:
            report.parked_why.append(f"run {run_id} ({started.kind}): {reason[:300]}")
            for effect in Effect.objects.filter(run_id=run_id, state="needs_review"):
                report.parked[effect.provider] += 1
            continue
        if started.kind == "generated":
            assert started.automation is not None
            _check_generated(report, harness, at_stubs, run, started.automation, started.given)
        elif started.kind == "signal_first":
            _check_signal_first(report, run)
        else:
            _check_saga(report, at_stubs, run)
    _check_events(report, list(load.runs))
    _check_effects(report, at_stubs, list(load.runs))
    _check_signals(report, harness)
    succeeded = Run.objects.filter(pk__in=list(load.runs), status__in=("succeeded", "compensated"))
    rate = succeeded.count() / max(minutes, 1e-9)
    if rate < floor:
        report.fail(f"progress: {rate:.1f} runs finished well per minute, below the floor {floor}")
    for line in pool.log_alarms():
        report.fail(f"the engine logged an alarm: {line}")
    report.violations += pool.tally.unexpected_exits
    return report


def _check_generated(report: Report, harness: Harness, at_stubs: AtStubs, run: Run,
                     automation: Automation, given: RunInput) -> None:  # fmt: skip
    where = f"run {run.pk} (generated, {given.flags})"
    if run.status != "succeeded":
        report.fail(f"{where}: {run.status} {run.error[:500]}")
        return
    rows = Step.objects.filter(run=run).exclude(step_id="~continue")
    entered = Counter(rows.values_list("step_id", flat=True))
    report.steps += entered.total()
    if entered != automation.visits(given):
        report.fail(f"{where}: entered {dict(entered)}, predicted {dict(automation.visits(given))}")
    made = at_stubs.keys
    for step in automation.steps_of(*EFFECTS):
        for iteration in range(1, entered[step["id"]] + 1):
            key = f"{run.pk}/{step['id']}/{iteration}"
            if step["type"] == "model":
                continue  # counted below, by prompt
            if step["type"] == "crm_upsert":
                continue  # an upsert: repeating it is harmless, and it carries no key
            if step["type"] == "http":  # called again under its key after a lost answer
                if at_stubs.created[key] != 1:
                    report.fail(f"{where}: effect {key} created "
                                f"{at_stubs.created[key]} times")  # fmt: skip
                continue
            if made[key] != 1:
                report.fail(f"{where}: effect {key} ({step['type']}) reached its stub "
                            f"{made[key]} times")  # fmt: skip
        if step["type"] == "model":
            seen = harness.model_hits(model_marker(str(run.pk), step["id"]))
            if seen < entered[step["id"]]:
                report.fail(f"{where}: model {step['id']} called {seen}x, entered "
                            f"{entered[step['id']]}x")  # fmt: skip
            report.model_repeats += seen - entered[step["id"]]


def _check_signal_first(report: Report, run: Run) -> None:
    where = f"run {run.pk} (signal sent first)"
    path = list(Step.objects.filter(run=run).order_by("id").values_list("step_id", "status"))
    report.steps += len(path)
    if run.status != "succeeded" or path != [("call", "done"), ("wait", "done"), ("done", "done")]:
        report.fail(f"{where}: {run.status} {run.error[:300]} path {path}")


def _check_saga(report: Report, at_stubs: AtStubs, run: Run) -> None:
    where = f"run {run.pk} (saga)"
    report.steps += Step.objects.filter(run=run).count()
    if run.status != "compensated":
        report.fail(f"{where}: {run.status}, not compensated: {run.error[:300]}")
        return
    made = {k: n for k, n in at_stubs.created.items() if k.startswith(f"{run.pk}/")}
    expected = {f"{run.pk}/{s}/1": 1 for s in ("reserve", "charge", "release", "refund")}
    if made != expected:
        report.fail(f"{where}: items created at the stub {made}, expected {expected}")


def _check_events(report: Report, run_ids: list[int]) -> None:
    """No step execution settled twice, none woken twice (a timer fired twice, a signal or a
    decision applied twice)."""
    events = RunEvent.objects.filter(run_id__in=run_ids, kind__in=(*SETTLES, *WAKES))
    settles: Counter[tuple[int, str, int | None]] = Counter()
    # A wake ends one park, and a step may park again after it (an approval escalating at its
    # deadline runs again and parks with a new one): woken once per attempt.
    wakes: Counter[tuple[int, str, int | None, int | None]] = Counter()
    rows = events.values_list("kind", "run_id", "step_id", "iteration", "attempt")
    for kind, run_id, step_id, iteration, attempt in rows:
        if kind in SETTLES:
            settles[(run_id, step_id, iteration)] += 1
        else:
            wakes[(run_id, step_id, iteration, attempt)] += 1
        report.timers_fired += kind == "step.timer_fired"
        report.decisions += kind == "step.approval"
    for key, n in settles.items():
        if n > 1:
            report.fail(f"step {key} settled {n} times")
    for woken, n in wakes.items():
        if n > 1:
            same = events.filter(run_id=woken[0], step_id=woken[1], iteration=woken[2],
                                 attempt=woken[3])  # fmt: skip
            kinds = list(same.values_list("kind", flat=True))
            report.fail(f"step {woken} woken {n} times in one attempt: {kinds}")


def _check_effects(report: Report, at_stubs: AtStubs, run_ids: list[int]) -> None:
    """Every outcome_unknown reconciled or parked; nothing created twice at the idempotent
    stub."""
    effects = Effect.objects.filter(run_id__in=run_ids)
    for effect in effects.filter(state__in=("in_flight", "outcome_unknown")):
        report.fail(f"effect {effect.key} left {effect.state}: {effect.error[:300]}")
    report.effects = effects.filter(state="settled").count()
    report.outcome_unknown_seen = RunEvent.objects.filter(
        run_id__in=run_ids, kind="effect.outcome_unknown"
    ).count()
    for key, n in at_stubs.created.items():
        if n > 1:
            report.fail(f"the idempotent stub created {n} items for the effect {key}")


def created_at_stub(harness: Harness) -> Counter[str]:
    """Items the idempotent provider stub created, per effect key (what it is sent is the
    key and a suffix, effects/ledger.py's external_key: the same for every call of one
    effect, so a second item for one effect is a second effect)."""
    keys = (item["key"] for item in harness.stubs.provider.created if item["key"])
    return Counter(key.rpartition(":")[0] or key for key in keys)


def _check_signals(report: Report, harness: Harness) -> None:
    """Every signal sent was consumed, once, by one wait, which received it."""
    takers: Counter[str] = Counter()
    for sig in Signal.objects.filter(org=harness.org):
        if sig.consumed_at is None or not sig.consumed_by:
            report.fail(f"signal {sig.identity} ({sig.name}) never consumed")
            continue
        takers[sig.consumed_by] += 1
        run_id, step_id, iteration = sig.consumed_by.split("/")
        step = Step.objects.filter(run_id=int(run_id), step_id=step_id,
                                   iteration=int(iteration)).first()  # fmt: skip
        if step is None or step.status != "done":
            report.fail(f"signal {sig.identity} consumed by {sig.consumed_by}, which is "
                        f"{step.status if step else 'missing'}")  # fmt: skip
    report.signals_consumed = takers.total()
    for taker, n in takers.items():
        if n > 1:
            report.fail(f"the wait {taker} consumed {n} signals")
    for request in ApprovalRequest.objects.filter(org=harness.org, status="pending"):
        report.fail(f"approval {request.pk} ({request.run_id}/{request.step_id}) still pending")
