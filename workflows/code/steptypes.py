"""The two step types a code workflow runs on: ``code``, the decider that runs the function
on a worker (engine/decided.py), and ``code_result``, the step that records what a
``ctx.run`` function returned. Registered from WorkflowsConfig.ready()."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..definitions.fields import check_fields
from ..definitions.registry import RetryPolicy, StepReport, StepType, registry
from ..definitions.rendering import plain_copy
from ..engine.compensation import register_records_read
from ..engine.decided import deciding_step
from ..engine.definition_cache import definition_for
from ..engine.executors import NotInline, StepContext, StepDeferred, StepFailure, StepResult
from ..engine.lanes import lane_policy
from ..engine.speculative import NeedsTransaction
from ..models import Organisation
from ..services.replays import register_replays
from ..services.runs import register_start_guard
from .budget import TurnOverBudget, turn_budget_seconds, within
from .context import (
    CODE_TYPE,
    MOST_ATTEMPTS,
    RESULT_TYPE,
    BranchReturned,
    BranchStepFailed,
    CodeFailure,
    Context,
    RetryCall,
    RunsOnWorker,
    StepFailed,
    Suspended,
    failure_of,
)
from .history import (
    ENDED,
    REPLAY_CUTS,
    RETURNED,
    TOP,
    History,
    Turn,
    ended_before,
    history_after,
    read_history,
)
from .registry import publishing_as_host, registered
from .replays import CODE_REPLAYS, compensation_records_read, refuse_not_allowed
from .schemas import check_output, check_start_input

# A run whose workflow version is not registered in this worker's process (a deploy that
# dropped it, or one that has not reached every worker yet) looks again this often, its
# step deferred (durable, no attempt spent), instead of failing.
MISSING_VERSION_RETRY_SECONDS = 30.0


def validate_code(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("workflow", "version"))
    if not publishing_as_host():
        report.issue("code_step_not_allowed", "type",
                     "a code step is published by the host (publish_code_workflow), "
                     "not written in a definition")  # fmt: skip
        return
    name, version = step.get("workflow"), step.get("version")
    if not isinstance(name, str) or not name:
        report.error("workflow", "must be the name of a registered code workflow")
    elif not isinstance(version, int) or isinstance(version, bool):
        report.error("version", "must be the integer version of the code workflow")
    elif registered(name, version) is None:
        report.issue("workflow_version_missing", "workflow",
                     f"{name!r} version {version} is not registered")  # fmt: skip


def decide(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext) -> StepResult:
    """Run the workflow's function from the top against the run's history: the step it
    asks for next (``{"call": step}``), or the run's end.

    On a worker, or inline in a worker's settle (``ctx.lane == "inline"``: the walk offered
    it, engine/walk.py Walk.decide_inline), under the run's lock. Inline, what must not run
    under that lock is handed back to a worker (NotInline): a ``ctx.run`` function, which is
    the host's own work (outside calls, slow computations), and a turn past its budget
    (budget.py; a ``ctx.run`` function's own time is not counted)."""
    inline = ctx.lane == "inline"
    if ctx.version_id is not None and not _decides_alone(ctx.version_id):
        # A definition naming a code step beside others: its steps are the definition's,
        # so nothing would enter what the function asks for.
        raise StepFailure(
            "code_step_alone: a code step runs only as its definition's one step",
            retryable=False,
        )
    name, version = str(step["workflow"]), int(step["version"])
    found = registered(name, version)
    if found is None:
        if inline:  # a worker defers it, durably
            raise NotInline(f"{name!r} version {version} is not registered")
        raise StepDeferred(
            MISSING_VERSION_RETRY_SECONDS,
            f"workflow_version_missing: {name!r} version {version} is not registered here",
            code="workflow_version_missing",
            detail={"workflow": name, "version": version},
        )
    # The decider's output among the run's outputs: the outcome of the step that just ended
    # is noted there (engine/decided.py), to be recorded by this turn.
    decider_id = str(step["id"])
    latest = context["steps"].get(decider_id, {}).get("output")
    latest = latest if type(latest) is dict or isinstance(latest, Mapping) else None
    history = _turn_history(step, context, ctx, decider_id, latest)
    # A branch's decider (engine/decided.py) replays the top level up to its ctx.parallel,
    # then its own branch (through the branches around it, when parallels nest): the step
    # the branch asks for next, or what it returned.
    branch_path = step.get("within")
    deciding = tuple((str(p), int(b)) for p, b in branch_path) or None if branch_path else None
    # A turn's attempts are the decider's, under its type's policy (enough for the largest
    # ctx.run retry); a turn whose call is no such retry gets the lane's usual number. A
    # turn inline has the one: what would need another goes to a worker (NotInline).
    usual = 1 if inline else lane_policy(CODE.lane).max_attempts
    replay = Context(run_id=ctx.run_id, history=history.of(TOP), forks=history, deciding=deciding,
                     attempts_used=ctx.attempts_used, lost_claims_allowed=usual,
                     calls_functions=not inline)  # fmt: skip
    ended = ended_before(latest) if latest is not None else None

    def turn() -> Any:
        # A copy: the walk's own input, read by the run's later turns (Walk._decider_context).
        try:
            output = found.function(replay, plain_copy(context["input"]))
            replay.returned()
        except Exception:
            # Raised after a call stopped the turn (by a ``finally`` or an ``except
            # BaseException`` around the call): the turn ends with that call all the same.
            replay.raise_stop()
            raise
        finally:
            replay.end_turn()
        check_output(found.output_schema, output)
        return output

    try:
        output = within(turn_budget_seconds(), turn)
    except RunsOnWorker:
        raise NotInline("a ctx.run function runs on a worker, never under the run's lock") from None
    except Suspended as suspended:
        if ctx.attempts_used > replay.attempts_allowed:
            raise StepFailure(
                f"attempts exhausted: {ctx.attempts_used - 1} claim(s) never settled "
                "(the step may kill its worker)",
                retryable=False,
            ) from None
        asked: dict[str, Any] = {"call": suspended.step}
        if ended is not None:
            asked[ENDED] = ended  # read back by every later replay (history.py)
        return StepResult(output=asked, carried=_carried(step, history, suspended.step))
    except BranchReturned as returned:
        ending: dict[str, Any] = {RETURNED: returned.value}
        if ended is not None:
            ending[ENDED] = ended
        return StepResult(output=ending)  # no step asked: the branch arrives at its join
    except RetryCall as retry:  # the engine's backoff, then this turn again
        raise StepFailure(str(retry), retryable=True) from None
    except TurnOverBudget as over:
        if inline:  # a worker's turn has a budget of its own, and the lane's attempts
            raise NotInline(str(over)) from None
        # The lane's usual attempts (the code type allows more, for ctx.run's retries only).
        raise StepFailure(str(over), retryable=ctx.attempts_used < usual) from None
    except CodeFailure as failure:
        raise StepFailure(str(failure), retryable=False) from None
    except (StepFailed, BranchStepFailed) as failed:  # not caught: the run fails with it
        raise StepFailure(str(failed), retryable=False) from None
    except Exception as exc:  # the workflow's own code raised: it fails the run, no traceback
        raise StepFailure(str(failure_of(exc)), retryable=False) from None
    if deciding is not None:  # a branch's turn always ends in its branch (or fails)
        raise StepFailure(
            f"nondeterministic_workflow: the code returned before ctx.parallel {deciding[0][0]!r}",
            retryable=False,
        )
    return StepResult(output=output, finish="succeeded")


# By published version (which never changes): whether its definition's one step decides.
_alone: dict[int, bool] = {}


def _decides_alone(version_id: int) -> bool:
    alone = _alone.get(version_id)
    if alone is None:
        alone = _alone[version_id] = deciding_step(definition_for(version_id)) is not None
    return alone


def _turn_history(
    step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext, decider_id: str,
    latest: Mapping[str, Any] | None,
) -> History:  # fmt: skip
    """What this turn replays: the history the run's previous turn in the same walk knew,
    with the step it asked for ended (no query; the top level's turns of a run with no
    ctx.parallel only, see _carried), or the run's history read in one statement."""
    carried = None
    # A re-run's cut sets steps aside: their rows still count in the iterations of the steps
    # entered after it, which only the rows tell.
    cut = context["steps"].get(REPLAY_CUTS, {}).get("output")
    if "within" not in step and not cut:
        if latest is None and _entered_nothing_else(ctx.run_entered, decider_id):
            return History(places={TOP: []})  # the run's first turn: nothing to read
        carried = history_after(ctx.carried, latest=latest, outputs=context["steps"])
    if carried is not None:
        return History(places={TOP: carried})
    if ctx.ahead:  # a hop's walk reads nothing: the ordinary walk does
        raise NeedsTransaction("a turn that reads the run's history")
    # Inline, the turn's own row is written after it: its place is the walk's.
    at = (ctx.fork_join, ctx.branch) if ctx.lane == "inline" else None
    return read_history(org_id=ctx.org_id, run_id=ctx.run_id, decider_type=CODE.name,
                        decider_id=decider_id, latest=latest, cuts=cut, deciding_at=at)  # fmt: skip


def _entered_nothing_else(entered: Mapping[str, int] | None, decider_id: str) -> bool:
    """The run entered its decider and no other step (the engine's continuations aside), as
    its row was at the claim: no turn asked for a step yet, so its history is empty. Every
    step a turn asks for is counted in the run's ``entered`` in the transaction that enters
    it, before any turn can be claimed again."""
    if not entered or entered.get(decider_id, 0) < 1:
        return False  # not known (inline), or not the run's decider
    return all(step_id == decider_id or step_id.startswith("~") for step_id in entered)


_TOP_ONLY = frozenset([TOP])


def _carried(step: Mapping[str, Any], history: History, asked: Mapping[str, Any]) -> Turn | None:
    """What the next turn may replay without a query: the top level's history and the step
    asked, when the run has no ctx.parallel (its forks' rows and joins are read, not
    carried) and the step asked is not one either."""
    plain = "within" not in step and not history.joins and history.places.keys() <= _TOP_ONLY
    if not plain or asked.get("type") == "parallel":
        return None
    return Turn(tuple(history.of(TOP)), asked)


def allowed_to_start(org: Organisation, definition: Mapping[str, Any], run_input: Any) -> None:
    """Refuse a start of a code workflow in an organisation its ``@workflow`` does not name,
    or with an input its input schema refuses (services/runs.py calls it before the run is
    written). A version not registered here starts, and waits as every run of it does
    (decide)."""
    found = refuse_not_allowed(org, definition)
    if found is not None:
        check_start_input(found.input_schema, run_input)


def validate_code_result(step: Mapping[str, Any], report: StepReport) -> None:
    """Not in an organisation's definition (the API's, the admin's), as a ``code`` step is
    not: the engine writes a ``code_result`` step for what a ``ctx.run`` function returned,
    and one a tenant's definition held would be read by a code run's replay (a run migrated
    onto the code, then re-run) as the host's function's own result. The host may publish
    one (publish_code_workflow's context), and a workflow's code may call one (a value it
    records, a compensation that only notes itself): its record is its own."""
    check_fields(step, report, ("output", "failed"))
    if report.of_definition and not publishing_as_host():
        report.issue("code_step_not_allowed", "type",
                     "a code_result step records what a code workflow's ctx.run function "
                     "returned: only the engine writes one")  # fmt: skip


def record_result(
    step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext
) -> StepResult:
    """The function ran in the decider; this step only records its result, or that it
    failed for good (``failed``: the error), which the next turn raises as StepFailed."""
    if "failed" in step:
        raise StepFailure(str(step["failed"]), retryable=False)
    return StepResult(output=step.get("output"))


CODE = StepType(
    name=CODE_TYPE, lane="io", validate=validate_code, execute=decide, built=True, decides=True,
    app="workflows",
    # Room for the largest ctx.run retry; decide holds other turns to the lane's number.
    retry=RetryPolicy(max_attempts=MOST_ATTEMPTS),
)  # fmt: skip

CODE_RESULT = StepType(
    name=RESULT_TYPE, lane="inline", validate=validate_code_result, execute=record_result,
    built=True, pure=True, app="workflows",
    context_on_read=True,  # it reads nothing of the run
)  # fmt: skip


def register_code_step_types() -> None:
    registry.register(CODE)
    registry.register(CODE_RESULT)
    register_start_guard(allowed_to_start)
    register_replays(CODE.name, CODE_REPLAYS)
    register_records_read(CODE.name, compensation_records_read)
