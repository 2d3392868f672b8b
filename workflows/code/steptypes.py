"""The two step types a code workflow runs on: ``code``, the decider that runs the function
on a worker (engine/decided.py), and ``code_result``, the step that records what a
``ctx.run`` function returned. Registered from WorkflowsConfig.ready()."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..definitions.fields import check_fields
from ..definitions.registry import StepReport, StepType, registry
from ..engine.decided import deciding_step
from ..engine.definition_cache import definition_for
from ..engine.executors import NotInline, StepContext, StepDeferred, StepFailure, StepResult
from ..engine.speculative import NeedsTransaction
from ..errors import WorkflowNotAllowed
from ..models import Organisation
from ..services.runs import register_start_guard
from .budget import TurnOverBudget, turn_budget_seconds, within
from .context import RESULT_TYPE, CodeFailure, Context, RunsOnWorker, Suspended, check_json
from .history import ENDED, Turn, ended_before, history_after, run_history
from .registry import publishing_as_host, registered

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
    if ctx.version_id is not None and deciding_step(definition_for(ctx.version_id)) is None:
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
        )
    # The decider's output among the run's outputs: the outcome of the step that just ended
    # is noted there (engine/decided.py), to be recorded by this turn.
    latest = context["steps"].get(str(step["id"]), {}).get("output")
    latest = latest if isinstance(latest, Mapping) else None
    # The turn before this one, in the same walk, knew the history: no query then.
    history = history_after(ctx.carried, latest=latest, outputs=context["steps"])
    if history is None and ctx.ahead:  # a hop's walk reads nothing: the ordinary walk does
        raise NeedsTransaction("a turn that reads the run's history")
    if history is None:
        history = run_history(org_id=ctx.org_id, run_id=ctx.run_id, latest=latest)
    replay = Context(run_id=ctx.run_id, history=history, calls_functions=not inline)
    try:
        with within(turn_budget_seconds()):
            output = found.function(replay, context["input"])
            replay.returned()
            check_json("output", output)
    except RunsOnWorker:
        raise NotInline("a ctx.run function runs on a worker, never under the run's lock") from None
    except Suspended as suspended:
        asked = suspended.step
        answer: dict[str, Any] = {"call": asked}
        ended = ended_before(latest) if latest is not None else None
        if ended is not None:
            answer[ENDED] = ended  # read back by every later replay (history.py)
        return StepResult(output=answer, carried=Turn(tuple(history), asked))
    except TurnOverBudget as over:
        if inline:  # a worker's turn has a budget of its own, and the lane's attempts
            raise NotInline(str(over)) from None
        raise StepFailure(str(over)) from None
    except CodeFailure as failure:
        raise StepFailure(str(failure), retryable=False) from None
    except Exception as exc:  # the workflow's own code raised: it fails the run, no traceback
        raise StepFailure(
            f"workflow_failed: {type(exc).__name__}: {exc}", retryable=False
        ) from None
    return StepResult(output=output, finish="succeeded")


def allowed_to_start(org: Organisation, definition: Mapping[str, Any]) -> None:
    """Refuse a start of a code workflow in an organisation its ``@workflow`` does not name
    (services/runs.py calls it before the run is written). A version not registered here
    starts, and waits as every run of it does (decide)."""
    decider = deciding_step(definition)
    if decider is None or decider.get("type") != CODE.name:
        return
    found = registered(str(decider.get("workflow")), int(decider.get("version", 0)))
    if found is not None and not found.allows(org.slug):
        raise WorkflowNotAllowed(name=found.name, version=found.version, org=org.slug)


def validate_code_result(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("output",))


def record_result(
    step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext
) -> StepResult:
    """The function ran in the decider; this step only records its result."""
    return StepResult(output=step.get("output"))


CODE = StepType(
    name="code", lane="io", validate=validate_code, execute=decide, built=True, decides=True,
    app="workflows",
)  # fmt: skip

CODE_RESULT = StepType(
    name=RESULT_TYPE, lane="inline", validate=validate_code_result, execute=record_result,
    built=True, pure=True, app="workflows",
)  # fmt: skip


def register_code_step_types() -> None:
    registry.register(CODE)
    registry.register(CODE_RESULT)
    register_start_guard(allowed_to_start)
