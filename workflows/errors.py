"""Domain errors, each with a stable ``code`` that the API, the admin and commands show.

Services raise these; the API's exception handler turns them into JSON
``{"code": ..., "detail": ...}`` with the class's HTTP status. Codes never change meaning once
published: clients branch on them.
"""

from __future__ import annotations

from typing import Any


class WaymarkError(Exception):
    code = "error"
    status = 400
    default_detail = "The request could not be completed."

    def __init__(self, detail: str | None = None, **extra: Any) -> None:
        self.detail = detail or self.default_detail.format(**extra)
        self.extra = extra
        super().__init__(self.detail)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "detail": self.detail}


class NotFound(WaymarkError):
    code = "not_found"
    status = 404
    default_detail = "Not found."


class UnknownOrganisation(NotFound):
    code = "unknown_organisation"
    default_detail = 'No organisation "{slug}".'


class UnknownAutomation(NotFound):
    code = "unknown_automation"
    default_detail = 'No automation "{slug}" in this organisation.'


class UnknownVersion(NotFound):
    code = "unknown_version"
    default_detail = "Automation {slug!r} has no version {number}."


class Conflict(WaymarkError):
    status = 409


class AlreadyExists(Conflict):
    """A name (or another unique key) is taken in this organisation; ``id`` or ``name`` says
    which object holds it. For the resources of the other apps (connections, suppressions,
    schedules)."""

    code = "already_exists"
    default_detail = "{what} already exists in this organisation."

    def as_dict(self) -> dict[str, Any]:
        held = {k: v for k, v in self.extra.items() if k in ("id", "name")}
        return {**super().as_dict(), **held}


class AutomationExists(Conflict):
    code = "automation_exists"
    default_detail = 'An automation "{slug}" already exists in this organisation.'


class VersionPublished(Conflict):
    code = "version_published"
    default_detail = "Version {version} is published and can never change; create a new version."


class AlreadyPublished(Conflict):
    code = "already_published"
    default_detail = "Version {version} was already published at {published_at}."


class InvalidDefinitionError(WaymarkError):
    code = "invalid_definition"
    status = 400
    default_detail = "The definition is invalid."

    def __init__(self, issues: list[dict[str, Any]]) -> None:
        first = issues[0]["message"] if issues else ""
        more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
        super().__init__(f"The definition is invalid: {first}{more}")
        self.issues = issues

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "errors": self.issues}


class AuthenticationFailed(WaymarkError):
    status = 401
    code = "not_authenticated"
    default_detail = "Send an API key as 'Authorization: Bearer <key>'."


class InvalidApiKey(AuthenticationFailed):
    code = "invalid_api_key"
    default_detail = "The API key is not valid."


class ApiKeyRevoked(AuthenticationFailed):
    code = "api_key_revoked"
    default_detail = "The API key was revoked; create a new one."


class NoPublishedVersion(Conflict):
    code = "no_published_version"
    default_detail = 'Automation "{slug}" has no published version; publish one first.'


class SignalIdTaken(Conflict):
    code = "signal_id_conflict"
    default_detail = (
        'Signal id "{identity}" is already another signal\'s (name "{name}", correlation '
        '"{correlation}"): a signal-with-start under it would start a run its signal never '
        "reaches. Use a new id; nothing was started."
    )


class StartKeyConflict(Conflict):
    code = "start_key_conflict"
    default_detail = (
        'Start key "{start_key}" already started run {run_id} {differs}; '
        "use a new key for a new run."
    )

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "run_id": self.extra["run_id"]}


class WorkflowNotAllowed(WaymarkError):
    """A start of a code workflow in an organisation its ``@workflow(organisations=...)``
    does not name (docs/reference/code-workflows.md)."""

    code = "workflow_not_allowed"
    status = 403
    default_detail = 'Code workflow "{name}" version {version} may not run in organisation "{org}".'


class InvalidInput(WaymarkError):
    code = "invalid_input"
    default_detail = "{reason}"


class InputDoesNotMatchSchema(InvalidInput):
    """A start of a code workflow whose input fails the workflow's input schema
    (``@workflow(input_schema=...)`` or its TypedDict): refused before anything is written.
    ``errors`` maps each failing place of the input (``input.items.0``) to its messages."""

    default_detail = "The input does not match the workflow's input schema: {reason}"

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "errors": self.extra["errors"]}


class PayloadTooLarge(WaymarkError):
    code = "payload_too_large"
    status = 413
    default_detail = "{what} is {size} bytes; the limit is {limit}."


class UnknownRun(NotFound):
    code = "unknown_run"
    default_detail = "No run {run_id} in this organisation."


class RunStateConflict(Conflict):
    """A run-control action the run's status does not allow (cancel a finished run, pause a
    paused one, resume a running one, retry a run that did not fail)."""

    code = "run_state_conflict"
    default_detail = "The run is {status}; it cannot be {action}ed."

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "status": self.extra["status"], "action": self.extra["action"]}


class NothingToRetry(RunStateConflict):
    code = "nothing_to_retry"
    default_detail = (
        "Run {run_id} failed without a failed step to run again (a budget, its max age, or an "
        "end step with status failed); start a new run instead."
    )

    def __init__(self, run_id: int) -> None:
        super().__init__(run_id=run_id, status="failed", action="retry")


# --- keys and quotas (hostile tenants) --------------------------------------------------------


class ApiKeyExpired(AuthenticationFailed):
    code = "api_key_expired"
    default_detail = "This API key has expired; create a new one."


class ReadOnlyKey(WaymarkError):
    code = "read_only_key"
    status = 403
    default_detail = "This API key is read-only: it cannot change anything."


class QuotaExceeded(Conflict):
    """A count an organisation may not exceed (automations, versions)."""

    code = "quota_exceeded"
    default_detail = "The organisation's quota of {limit} {what} is reached."


class StartQuota(QuotaExceeded):
    """A start refused for now by a quota that frees up with time (running runs, starts per
    minute): 429 with Retry-After; a schedule tries the occurrence again after that."""

    status = 429
    retry_after_seconds = 30

    def __init__(self, detail: str | None = None, **extra: Any) -> None:
        super().__init__(detail, **extra)
        if "retry_after" in extra:
            self.retry_after_seconds = int(extra["retry_after"])


class RunningRunsQuota(StartQuota):
    """Too many runs still running: refused for now, accepted again as runs finish."""

    default_detail = (
        "The organisation already has {limit} running runs, its quota; try again once some "
        "have finished."
    )


class StartsPerMinuteQuota(StartQuota):
    """Starts of this minute used up, by any path (API, signal-with-start, schedules)."""

    default_detail = (
        "The organisation has started {limit} runs this minute, its quota; try again in "
        "{retry_after} s."
    )


class PendingSignalsQuota(QuotaExceeded):
    """Signals that no step waits for yet, kept until one does: past the quota a new one
    that matches no waiting step is refused (one that wakes a step is always taken)."""

    code = "quota_exceeded"
    status = 429
    retry_after_seconds = 30
    default_detail = (
        "The organisation already has {limit} signals that no step waits for, its quota; this "
        "signal matches no waiting step and was not stored."
    )


class InvalidQuery(WaymarkError):
    """A query parameter the endpoint does not take (a typo such as ``?stauts=``), or a
    ``limit`` that is not a positive whole number."""

    code = "invalid_query"
    default_detail = "{reason}"

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "parameter": self.extra["parameter"]}


class InvalidFilter(InvalidInput):
    """A filter's value the endpoint cannot use (``?status=done``). Keeps ``invalid_input``,
    the code such a value always had; ``parameter`` names the filter."""

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "parameter": self.extra["parameter"]}


# --- migrating runs between versions (services/run_migration) ---------------------------------


class UnknownStep(WaymarkError):
    """A migration plan names a step id its version does not have (a mapping's old or new
    step, ``move_to``, the current-step filter); ``step`` and ``version`` say which."""

    code = "unknown_step"
    default_detail = "Version {version} has no step {step!r}."

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "step": self.extra["step"], "version": self.extra["version"]}


class WorkflowVersionMissing(WaymarkError):
    """A migration of code runs to a version whose code is not registered in this process:
    nothing can check the runs' histories against it (docs/reference/code-workflows.md)."""

    code = "workflow_version_missing"
    default_detail = (
        "Code workflow {name!r} version {version} is not registered here: deploy it (or "
        "migrate from a process that has it) first."
    )


class MigrationBetweenKinds(WaymarkError):
    """A migration between a code workflow's version and a definition's: a code run's history
    is its code's calls, which a definition's walk does not read, and a definition's run has
    no history a code workflow could replay; neither can go on as the other."""

    code = "migration_between_kinds"
    default_detail = (
        "Version {from_version} is {from_kind} and version {to_version} is {to_kind}: runs "
        "move between two definitions' versions or two code workflow versions only."
    )


class IncompatibleStepType(WaymarkError):
    """A mapping sends a step to one of another type: a run parked on a ``wait`` can only
    carry its timer over to a ``wait``, an approval's request to an ``approval``..."""

    code = "incompatible_step_type"
    default_detail = (
        "Step {step!r} is a {old_type} step and {target!r} is a {new_type} step: a run parked "
        "on one cannot carry its wait over to the other; map it to a {old_type} step, or let "
        "the removed-step rule handle it (move_to re-makes the wait)."
    )

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "step": self.extra["step"], "target": self.extra["target"]}


class VersionOfAnotherAutomation(WaymarkError):
    code = "version_of_another_automation"
    default_detail = (
        "The target version belongs to automation {other!r}, not {slug!r}: runs move between "
        "versions of their own automation only."
    )


class SameVersion(WaymarkError):
    code = "same_version"
    default_detail = "The runs are on version {version} already: choose another target version."


class VersionNotPublished(Conflict):
    code = "version_not_published"
    default_detail = "Version {version} is a draft: runs move only to and from published versions."


class MigratingFinishedRuns(WaymarkError):
    """A filter that asks for finished runs: a finished run keeps the version it ended on."""

    code = "run_finished"
    default_detail = (
        "Finished runs ({statuses}) are never migrated: they keep the version they ended on. "
        "Filter on running and/or paused runs."
    )


class UnknownMigration(NotFound):
    code = "unknown_migration"
    default_detail = "No migration {migration_id} of this automation in this organisation."


# --- re-running a run from a step (services/rerun.py) -----------------------------------------


class RerunStepNotTopLevel(WaymarkError):
    """The step runs inside a branch of a ``parallel`` with a join: entered alone, it would
    belong to no fork. Re-run from the parallel step itself (or from its join)."""

    code = "rerun_step_not_top_level"
    default_detail = (
        "Step {step!r} runs inside a branch of parallel {fork!r}: re-run from {fork!r} (its "
        "branches run again) or from a step after its join."
    )

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "step": self.extra["step"]}


class RerunStepIsCompensation(WaymarkError):
    """The step is a compensation: only a saga's plan enters it."""

    code = "rerun_step_is_compensation"
    default_detail = (
        "Step {step!r} compensates {compensates!r}: compensation steps are entered only by the "
        "run's compensation; re-run from a step of the run's path."
    )

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "step": self.extra["step"]}


# --- erasing a person (services/erasure) --------------------------------------------------------


class InvalidPerson(InvalidInput):
    """The person to erase is not named by exactly one well-formed email address, phone
    number or identifier."""

    code = "invalid_person"


class IdentifierTooShort(InvalidPerson):
    """An identifier shorter than MIN_IDENTIFIER_CHARS: it would be a part of too many other
    values to name one person."""

    code = "identifier_too_short"
    default_detail = "An identifier must have at least {min_chars} characters."


class IdentifierNotDeclared(InvalidPerson):
    """An erasure by identifier in an organisation none of whose definitions declares
    ``personal_data.identifiers``: nothing says which values are identifiers there."""

    code = "identifier_not_declared"
    default_detail = (
        "No definition of this organisation declares personal_data.identifiers: name the "
        "person by email or phone, or declare which input paths identify a person."
    )


class ScopeRequired(WaymarkError):
    """An API key without the scope an endpoint needs (``ApiKey.scopes``)."""

    code = "scope_required"
    status = 403
    default_detail = "This API key does not have the {scope!r} scope this request needs."


class UnknownPerson(NotFound):
    code = "unknown_person"
    default_detail = (
        "Nothing of this organisation references this person (no run, no stored row): "
        "nothing was changed."
    )


class ErasureBusy(Conflict):
    code = "erasure_busy"
    default_detail = (
        "Rows of this person were held by other work for too long; nothing was changed. Try again."
    )
