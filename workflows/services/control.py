"""Run control: cancel, pause, resume and retry, one run at a time or in bulk by filter.

Each action is one transaction that locks the run first (the engine's one lock order: the
run, then its steps), checks the run's status against the declared transitions, changes the
run and its steps with guarded UPDATEs, and records who did it as a run event. A refused
action changes nothing and is itself recorded in the run's history, with who tried.

- cancel: the run and every live step end at once. A step a worker is executing learns it
  at its next heartbeat (the step is no longer running), like a lost lease; its result is
  dropped and its late settle changes nothing. An outside call already made is not undone.
- pause: nothing of the run is claimed until it is resumed. Ready steps are parked; running
  steps finish, and whatever their settle would enter waits in a parked continuation.
- resume: what the pause parked is ready again, and the lanes are woken.
- retry: a failed run runs again from the step(s) that failed it, keeping its history; each
  such step starts a new series of attempts (its fencing token keeps growing). A run that
  failed while compensating goes on with its compensation plan where it stopped instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from ..engine import sql
from ..engine.compensation import compensation_state
from ..engine.decided import DecidedSteps, steps_of
from ..engine.definition_cache import definition_for
from ..engine.executors import StepResult
from ..engine.forks import revive_forks
from ..engine.places import Entry, Place
from ..engine.sql.rows import (
    EventRow,
    event_row,
    fetch_dict,
    fetch_dicts,
    insert_events,
    insert_wakes,
)
from ..engine.walk import RunState, Walk, lock_run, step_failed_error
from ..errors import NothingToRetry, RunStateConflict, UnknownAutomation, UnknownRun
from ..models import Automation, Organisation, Run
from ..states import RunStatus, run_sources
from .audit import Actor, as_actor, record_audit
from .replays import replay_keeping, replays_of

ACTIONS = ("cancel", "pause", "resume", "retry")
BULK_LIMIT = 1_000  # runs changed by one bulk call; the answer says when more match


@dataclass(frozen=True)
class Outcome:
    run_id: int
    action: str
    status: str  # the run's status after the action
    steps: int  # steps the action changed


@dataclass(frozen=True)
class BulkOutcome:
    action: str
    matched: int  # runs the filter matches in a status the action applies to
    changed: int
    skipped: int  # matched, but their status changed before the action reached them
    more: bool  # more runs match than one call acts on
    dry_run: bool


def run_act(*, org: Organisation, run_id: int, action: str, actor: Actor | str) -> Outcome:
    """Apply ``action`` to one run of ``org`` as ``actor`` (an ``Actor``, or its history
    label), recorded in the run's history and, in the same transaction, the audit log
    (``run.cancel``, ...). Raises UnknownRun (another organisation's run is unknown too) or
    RunStateConflict (recorded in the run's history, not audited: nothing changed)."""
    perform = _PERFORM.get(action)
    if perform is None:
        raise ValueError(f"unknown action {action!r}; one of {ACTIONS}")
    who = as_actor(actor)
    try:
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql.RUN_OF_ORG, {"id": run_id, "org": org.pk})
            if cursor.fetchone() is None:
                raise UnknownRun(run_id=run_id)
            run = lock_run(cursor, run_id)
            outcome = perform(cursor, run, who.label)
            record_audit(
                org=org, actor=who, action=f"run.{action}", target_type="run", target_id=run_id,
                detail={"status": str(outcome.status), "steps_changed": outcome.steps},
            )  # fmt: skip
            return outcome
    except RunStateConflict as refused:
        _record_refusal(org.pk, run_id, action, who.label, refused)
        raise


def runs_act_bulk(
    *,
    org: Organisation,
    action: str,
    actor: Actor | str,
    status: str | None = None,
    automation: str | None = None,
    dry_run: bool = True,
    limit: int = BULK_LIMIT,
) -> BulkOutcome:
    """Apply ``action`` to the runs the filter matches (newest first, at most ``limit``),
    each in its own transaction. ``dry_run`` (the default) only counts them. An
    ``automation`` the organisation does not have is UnknownAutomation, not a filter that
    matches nothing: a misspelt slug must not read as "no runs to act on"."""
    if action not in _PERFORM:
        raise ValueError(f"unknown action {action!r}; one of {ACTIONS}")
    if automation and not Automation.objects.filter(org=org, slug=automation).exists():
        raise UnknownAutomation(slug=automation)
    runs = Run.objects.filter(org=org, status__in=_SOURCES[action])
    if status:
        runs = runs.filter(status=status)
    if automation:
        runs = runs.filter(automation__slug=automation)
    ids = list(runs.order_by("-id").values_list("id", flat=True)[: limit + 1])
    more, ids = len(ids) > limit, ids[:limit]
    if dry_run:
        return BulkOutcome(action, len(ids), 0, 0, more, dry_run=True)
    changed = 0
    for run_id in ids:
        try:
            run_act(org=org, run_id=run_id, action=action, actor=actor)
        except RunStateConflict:
            continue
        changed += 1
    return BulkOutcome(action, len(ids), changed, len(ids) - changed, more, dry_run=False)


def run_cancel_locked(cursor: Any, run: RunState, actor: str) -> Outcome:
    """Cancel ``run``, already locked by the caller's transaction (a person's erasure
    cancels each of their runs this way): the same transition and history as ``run_act``'s
    cancel, without its own transaction or audit entry. RunStateConflict for a run that
    has ended."""
    return _cancel(cursor, run, actor)


# --- the actions (the run is locked) ---------------------------------------------------------


def _cancel(cursor: Any, run: RunState, actor: str) -> Outcome:
    _set_status(cursor, run, "cancel", error=f"cancelled by {actor}")
    cursor.execute(sql.CANCEL_LIVE_STEPS, {"run": run.id})
    steps = fetch_dicts(cursor)
    events = [
        event_row(run.org_id, run.id, "step.cancelled", s["step_id"], iteration=s["iteration"],
                  attempt=s["attempt"], worker=actor, detail={"reason": "the run was cancelled"})
        for s in steps
    ]  # fmt: skip
    events.append(_run_event(run, "run.cancelled", actor, steps_cancelled=len(steps)))
    insert_events(cursor, events)
    return Outcome(run.id, "cancel", RunStatus.CANCELLED, len(steps))


def _pause(cursor: Any, run: RunState, actor: str) -> Outcome:
    _set_status(cursor, run, "pause")
    cursor.execute(sql.PARK_READY_STEPS, {"run": run.id})
    parked = fetch_dicts(cursor)
    insert_events(cursor, [_run_event(run, "run.paused", actor, steps_parked=len(parked))])
    return Outcome(run.id, "pause", RunStatus.PAUSED, len(parked))


def _resume(cursor: Any, run: RunState, actor: str) -> Outcome:
    _set_status(cursor, run, "resume")
    cursor.execute(sql.UNPARK_STEPS, {"run": run.id})
    ready = fetch_dicts(cursor)
    insert_events(cursor, [_run_event(run, "run.resumed", actor, steps_ready=len(ready))])
    insert_wakes(cursor, [(run.org_id, run.id, lane) for lane in {s["lane"] for s in ready}])
    return Outcome(run.id, "resume", RunStatus.RUNNING, len(ready))


def _retry(cursor: Any, run: RunState, actor: str) -> Outcome:
    if run.status != RunStatus.FAILED:
        raise _conflict("retry", run.status)
    definition = definition_for(run.version_id)
    compensation = compensation_state(cursor, run.id)
    if compensation is not None:
        return _retry_compensation(cursor, run, actor, definition, compensation[1])
    # The definition's steps, or a code run's: its decider and the step it asked for last,
    # the one that failed it when a step did (engine/decided.py).
    steps = steps_of(definition, run.outputs, speculative=False)
    decided = isinstance(steps, DecidedSteps)
    cursor.execute(sql.FAILED_STEPS_BY_PLACE if decided else sql.FAILED_STEPS, {"run": run.id})
    # The steps that failed the run: failed, with no failure path of their own to follow in
    # the version the run is on. A run migrated between versions is on the new one: a step
    # that failed after the move failed there, and the new version's on_failure is the one
    # that applies; the steps that had failed before it are not listed (sql.FAILED_STEPS),
    # and a step id the run's version does not have is never entered again.
    rows = fetch_dicts(cursor)
    if isinstance(steps, DecidedSteps):
        failed = _code_run_failed(cursor, run.id, steps, rows)
        called = [row for row in failed if _called_again(row, steps)]
        if called:
            return _retry_call(cursor, run, actor, definition, steps, called[0])
    else:
        failed = [
            s for s in rows if s["step_id"] in steps and not steps[s["step_id"]].get("on_failure")
        ]  # fmt: skip
    if not failed:
        raise NothingToRetry(run_id=run.id)
    _set_status(cursor, run, "retry")
    run.status = RunStatus.RUNNING
    queued = [s for s in failed if s["lane"] != "inline"]
    cursor.execute(sql.RETRY_FAILED_STEPS, {"run": run.id, "ids": [s["id"] for s in queued]})
    retried = fetch_dicts(cursor)
    events = [
        event_row(run.org_id, run.id, "step.retried", s["step_id"], iteration=s["iteration"],
                  attempt=s["attempt"], worker=actor,
                  detail={"by": actor, "new_series_after_attempt": s["attempt"]})
        for s in retried
    ]  # fmt: skip
    events.append(_run_event(run, "run.retried", actor, steps=[s["step_id"] for s in failed]))
    insert_events(cursor, events)
    insert_wakes(cursor, [(run.org_id, run.id, lane) for lane in {s["lane"] for s in retried}])
    inline = [s for s in failed if s["lane"] == "inline"]
    forked = [s for s in failed if s["fork_join_id"] is not None]
    if inline or forked:
        walk = Walk(cursor, run, definition, worker=actor)
        # The failure ended the other branches of its parallel: they go on again, at a join
        # row that continues the cancelled one (where the retried step now is).
        places = {s["id"]: Place(s["fork_join_id"], s["branch"]) for s in failed}
        continued: dict[int, int] = {}  # a cancelled join row -> the row continuing it
        for s in forked:
            here = places[s["id"]]
            assert here.fork_join is not None
            if here.fork_join not in continued:
                revived = _revive(walk, run, definition, here)
                continued[here.fork_join] = revived.fork_join or here.fork_join
            places[s["id"]] = Place(continued[here.fork_join], here.branch)
        # A quick step has no worker to claim it: the walk enters it again, inline, in the
        # branch it failed on.
        walk.enter_entries(Entry(s["step_id"], places[s["id"]]) for s in inline)
        walk.flush()
    return Outcome(run.id, "retry", RunStatus.RUNNING, len(failed))


def _code_run_failed(
    cursor: Any, run_id: int, steps: DecidedSteps, rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The steps that failed a code run. A step a decider asked for last that failed for
    good, the code not catching it (its ``StepFailed`` failed the decider), is retried
    itself, as a definition's failed step is: once it succeeds, the code replays past it.
    When there is none (the code itself raised, or failed the run after catching the
    step's failure), the deciders whose newest turn failed are, and replay against the code
    deployed now."""
    decider_type = steps.decider["type"]
    deciders: dict[str, dict[str, Any]] = {}  # by step id: its newest turn, failed
    for row in rows:
        if row["type"] == decider_type:
            cursor.execute(sql.LATEST_ROW_OF, {"run": run_id, "step_id": row["step_id"]})
            newest = fetch_dict(cursor)
            if newest is not None and newest["id"] == row["id"]:  # else a later turn went on
                deciders[row["step_id"]] = row
    asked = [row for row in rows if row["type"] != decider_type
             and _failed_its_decider(row, steps, deciders)]  # fmt: skip
    return asked or list(deciders.values())


def _failed_its_decider(
    row: dict[str, Any], steps: DecidedSteps, deciders: Mapping[str, dict[str, Any]]
) -> bool:
    """Whether the failed step ``row`` is the one its decider asked for last and failed
    with: the decider's newest turn failed with the step's own ``StepFailed``, not caught
    (``step '<id>' failed: ...``; workflows/code). A failure the code caught, then failed the
    run after (``ctx.fail``, or another error), is the code's: retrying the step would
    send it again for a run whose code no longer needs it."""
    place = Place(row["fork_join_id"], row["branch"])
    try:
        step = steps.at(row["step_id"], place)
    except KeyError:  # not the step its decider asked for last: the code went on
        return False
    if not step.get("on_failure"):
        return False
    decider = deciders.get(str(steps.decider_at(place)["id"]))
    return decider is not None and str(decider["error"]).startswith(
        step_failed_error(row["step_id"], "")
    )


def _called_again(row: dict[str, Any], steps: DecidedSteps) -> bool:
    """A call a retry makes again from its decider's replay, its failed row set aside,
    rather than giving its row a new series of attempts: a ctx.run call (a code_result
    step) that failed for good, whose function runs in the decider's turn; or a quick step
    (lane inline), which no worker retries: entered anew, its new row is the one the replay
    must read. At the top level or in a branch."""
    if row["type"] == steps.decider["type"]:
        return False
    place = Place(row["fork_join_id"], row["branch"])
    return row["lane"] == "inline" or steps.at(row["step_id"], place).get("failed") is not None


def _retry_call(
    cursor: Any, run: RunState, actor: str, definition: dict[str, Any], steps: DecidedSteps,
    row: dict[str, Any],
) -> Outcome:  # fmt: skip
    """A call that failed for good is made again (_called_again: a ctx.run function, or a
    quick step): its decider (the run's, or its branch's) replays the steps before it and
    meets it as new work, its failed row set aside as a re-run from it sets it aside
    (history.py's cut; services/rerun.py). In a branch, the failure ended the other
    branches and the join: they go on again first, at a join row continuing the cancelled
    one, as for a step retried there (_retry)."""
    decided = replays_of(definition)
    assert decided is not None, "a code run's definition replays"
    replays = decided[1]
    _set_status(cursor, run, "retry")
    run.status = RunStatus.RUNNING
    insert_events(cursor, [_run_event(run, "run.retried", actor, steps=[row["step_id"]])])
    walk = Walk(cursor, run, definition, worker=actor)
    at = Place(row["fork_join_id"], row["branch"])
    decider_id = str(steps.decider_at(at)["id"])
    if at.fork_join is not None:
        at = _revive(walk, run, definition, at)  # its rows now belong to the join continuing
    kept = replays.history(run, at).index((row["step_id"], row["iteration"]))
    replay_keeping(walk, cursor, run, decider_id, replays, kept, at)
    walk.flush()
    return Outcome(run.id, "retry", RunStatus.RUNNING, 1)


def _revive(walk: Walk, run: RunState, definition: dict[str, Any], place: Place) -> Place:
    """revive_forks: the joins the failure cancelled continue in new rows, where the retried
    step at ``place`` now is. A code run's replay then reads each branch where its rows
    moved (its cuts renamed with them)."""
    moved: dict[int, int] = {}
    revived = revive_forks(walk, place, moved)
    decided = replays_of(definition)
    if decided is not None and moved:
        for key, value in decided[1].joins_moved(run, moved).items():
            walk.record_output(key, StepResult(output=value))
    return revived


def _retry_compensation(
    cursor: Any, run: RunState, actor: str, definition: dict[str, Any], position: int
) -> Outcome:
    """A run that failed while compensating goes on with its plan where it stopped, never
    from the step that began it (that step is being undone): the compensation entered last
    runs again, the same row as a new series of attempts when it failed on a worker (its
    effect key unchanged), else entered anew (it ended with an outcome that is not a
    success, or was ended); its success enters the rest of the plan."""
    _set_status(cursor, run, "retry")
    run.status = RunStatus.RUNNING
    walk = Walk(cursor, run, definition, worker=actor)
    walk.sagas.active()  # reads the plan
    assert walk.sagas.plan is not None
    step_id = walk.sagas.plan["plan"][position]["step"]
    cursor.execute(sql.LATEST_ROW_OF, {"run": run.id, "step_id": step_id})
    row = fetch_dict(cursor)
    events = [_run_event(run, "run.retried", actor, steps=[step_id],
                         compensation_position=position + 1)]  # fmt: skip
    if row is not None and row["status"] == "failed" and row["lane"] != "inline":
        cursor.execute(sql.RETRY_FAILED_STEPS, {"run": run.id, "ids": [row["id"]]})
        (retried,) = fetch_dicts(cursor)
        events.insert(0, event_row(
            run.org_id, run.id, "step.retried", step_id, iteration=retried["iteration"],
            attempt=retried["attempt"], worker=actor,
            detail={"by": actor, "new_series_after_attempt": retried["attempt"]}))  # fmt: skip
        insert_events(cursor, events)
        insert_wakes(cursor, [(run.org_id, run.id, retried["lane"])])
    else:
        insert_events(cursor, events)
        walk.sagas.enter(position)
        walk.flush()
    return Outcome(run.id, "retry", RunStatus.RUNNING, 1)


_PERFORM: dict[str, Callable[[Any, RunState, str], Outcome]] = {
    "cancel": _cancel,
    "pause": _pause,
    "resume": _resume,
    "retry": _retry,
}
_TARGET = {
    "cancel": RunStatus.CANCELLED,
    "pause": RunStatus.PAUSED,
    "resume": RunStatus.RUNNING,
    "retry": RunStatus.RUNNING,
}
# Where each action may start from: the declared transitions, narrowed where the action
# means less than the table allows (resume only a paused run, retry only a failed one).
_SOURCES = {
    "cancel": run_sources(RunStatus.CANCELLED),
    "pause": run_sources(RunStatus.PAUSED),
    "resume": [RunStatus.PAUSED.value],
    "retry": [RunStatus.FAILED.value],
}


def _run_event(run: RunState, kind: str, actor: str, **detail: Any) -> EventRow:
    return event_row(run.org_id, run.id, kind, worker=actor, detail={"by": actor, **detail})


def _set_status(cursor: Any, run: RunState, action: str, *, error: str = "") -> None:
    """The run's one guarded status change for ``action``; a refusal raises a conflict."""
    target = _TARGET[action]
    if run.status not in _SOURCES[action]:
        raise _conflict(action, run.status)
    cursor.execute(
        sql.SET_RUN_STATUS,
        {
            "id": run.id, "status": target.value, "error": error,
            "finished": target == RunStatus.CANCELLED, "sources": _SOURCES[action],
        },
    )  # fmt: skip
    if cursor.fetchone() is None:
        raise _conflict(action, run.status)


def _conflict(action: str, status: str) -> RunStateConflict:
    allowed = " or ".join(_SOURCES[action])
    return RunStateConflict(
        detail=f"The run is {status}; only a {allowed} run can be {_DONE[action]}.",
        action=action,
        status=status,
    )


_DONE = {"cancel": "cancelled", "pause": "paused", "resume": "resumed", "retry": "retried"}


def _record_refusal(
    org_id: int, run_id: int, action: str, actor: str, refused: RunStateConflict
) -> None:
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        detail = {"by": actor, "code": refused.code, "detail": refused.detail}
        insert_events(cursor, [event_row(org_id, run_id, f"run.{action}_refused", worker=actor,
                                         detail=detail)])  # fmt: skip
