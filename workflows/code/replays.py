"""How a code run replays, for the services that change a run (services/replays.py): which
steps its next replay reads (a re-run from a step chooses among them), the outputs that make
it keep only the first of them (the re-run's cut, history.py), and whether another version's
code fits its history (a migration's check: a dry replay)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..definitions.registry import registry
from ..definitions.storable import storable_text
from ..engine.decided import deciding_step
from ..engine.executors import message_of
from ..engine.places import TOP as TOP_PLACE
from ..engine.places import Place
from ..errors import WorkflowNotAllowed
from ..models import Organisation
from ..services.replays import Replays, RunData
from .budget import TurnOverBudget, turn_budget_seconds, within
from .context import (
    CODE_TYPE,
    COMPENSATE_ID,
    DECIDER_ID,
    CodeFailure,
    Context,
    Suspended,
)
from .history import REPLAY_CUTS, TOP, Cut, Where, newest_row, read_history, replay_cuts
from .registry import CodeWorkflow, registered


def replay_history(run: RunData, at: Place = TOP_PLACE) -> list[tuple[str, int]]:
    """The steps the run's next replay reads at ``at`` (the top level, or a branch of a
    ctx.parallel), in order: (step id, iteration)."""
    history = read_history(org_id=run.org_id, run_id=run.id, decider_type=CODE_TYPE,
                           decider_id=DECIDER_ID, latest=None,
                           cuts=run.outputs.get(REPLAY_CUTS))  # fmt: skip
    return [(step.step_id, step.iteration) for step in history.of(_where(at))]


def compensation_records_read(
    org_id: int, run_id: int, outputs: Mapping[str, Any]
) -> frozenset[int] | None:
    """The iterations of the run's compensation records (``ctx.compensate``) its replay
    still reads, in every place it reaches (the top level's, and the branches of the
    ctx.parallels it keeps); None when no re-run or retry cut the history (every record)."""
    cuts = outputs.get(REPLAY_CUTS)
    if not cuts:
        return None
    history = read_history(org_id=org_id, run_id=run_id, decider_type=CODE_TYPE,
                           decider_id=DECIDER_ID, latest=None, cuts=cuts)  # fmt: skip
    places, reached = [TOP], set()
    read: set[int] = set()
    while places:
        where = places.pop()
        reached.add(where)
        for recorded in history.of(where):
            if recorded.step_id == COMPENSATE_ID:
                read.add(recorded.iteration)
            joined = (
                recorded.output.get("join_row") if isinstance(recorded.output, Mapping) else None
            )
            if registry.forking(recorded.type) and isinstance(joined, int):
                places.extend(p for p in history.places if p[0] == joined and p not in reached)
    return frozenset(read)


def restart_outputs(
    cursor: Any, run: RunData, kept: int, at: Place = TOP_PLACE, decider_id: str = DECIDER_ID
) -> dict[str, Any]:
    """The run's outputs that make the next replay at ``at`` (by ``decider_id``, its
    decider) keep only the first ``kept`` steps it reads there now: one more cut, after the
    run's newest row; and no outcome noted for the decider's next turn to record (the step
    it noted one for is not the step before it)."""
    cuts = [cut.stored() for cut in replay_cuts(run.outputs.get(REPLAY_CUTS))]
    newest = newest_row(cursor, org_id=run.org_id, run_id=run.id)
    cuts.append(Cut(newest, kept, _where(at)).stored())
    return {REPLAY_CUTS: cuts, decider_id: None}


def cuts_moved(run: RunData, moved: Mapping[int, int]) -> dict[str, Any]:
    """The run's cuts with the places of the join rows a retry continued renamed to the
    rows continuing them: a branch's rows move with its join (engine/forks.py), and a cut
    at the old place would set nothing aside, so the replay read the failed call it had set
    aside again. Nothing when no cut is in a moved place."""
    cuts = replay_cuts(run.outputs.get(REPLAY_CUTS))
    if not any(cut.at[0] in moved for cut in cuts):
        return {}
    return {REPLAY_CUTS: [_moved(cut, moved).stored() for cut in cuts]}


def _moved(cut: Cut, moved: Mapping[int, int]) -> Cut:
    join, branch = cut.at
    if join is None or join not in moved:
        return cut
    return Cut(cut.after_row, cut.kept, (moved[join], branch))


def _where(at: Place) -> Where:
    return (at.fork_join, at.branch) if at.fork_join is not None else TOP


def replay_misfit(run: RunData, definition: Mapping[str, Any]) -> str | None:
    """Why the code of ``definition`` (another version's) does not fit the run's history:
    its replay, up to its first new work, calls another step than the history has, or fails
    (``workflow_version_missing`` when that version is not registered here). None when it
    fits. The replay is dry: it stops at the first new work, calls no ctx.run function and
    enters nothing."""
    decider = deciding_step(definition)
    if decider is None:
        return "nondeterministic_workflow: the version is not a code workflow's"
    name, version = str(decider.get("workflow")), int(decider.get("version", 0))
    found = registered(name, version)
    if found is None:
        return f"workflow_version_missing: {name!r} version {version} is not registered here"
    try:
        _dry_replay(run, found)
    except Suspended:
        return None  # new work: the history fits up to it
    except TurnOverBudget as over:
        return str(over)
    except CodeFailure as failure:
        # Stored in the run's run.migration_refused event (jsonb, which refuses a NUL): what
        # the code said (a ctx.fail reason, an exception's message) is made storable.
        return storable_text(str(failure))
    except Exception as exc:  # the code raises on the run's history
        return storable_text(f"workflow_failed: {type(exc).__name__}: {message_of(exc)}")
    return None


def next_call(run: RunData, definition: Mapping[str, Any]) -> str | None:
    """The id of the call the run's code (``definition``'s, registered here) makes next at
    the top level: its dry replay's first new work. None when it makes none (it returns or
    raises on the history, stops at a recorded step that has not ended, or its next call is
    one of the engine's own records, ``ctx.now`` and the like), or the code is not here."""
    code = code_of(definition)
    if code is None or code[2] is None:
        return None
    try:
        _dry_replay(run, code[2])
    except Suspended as suspended:
        called = str(suspended.step.get("id"))
        return None if suspended.recorded or called.startswith("ctx.") else called
    except Exception:  # whatever the code raises, it asks for no call
        return None
    return None


def _dry_replay(run: RunData, found: CodeWorkflow) -> None:
    """The run's top level replayed dry against its history, up to the first new work
    (Suspended): it calls no ctx.run function and enters nothing."""
    latest = run.outputs.get(DECIDER_ID)
    history = read_history(
        org_id=run.org_id, run_id=run.id, decider_type=CODE_TYPE, decider_id=DECIDER_ID,
        cuts=run.outputs.get(REPLAY_CUTS), latest=latest if isinstance(latest, Mapping) else None,
    )  # fmt: skip
    replay = Context(run_id=run.id, history=history.of(TOP), forks=history, dry=True)
    # The code between steps, under the turn's budget: the process checking may be a web
    # request's (the API's or the admin's), which must not hang on it.
    within(turn_budget_seconds(), lambda: _replayed(found.function, replay, run.input))


def code_of(definition: Mapping[str, Any]) -> tuple[str, int, CodeWorkflow | None] | None:
    """The name and version of the code ``definition`` runs, with its registration here
    (None: this process does not register it); None for a definition that runs no code."""
    decider = deciding_step(definition)
    if decider is None or decider.get("type") != CODE_TYPE:
        return None
    name, version = str(decider.get("workflow")), int(decider.get("version", 0))
    return name, version, registered(name, version)


def missing_here(definition: Mapping[str, Any]) -> tuple[str, int] | None:
    """The name and version of the code ``definition`` runs, when this process does not
    register it."""
    code = code_of(definition)
    return None if code is None or code[2] is not None else (code[0], code[1])


def refuse_not_allowed(org: Organisation, definition: Mapping[str, Any]) -> CodeWorkflow | None:
    """The registration of the code ``definition`` runs (None: none here), when ``org`` may
    run it; WorkflowNotAllowed (403) when its ``@workflow(organisations=...)`` leaves ``org``
    out: a start is refused so, and a migration of ``org``'s runs onto it (once there, they
    would run it; a version not registered here is refused by ``missing`` first)."""
    code = code_of(definition)
    found = None if code is None else code[2]
    if found is not None and not found.allows(org.slug):
        raise WorkflowNotAllowed(name=found.name, version=found.version, org=org.slug)
    return found


CODE_REPLAYS = Replays(
    history=replay_history, restart=restart_outputs, misfit=replay_misfit, missing=missing_here,
    refuse_moving_in=refuse_not_allowed, joins_moved=cuts_moved, next_call=next_call,
)  # fmt: skip


def _replayed(function: Callable[[Context, Any], Any], replay: Context, run_input: Any) -> None:
    try:
        function(replay, run_input)
        replay.returned()
    except Exception:
        replay.raise_stop()  # raised after a call stopped the replay: the call ends it
        raise
    finally:
        replay.end_turn()
