"""Re-run a finished run from a chosen step, optionally with edited input or vars.

For the operator fixing one bad record: the run that failed on it (or ended in any way) runs
again from the step they choose, with the input or vars they corrected, keeping its
history. One transaction, like the rest of run control (control.py): the run is locked, its
status checked against the declared transitions (only a finished run: failed, succeeded,
cancelled or compensated), its input and vars replaced when given (the change recorded in
its history, key by key), its outcome cleared and its budgets counted afresh, and the chosen
step entered anew at the top level (a new iteration, so a new effect key), with the lanes
woken. Refused, nothing changes.

Outside effects the run already made are not made again unless the operator says so: each
step the new walk can reach takes, for its k-th new entry, the answer of its k-th settled
effect (the run's ``rerun_reuse``, read by the app that keeps the effects), recorded as
``effect.reused`` in the history; an effect a compensation undid is made again.
``repeat_effects`` makes every one a new call under its new key. ``dry_run`` (the default)
only says what a re-run would do: the step, the input and vars that change, and each
settled effect downstream, reused or repeated, with its new key.

A code run (its steps decided as it goes: engine/decided.py, workflows/code) re-runs from a
step it entered, chosen by id and iteration (the first by default): its history keeps the
steps before that one, its rows kept, the steps from it on set aside (``Replays.restart``:
its next replay reads the kept steps only), and its decider is entered anew, which replays
the code up to the chosen step, meets it as new work and goes on. The settled effects of the
steps set aside are reused or repeated as a definition's are, by step and new entry.

A re-run is a start for the organisation's limits, and refused where a start of its version
would be (``check_start_guards``: a code workflow whose ``organisations`` no longer name the
run's, ``workflow_not_allowed``): it is admitted under the start quotas
(running runs, starts per minute: ``quotas.admit_start``, in its transaction, as a start is;
refused, 429 ``quota_exceeded`` and nothing changes), and its budgets (max steps) and max
age are counted afresh from the re-run. A preview admits nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from psycopg.types.json import Jsonb

from ..definitions.reach import enclosing_fork, reached, successors
from ..definitions.registry import registry
from ..engine import sql
from ..engine.compensation import undone_by_plans
from ..engine.decided import join_id
from ..engine.definition_cache import definition_for
from ..engine.forks import branch_paths
from ..engine.settled import SettledEffect, settled_effects
from ..engine.sql.rows import event_row, fetch_dicts, insert_events
from ..engine.walk import RunState, Walk, lock_run
from ..errors import (
    InvalidInput,
    RerunStepIsCompensation,
    RerunStepNotTopLevel,
    RunStateConflict,
    StartQuota,
    UnknownRun,
    UnknownStep,
)
from ..models import AutomationVersion, Organisation
from ..states import RUN_FINISHED, RunStatus, run_sources
from . import quotas
from .audit import Actor, as_actor, record_audit
from .replays import Replays, replay_keeping, replays_of
from .runs import check_input, check_json_value, check_start_guards, run_limits

# A finished run may run again: the declared sources of `running` that are finished states.
RERUN_SOURCES = [s for s in run_sources(RunStatus.RUNNING) if s in RUN_FINISHED]
REUSE, REPEAT = "reuse", "repeat"
# In a run's ``rerun_reuse``, beside the step ids (no step id begins with "~"): the settled
# effects of the steps entered inside branches, by place (_Plan.reuse).
PLACES = "~places"


@dataclass(frozen=True)
class EffectChoice:
    """A settled effect of a step the re-run can reach, and what its new walk does with it:
    ``reuse`` (the step's new entry takes its answer, no call) or ``repeat`` (a new call),
    and the key of the entry concerned (the step's k-th new entry for its k-th effect).

    A step whose effects were made in a code run's ``ctx.parallel`` branches is reused by
    place (``reuse``): its k-th new entry on a branch takes the k-th effect made on that
    branch, and its key is the iteration it gets when its branch enters it, which the order
    the branches go in decides; so ``new_key`` is None and ``entry`` says which one it is."""

    step_id: str
    iteration: int
    key: str
    provider: str
    action: str
    new_key: str | None
    why: str
    # Where the effect was made (forks.branch_paths; "" at the top level).
    place: str = ""
    entry: int = 0  # the step's new entry concerned, counted at ``place``

    @property
    def new_entry(self) -> str:
        """The step's new entry concerned, in words: its key, or its rank on its branch."""
        if self.new_key is not None:
            return self.new_key
        where = f"on branch {self.place}" if self.place else "at the top level"
        return f"{self.step_id}'s new entry {self.entry} {where}"


@dataclass(frozen=True)
class CodeCut:
    """Where a code run's re-run cuts its history: the chosen step's iteration, how many
    steps before it the replay keeps, and the steps from it on that it sets aside."""

    decider: str
    replays: Replays
    iteration: int
    kept: int
    history: list[tuple[str, int]]  # what the run's replay read before the re-run

    @property
    def set_aside(self) -> list[tuple[str, int]]:
        return self.history[self.kept :]


@dataclass(frozen=True)
class RerunOutcome:
    run_id: int
    from_step: str
    was: str  # the run's status before
    status: str  # after (a dry run: unchanged)
    dry_run: bool
    repeat_effects: bool
    input_changes: list[dict[str, Any]] = field(default_factory=list)
    vars_changes: list[dict[str, Any]] = field(default_factory=list)
    effects: list[EffectChoice] = field(default_factory=list)
    iteration: int | None = None  # a code run's: the iteration of the step it re-runs from

    @property
    def reused(self) -> list[EffectChoice]:
        return [e for e in self.effects if e.action == REUSE]


def rerun(
    *,
    org: Organisation,
    run_id: int,
    from_step: str,
    actor: Actor | str,
    run_input: Any = None,
    variables: Any = None,
    repeat_effects: bool = False,
    dry_run: bool = True,
    iteration: int | None = None,
) -> RerunOutcome:
    """Re-run run ``run_id`` of ``org`` from ``from_step`` as ``actor``; ``run_input`` and
    ``variables`` (JSON objects) replace the run's input and vars when given; ``iteration``
    chooses which entry of a code run's step (the first by default). A dry run (the
    default) changes nothing and says what the re-run would do. Raises UnknownRun,
    RunStateConflict (a run not finished; recorded in its history when not a dry run),
    UnknownStep, RerunStepNotTopLevel, RerunStepIsCompensation, InvalidInput (and
    PayloadTooLarge), WorkflowNotAllowed or a StartQuota (RunningRunsQuota,
    StartsPerMinuteQuota; not for a dry run): each before anything changed."""
    if run_input is not None:
        check_input(run_input)
    if variables is not None:
        if not isinstance(variables, dict):
            raise InvalidInput(reason="vars must be a JSON object")
        check_json_value(variables, "vars", "The run's vars")
    who = as_actor(actor)
    try:
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql.RUN_OF_ORG, {"id": run_id, "org": org.pk})
            if cursor.fetchone() is None:
                raise UnknownRun(run_id=run_id)
            run = lock_run(cursor, run_id)
            if run.status not in RERUN_SOURCES:
                raise _conflict(run.status)
            definition = definition_for(run.version_id)
            # Makes new work as a start does: refused where a start of it would be (a code
            # workflow whose organisations no longer name this one: workflow_not_allowed).
            check_start_guards(org, definition, run.input if run_input is None else run_input)
            cut = _checked_start(definition, run, from_step, iteration)
            plan = _Plan(run, definition, from_step, run_input, variables, repeat_effects, cut)
            plan.effects = _effect_choices(cursor, plan)
            if dry_run:
                return plan.outcome(status=run.status, dry_run=True)
            # A re-run is a start: admitted as one (running runs, starts per minute), in
            # this transaction, so a refusal leaves the run as it was.
            quotas.admit_start(org)
            status = _apply(cursor, plan, who.label)
            record_audit(
                org=org, actor=who, action="run.rerun", target_type="run", target_id=run_id,
                detail={"from_step": from_step, "was": plan.was,
                        "repeat_effects": repeat_effects, "edited": plan.edited(),
                        "effects_reused": sum(e.action == REUSE for e in plan.effects)},
            )  # fmt: skip
            return plan.outcome(status=status, dry_run=False)
    except RunStateConflict as refused:
        if not dry_run:
            _record_refusal(org.pk, run_id, who.label, refused)
        raise
    except StartQuota as refused:
        quotas.remember_count(org, refused)
        raise


@dataclass
class _Plan:
    """One re-run as decided under the run's lock."""

    run: RunState
    definition: dict[str, Any]
    from_step: str
    new_input: Any
    new_vars: Any
    repeat_effects: bool
    cut: CodeCut | None = None  # a code run's
    effects: list[EffectChoice] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.was = self.run.status
        self.input_changes = _changes(self.run.input, self.new_input)
        self.vars_changes = _changes(self.run.vars, self.new_vars)

    def edited(self) -> dict[str, list[str]]:
        """The top-level keys that change, of the input and of the vars."""
        edited = {"input": [c["key"] for c in self.input_changes],
                  "vars": [c["key"] for c in self.vars_changes]}  # fmt: skip
        return {part: keys for part, keys in edited.items() if keys}

    def reuse(self) -> dict[str, Any] | None:
        """The run's ``rerun_reuse``: per step, the new iteration -> the old effect's key.

        A step whose settled effects were made inside a parallel's branches is also listed
        under ``PLACES``: its effects in order, each with its place and its key (None: made
        again). A code run's branches may call the same step id, and which branch enters
        its new entries first is not the order they did before, so the k-th new entry
        overall may be another branch's; and a branch's new entry that a failure cancelled
        is entered again by a retry under another iteration: the effects ledger gives the
        k-th new entry at a place the k-th effect made at that place instead, an entry
        cancelled and entered again counted once (effects/reruns.py)."""
        reuse: dict[str, Any] = {}
        places: dict[str, list[list[str | None]]] = {}
        for choice in self.effects:
            if choice.new_key is None:  # by place
                key = choice.key if choice.action == REUSE else None
                places.setdefault(choice.step_id, []).append([choice.place, key])
            elif choice.action == REUSE:
                iteration = choice.new_key.rsplit("/", 1)[1]
                reuse.setdefault(choice.step_id, {})[iteration] = choice.key
        if not any(key for listed in places.values() for _, key in listed):
            places = {}  # every one made again: nothing to take
        if places:
            reuse[PLACES] = places
        return reuse or None

    def outcome(self, *, status: str, dry_run: bool) -> RerunOutcome:
        return RerunOutcome(
            run_id=self.run.id, from_step=self.from_step, was=self.was, status=status,
            dry_run=dry_run, repeat_effects=self.repeat_effects,
            input_changes=self.input_changes, vars_changes=self.vars_changes,
            effects=self.effects, iteration=None if self.cut is None else self.cut.iteration,
        )  # fmt: skip


def _checked_start(
    definition: dict[str, Any], run: RunState, step_id: str, iteration: int | None
) -> CodeCut | None:
    """The step the re-run starts from, checked: a definition's (``_check_step``), or a
    step a code run's history has (its cut)."""
    decided = replays_of(definition)
    if decided is None:
        if iteration is not None:
            raise InvalidInput(reason="iteration chooses among a code run's steps only")
        _check_step(definition, step_id, run.version_id)
        return None
    if iteration is not None and (
        isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 1
    ):
        raise InvalidInput(reason="iteration must be an integer from 1")
    decider, replays = decided
    history = replays.history(run)
    entries = [n for n, (sid, it) in enumerate(history)
               if sid == step_id and (iteration is None or it == iteration)]  # fmt: skip
    with connection.cursor() as cursor:
        if not entries:
            _refuse_a_branch_step(cursor, run.id, step_id)
        else:
            _refuse_a_compensation(cursor, run.id, step_id, history[entries[0]][1])
    making = run.entered.get(step_id, 0) + 1  # the iteration a call with no row makes
    if (
        not entries
        and iteration in (None, making)
        and (replays.next_call(run, definition) == step_id)
    ):
        # The call the run was making when it ended (cancelled while a ctx.run function
        # waited between attempts): no row of its own, so nothing to set aside; the replay
        # keeps every step and makes the call anew.
        return CodeCut(str(decider["id"]), replays, making, len(history), history)
    if not entries:
        which = step_id if iteration is None else f"{step_id} (iteration {iteration})"
        detail = (f"The run's history has no step {which!r} to re-run from: a code run "
                  "re-runs from a step it entered.")  # fmt: skip
        parallel = next((entered for entered, _ in history if join_id(entered) == step_id), None)
        if parallel is not None:
            detail = (f"{step_id!r} is where the branches of ctx.parallel {parallel!r} meet, "
                      f"not a step the code called: re-run from {parallel!r} (its branches "
                      "run again) or from the step the code called after it.")  # fmt: skip
        raise UnknownStep(
            detail=detail,
            step=step_id,
            version=AutomationVersion.objects.values_list("number", flat=True).get(
                pk=run.version_id),
        )  # fmt: skip
    kept = entries[0]
    return CodeCut(str(decider["id"]), replays, history[kept][1], kept, history)


def _refuse_a_branch_step(cursor: Any, run_id: int, step_id: str) -> None:
    """A code run's step entered only in a ctx.parallel's branches: refused as a
    definition's branch step is, naming the top-level parallel it ran under."""
    cursor.execute(sql.TOP_JOIN_ABOVE_STEP, {"run": run_id, "step": step_id})
    row = cursor.fetchone()
    if row is not None:
        raise RerunStepNotTopLevel(step=step_id, fork=str(row[0]).removesuffix(".join"))


def _refuse_a_compensation(cursor: Any, run_id: int, step_id: str, iteration: int) -> None:
    """A code run's step entry its compensation plan entered: refused as a definition's
    compensation step is (only a plan enters one)."""
    cursor.execute(sql.COMPENSATION_ENTRY, {"run": run_id, "step": step_id, "iteration": iteration})
    row = cursor.fetchone()
    if row is not None:
        raise RerunStepIsCompensation(step=step_id, compensates=row[0])


def _check_step(definition: dict[str, Any], step_id: str, version_id: int) -> None:
    """A step of the run's version that the walk can enter at the top level."""
    steps = {step["id"]: step for step in definition["steps"]}
    if step_id not in steps:
        number = AutomationVersion.objects.values_list("number", flat=True).get(pk=version_id)
        raise UnknownStep(step=step_id, version=number)
    compensates = [sid for sid, step in steps.items() if step.get("compensate") == step_id]
    if compensates:
        raise RerunStepIsCompensation(step=step_id, compensates=compensates[0])
    fork = enclosing_fork(definition, step_id)
    if fork is not None:
        raise RerunStepNotTopLevel(step=step_id, fork=fork)


def _changes(before: Any, after: Any) -> list[dict[str, Any]]:
    """The top-level keys whose values differ (``after`` None: nothing changes), each with
    its value before and after (a side where the key is absent is left out)."""
    if after is None:
        return []
    before = before if isinstance(before, dict) else {}
    changes = []
    for key in sorted(set(before) | set(after)):
        if before.get(key, _ABSENT) == after.get(key, _ABSENT):
            continue
        change: dict[str, Any] = {"key": key}
        if key in before:
            change["before"] = before[key]
        if key in after:
            change["after"] = after[key]
        changes.append(change)
    return changes


_ABSENT = object()


def _effect_choices(cursor: Any, plan: _Plan) -> list[EffectChoice]:
    """Each settled effect of the steps the re-run can reach (compensations aside: only a
    plan enters them), in definition order, then iteration: the step's k-th new entry
    reuses its k-th effect, unless repeat_effects or a compensation undid that one."""
    run, definition = plan.run, plan.definition
    if plan.cut is None:
        compensators = {s["compensate"] for s in definition["steps"] if "compensate" in s}
        downstream = reached([plan.from_step], successors(definition)) - compensators
        order = [s["id"] for s in definition["steps"] if s["id"] in downstream]
    kept: set[tuple[str, int]] = set()
    compensations: set[str] = set()
    kept_keys: set[str] = set()  # the older answers a kept execution took (not its own)
    undone_keys: set[str] = set()  # the older answers an undone execution took
    if plan.cut is not None:
        kept = _kept_before_cut(cursor, run.id, plan.cut)
        # What its compensations undid is made again; their own effects are never a forward
        # step's to take (only a plan enters them again).
        undone, compensations = undone_by_plans(cursor, run.id)
        reused = _effects_reused(cursor, run.id)
        kept_keys = {reused[e] for e in kept if e in reused}
        undone_keys = {reused[e] for e in undone if e in reused}
    else:
        undone = _undone(cursor, run.id, definition)
    by_step: dict[str, list[SettledEffect]] = {}
    for effect in settled_effects(cursor, run.org_id, run.id):
        if ((effect.step_id, effect.iteration) in kept or effect.key in kept_keys
                or effect.step_id in compensations):  # fmt: skip
            continue
        by_step.setdefault(effect.step_id, []).append(effect)
    if plan.cut is not None:  # a code run: the steps set aside, whatever the code does next
        # (its top level's, then a branch's of a ctx.parallel from the cut on)
        order = list(dict.fromkeys([*(step_id for step_id, _ in plan.cut.set_aside), *by_step]))
    place_of = _places_of_effects(cursor, run.id, by_step)
    choices = []
    for step_id in order:
        effects = by_step.get(step_id, [])
        places = [place_of.get((step_id, effect.iteration), "") for effect in effects]
        branched = any(places)  # reused by place (EffectChoice)
        for k, (effect, place) in enumerate(zip(effects, places, strict=True), start=1):
            entry = places[:k].count(place)
            new_key = None if branched else f"{run.id}/{step_id}/{run.entered.get(step_id, 0) + k}"
            if plan.repeat_effects:
                action, why = REPEAT, "repeat_effects: a new call under the new key"
            elif (step_id, effect.iteration) in undone or effect.key in undone_keys:
                action, why = REPEAT, "a compensation undid it: made again under the new key"
            else:
                action, why = REUSE, "settled: its answer is taken, nothing is called"
            choices.append(EffectChoice(step_id, effect.iteration, effect.key, effect.provider,
                                        action, new_key, why, place, entry))  # fmt: skip
    return choices


def _places_of_effects(
    cursor: Any, run_id: int, by_step: dict[str, list[SettledEffect]]
) -> dict[tuple[str, int], str]:
    """Where each settled effect was made: its step row's place, named by its branch path
    ("" at the top level); nothing when all were made at the top level."""
    if not by_step:
        return {}
    cursor.execute(sql.STEP_PLACES, {"run": run_id, "ids": sorted(by_step)})
    rows = fetch_dicts(cursor)
    if all(row["fork_join_id"] is None for row in rows):
        return {}
    path = branch_paths(cursor, run_id)
    return {(row["step_id"], row["iteration"]): path(row["fork_join_id"], row["branch"])
            for row in rows}  # fmt: skip


def _kept_before_cut(cursor: Any, run_id: int, cut: CodeCut) -> set[tuple[str, int]]:
    """A code run's executions that keep their effects: the steps entered before the chosen
    entry (a ctx.parallel's branches that met before it included), which the new walk does
    not enter again. Not the top level's rows an earlier re-run set aside: the replay no
    longer reads them, so the new walk enters their steps anew and may take their answers,
    as a definition's re-run takes the answers of every entry of a step it reaches. A
    re-run from a call with no row (the one the run was making) keeps every row."""
    chosen, iteration = cut.set_aside[0] if cut.set_aside else ("", 0)
    cursor.execute(sql.STEPS_ENTERED_BEFORE, {"run": run_id, "step": chosen,
                                              "iteration": iteration})  # fmt: skip
    read = set(cut.history[: cut.kept])
    kept: set[tuple[str, int]] = set()
    kept_joins: set[int] = set()  # the joins of the ctx.parallels kept: their branches are
    for row in fetch_dicts(cursor):  # (in the order entered: a fork before its branches)
        execution = (row["step_id"], row["iteration"])
        place = row["fork_join_id"]
        if execution in read if place is None else place in kept_joins:
            kept.add(execution)
            joined = _join_row_of(row)
            if joined is not None:
                kept_joins.add(joined)
    return kept


def _join_row_of(row: dict[str, Any]) -> int | None:
    """The join row of a fork's row (its output names it), else None."""
    if not registry.forking(str(row["type"])) or row["join_row"] is None:
        return None
    joined = json.loads(row["join_row"])
    return joined if isinstance(joined, int) else None


def _effects_reused(cursor: Any, run_id: int) -> dict[tuple[str, int], str]:
    """The executions of a code run that took an older effect's answer (an earlier re-run's
    new entries), and its key: kept, such an execution keeps that answer; undone, that
    answer was undone."""
    cursor.execute(sql.EFFECTS_REUSED, {"run": run_id})
    return {(row["step_id"], row["iteration"]): row["reused"] for row in fetch_dicts(cursor)}


def _undone(cursor: Any, run_id: int, definition: dict[str, Any]) -> set[tuple[str, int]]:
    """The (step, iteration) executions that a compensation step completing after them
    undid (the run compensated before this re-run)."""
    undoes: dict[str, set[str]] = {}
    for step in definition["steps"]:
        if "compensate" in step:
            undoes.setdefault(step["compensate"], set()).add(step["id"])
    if not undoes:
        return set()
    cursor.execute(sql.DONE_STEP_ROWS, {"run": run_id})
    done: list[tuple[str, int]] = []
    undone: set[tuple[str, int]] = set()
    for row in fetch_dicts(cursor):
        if row["step_id"] in undoes:
            undone |= {(s, i) for s, i in done if s in undoes[row["step_id"]]}
        done.append((row["step_id"], row["iteration"]))
    return undone


def _apply(cursor: Any, plan: _Plan, actor: str) -> str:
    """The re-run's writes: the run's row, its history, and the walk from the chosen step.
    Returns the run's status as the walk left it (a re-run from an end step ends at once)."""
    run = plan.run
    new_input = run.input if plan.new_input is None else plan.new_input
    new_vars = run.vars if plan.new_vars is None else plan.new_vars
    _, max_age = run_limits(plan.definition)
    reuse = plan.reuse()
    cursor.execute(sql.RERUN_RUN, {
        "id": run.id, "input": Jsonb(new_input), "vars": Jsonb(new_vars), "max_age": max_age,
        "reuse": None if reuse is None else Jsonb(reuse), "sources": RERUN_SOURCES,
    })  # fmt: skip
    if cursor.fetchone() is None:
        raise _conflict(run.status)
    run.status, run.input, run.vars = RunStatus.RUNNING.value, new_input, dict(new_vars)
    run.steps_executed, run.expired = 0, False
    events = []
    if plan.input_changes or plan.vars_changes:
        detail = {"by": actor, "input": plan.input_changes, "vars": plan.vars_changes}
        events.append(event_row(run.org_id, run.id, "run.edited", worker=actor, detail=detail))
    events.append(event_row(run.org_id, run.id, "run.rerun", plan.from_step, worker=actor, detail={
        "by": actor, "from_step": plan.from_step, "was": plan.was,
        "repeat_effects": plan.repeat_effects, "edited": plan.edited(),
        **({} if plan.cut is None else {"iteration": plan.cut.iteration,
                                        "kept": plan.cut.kept}),
        "reused": [{"step": e.step_id, "key": e.key, "new_key": e.new_key,
                    **({"place": e.place, "entry": e.entry} if e.new_key is None else {})}
                   for e in plan.effects if e.action == REUSE],
        "repeated": [e.key for e in plan.effects if e.action == REPEAT],
    }))  # fmt: skip
    insert_events(cursor, events)
    walk = Walk(cursor, run, plan.definition, worker=actor)
    if plan.cut is None:
        walk.enter([plan.from_step])
    else:  # the decider replays the kept steps and meets the chosen one as new work
        replay_keeping(walk, cursor, run, plan.cut.decider, plan.cut.replays, plan.cut.kept)
    walk.flush()
    return walk.finish[0] if walk.finish is not None else RunStatus.RUNNING.value


def _conflict(status: str) -> RunStateConflict:
    return RunStateConflict(
        detail=f"The run is {status}; only a finished run ({', '.join(RERUN_SOURCES)}) can be "
        "re-run: cancel it first, or let it finish.",
        action="rerun",
        status=status,
    )


def _record_refusal(org_id: int, run_id: int, actor: str, refused: RunStateConflict) -> None:
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        detail = {"by": actor, "code": refused.code, "detail": refused.detail}
        insert_events(cursor, [event_row(org_id, run_id, "run.rerun_refused", worker=actor,
                                         detail=detail)])  # fmt: skip
