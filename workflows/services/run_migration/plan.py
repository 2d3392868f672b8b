"""A migration plan: which runs move, to which version, and where each of their steps goes.

Everything is checked before anything is read or written, and a plan that fails any check is
refused as a whole with a stable code (nothing half-applied): an unknown version or step id
(``unknown_version``, ``unknown_step``, naming the step and its version), a mapping between
steps of different types (``incompatible_step_type``), a target version of another automation
(``version_of_another_automation``) or the runs' own (``same_version``), a draft
(``version_not_published``), finished runs asked for (``run_finished``).

The mapping given is completed: a step id the new version has too, with the same type, maps to
itself. A step with no new id (removed, or its id now names a step of another type) follows
the removed-step rule: ``stay`` (its runs stay on the old version and are reported) or
``move_to`` a step of the new version (its wait is cancelled and that step is entered).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from psycopg.types.json import Jsonb

from ...engine.forks import JOIN_WAIT
from ...engine.walk import CONTINUATION_STEP
from ...errors import (
    IncompatibleStepType,
    InvalidInput,
    MigratingFinishedRuns,
    MigrationBetweenKinds,
    SameVersion,
    UnknownStep,
    VersionNotPublished,
    VersionOfAnotherAutomation,
    WorkflowVersionMissing,
)
from ...models import Automation, AutomationVersion, Organisation
from ...selectors import automation_get, version_get
from ...states import RUN_FINISHED, RUN_LIVE, RunStatus
from ..replays import replays_of

STAY = "stay"
MOVE_TO = "move_to"
MAX_STEP_ID = 63  # a step id's length (Step.step_id)
MAX_LISTED = 500  # mapping entries, current steps: far beyond any definition's step count
SAMPLE = 10  # run ids shown per line of a report


@dataclass(frozen=True)
class RemovedRule:
    """What becomes of a run parked on a step the new version does not have: it stays on the
    old version (``move_to`` None), or its wait is cancelled and ``move_to`` is entered."""

    move_to: str | None = None

    def as_json(self) -> Any:
        return STAY if self.move_to is None else {MOVE_TO: self.move_to}

    @classmethod
    def parse(cls, value: Any) -> RemovedRule:
        """``"stay"``, ``"move_to:<step id>"`` (the command's form) or ``{"move_to": id}``."""
        if value is None or value == STAY:
            return cls()
        if isinstance(value, str) and value.startswith(f"{MOVE_TO}:"):
            value = {MOVE_TO: value.partition(":")[2]}
        if isinstance(value, Mapping) and set(value) == {MOVE_TO}:
            target = value[MOVE_TO]
            if isinstance(target, str) and 0 < len(target) <= MAX_STEP_ID:
                return cls(move_to=target)
        raise InvalidInput(
            reason='removed must be "stay" or "move_to:<step id>" ({"move_to": "<step id>"})'
        )


@dataclass(frozen=True)
class MigrationPlan:
    org: Organisation
    automation: Automation
    from_version: AutomationVersion
    to_version: AutomationVersion
    mapping: dict[str, str]  # as given (old step id -> new step id)
    removed: RemovedRule
    steps: tuple[str, ...]  # only runs at one of these steps (empty: any)
    statuses: tuple[str, ...]  # only runs in one of these statuses
    # Derived: every old step id that has a new one (the mapping given, then the same id),
    # and why each of the others has none (step_removed, step_type_changed).
    targets: dict[str, str] = field(default_factory=dict)
    unmapped: dict[str, str] = field(default_factory=dict)
    # Whether the old version declares compensations (a saga): only then can one of its runs
    # be compensating, which the dry run then asks each run's history.
    sagas: bool = False
    # Whether both versions decide their steps as they go (code workflows): a run's live step
    # is one its code asked for, kept as it is, and the new version's code is checked against
    # each run's history before it moves (move.py).
    decided: bool = False

    def as_json(self) -> dict[str, Any]:
        """The plan as asked (what a job stores; ``from_json`` rebuilds it)."""
        return {
            "map": self.mapping, "removed": self.removed.as_json(), "steps": list(self.steps),
            "statuses": list(self.statuses),
        }  # fmt: skip

    def describe(self) -> dict[str, Any]:
        """The plan as it will apply, for answers and pages: the versions, the complete
        mapping and the steps with no new id."""
        return {
            "automation": self.automation.slug, "from_version": self.from_version.number,
            "to_version": self.to_version.number, **self.as_json(), "targets": self.targets,
            "unmapped": self.unmapped,
        }  # fmt: skip

    def audited(self) -> dict[str, Any]:
        """``describe()`` as the audit log keeps it: its maps by step id (``map``,
        ``targets``, ``unmapped``) as lists of ``[step id, value]`` pairs. A step id is the
        author's word, and the audit log refuses a key that reads as a secret's name: a step
        ``fetch_token`` failed every migration of its automation (a 500)."""
        return {
            key: [[step_id, item] for step_id, item in value.items()]
            if key in STEP_KEYED and isinstance(value, Mapping) else value
            for key, value in self.describe().items()
        }  # fmt: skip

    def sql_params(self, *, after: int = 0) -> dict[str, Any]:
        """The parameters of sql/migration.py's statements."""
        return {
            "org": self.org.pk, "automation": self.automation.pk, "from": self.from_version.pk,
            "statuses": list(self.statuses), "steps": list(self.steps),
            "targets": Jsonb(self.targets), "unmapped": Jsonb(self.unmapped),
            "move_to": self.removed.move_to, "continuation": CONTINUATION_STEP,
            "join_wait": JOIN_WAIT, "sagas": self.sagas, "after": after, "sample": SAMPLE,
            "decided": self.decided,
        }  # fmt: skip


STEP_KEYED = ("map", "targets", "unmapped")  # describe()'s maps whose keys are step ids


def migration_plan(
    *,
    org: Organisation,
    automation_slug: str,
    from_version: int,
    to_version: int,
    to_automation: str | None = None,
    mapping: Mapping[str, str] | None = None,
    removed: Any = STAY,
    steps: Sequence[str] = (),
    statuses: Sequence[str] = (),
) -> MigrationPlan:
    """The plan, checked against both versions' definitions; raises the first problem."""
    automation = automation_get(org=org, slug=automation_slug)
    old = _published(version_get(automation=automation, number=from_version))
    if to_automation is not None and to_automation != automation.slug:
        other = automation_get(org=org, slug=to_automation)
        _published(version_get(automation=other, number=to_version))
        raise VersionOfAnotherAutomation(other=other.slug, slug=automation.slug)
    new = _published(version_get(automation=automation, number=to_version))
    if new.pk == old.pk:
        raise SameVersion(version=old.number)
    plan = MigrationPlan(
        org=org, automation=automation, from_version=old, to_version=new,
        mapping=_mapping(mapping), removed=RemovedRule.parse(removed),
        steps=_step_ids(steps, "steps"), statuses=_statuses(statuses),
    )  # fmt: skip
    return _checked(plan)


def plan_from_job(job: Any) -> MigrationPlan:
    """A stored job's plan, checked again (its versions are published and immutable, so it
    passes as it passed when the job was made)."""
    stored = job.plan
    plan = MigrationPlan(
        org=job.org, automation=job.automation, from_version=job.from_version,
        to_version=job.to_version, mapping=dict(stored["map"]),
        removed=RemovedRule.parse(stored["removed"]), steps=tuple(stored["steps"]),
        statuses=tuple(stored["statuses"]),
    )  # fmt: skip
    return _checked(plan)


def _checked(plan: MigrationPlan) -> MigrationPlan:
    old_steps = _types(plan.from_version)
    new_steps = _types(plan.to_version)
    for step_id in plan.steps:
        _known(step_id, old_steps, plan.from_version)
    for old_id, new_id in plan.mapping.items():
        _known(old_id, old_steps, plan.from_version)
        _known(new_id, new_steps, plan.to_version)
        if old_steps[old_id] != new_steps[new_id]:
            raise IncompatibleStepType(
                step=old_id, target=new_id, old_type=old_steps[old_id], new_type=new_steps[new_id]
            )
    if plan.removed.move_to is not None:
        _known(plan.removed.move_to, new_steps, plan.to_version)
    targets: dict[str, str] = {}
    unmapped: dict[str, str] = {}
    for old_id, old_type in old_steps.items():
        if old_id in plan.mapping:
            targets[old_id] = plan.mapping[old_id]
        elif new_steps.get(old_id) == old_type:
            targets[old_id] = old_id
        else:
            unmapped[old_id] = "step_type_changed" if old_id in new_steps else "step_removed"
    sagas = any("compensate" in step for step in plan.from_version.definition["steps"])
    return replace(plan, targets=targets, unmapped=unmapped, sagas=sagas,
                   decided=_decided(plan))  # fmt: skip


def _decided(plan: MigrationPlan) -> bool:
    """Whether the plan moves code runs between two versions of their code: then the new
    version's code must be here, to check each run's history against (workflow_version_
    missing otherwise), and the organisation allowed to run it. A plan between a code
    version and a definition's is refused (migration_between_kinds): no check of a code
    workflow's could be skipped by moving a definition's run onto it."""
    old = replays_of(plan.from_version.definition)
    new = replays_of(plan.to_version.definition)
    if (old is None) != (new is None):
        raise MigrationBetweenKinds(
            from_version=plan.from_version.number, to_version=plan.to_version.number,
            from_kind=_kind(old), to_kind=_kind(new),
        )  # fmt: skip
    if old is None or new is None:
        return False
    missing = new[1].missing(plan.to_version.definition)
    if missing is not None:
        raise WorkflowVersionMissing(name=missing[0], version=missing[1])
    new[1].refuse_moving_in(plan.org, plan.to_version.definition)
    return True


def _kind(replays: object) -> str:
    return "a definition" if replays is None else "a code workflow's"


def _types(version: AutomationVersion) -> dict[str, str]:
    return {step["id"]: step["type"] for step in version.definition["steps"]}


def _known(step_id: str, steps: Mapping[str, str], version: AutomationVersion) -> None:
    if step_id not in steps:
        raise UnknownStep(step=step_id, version=version.number)


def _published(version: AutomationVersion) -> AutomationVersion:
    if not version.is_published:
        raise VersionNotPublished(version=version.number)
    return version


def _mapping(mapping: Mapping[str, str] | None) -> dict[str, str]:
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping) or len(mapping) > MAX_LISTED:
        raise InvalidInput(reason=f"map must be an object of at most {MAX_LISTED} step ids")
    for old_id, new_id in mapping.items():
        _step_ids([old_id, new_id], "map")
    return dict(mapping)


def _step_ids(values: Sequence[str], name: str) -> tuple[str, ...]:
    if isinstance(values, str) or len(values) > MAX_LISTED:
        raise InvalidInput(reason=f"{name} must be a list of at most {MAX_LISTED} step ids")
    for value in values:
        if not isinstance(value, str) or not 0 < len(value) <= MAX_STEP_ID:
            raise InvalidInput(reason=f"{name}: step ids are 1 to {MAX_STEP_ID} characters")
    return tuple(values)


def _statuses(statuses: Sequence[str]) -> tuple[str, ...]:
    """The run statuses asked for (default: every status a live run has)."""
    chosen = tuple(statuses) or tuple(sorted(s.value for s in RUN_LIVE))
    unknown = [s for s in chosen if s not in RunStatus.values]
    if unknown:
        raise InvalidInput(reason=f"unknown run status {unknown[0]!r}; one of running, paused")
    finished = sorted({s for s in chosen if s in RUN_FINISHED})
    if finished:
        raise MigratingFinishedRuns(statuses=", ".join(finished))
    return chosen
