"""Input and output shapes of the API. Inputs validate shape only; services validate meaning."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, cast

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..definitions.validator import definition_warnings
from ..engine.wait_words import WaitDescription, describe_waits
from ..models import Automation, AutomationVersion, Run, RunEvent, Step
from ..services.runs import DERIVED_KEY_PREFIX, MAX_START_KEY
from ..states import RunStatus


class VersionOut(serializers.ModelSerializer):
    automation = serializers.CharField(source="automation.slug")
    definition = serializers.SerializerMethodField(
        help_text="The definition as it was sent: its keys in the order written."
    )

    class Meta:
        model = AutomationVersion
        fields = ["automation", "number", "digest", "definition", "created_at", "published_at"]

    @extend_schema_field(serializers.JSONField())
    def get_definition(self, version: AutomationVersion) -> Any:
        return version.document()


class IssueOut(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    step = serializers.CharField(allow_null=True)
    field = serializers.CharField(allow_null=True)


class VersionDetailOut(VersionOut):
    """One version as saved or read alone: with the validator's warnings (what is allowed
    but probably wrong, such as an irreversible step before a risky one; never a reason to
    refuse it). Not in lists: each would validate its definition again."""

    warnings = serializers.SerializerMethodField()

    class Meta(VersionOut.Meta):
        fields = [*VersionOut.Meta.fields, "warnings"]

    @extend_schema_field(IssueOut(many=True))
    def get_warnings(self, version: AutomationVersion) -> list[dict[str, str | None]]:
        return [issue.as_dict() for issue in definition_warnings(version.definition)]


class VersionSummaryOut(serializers.ModelSerializer):
    class Meta:
        model = AutomationVersion
        fields = ["number", "digest", "published_at"]


class AutomationOut(serializers.ModelSerializer):
    current_version = VersionSummaryOut(allow_null=True)

    class Meta:
        model = Automation
        fields = ["slug", "name", "created_at", "current_version"]


# What a field of a request body must be in JSON, as the schema says (type: string, boolean,
# integer, ...). DRF would coerce: 0 to "0" for a CharField, 0 and "yes" to False for a
# BooleanField, "5" to 5 for an IntegerField; a client reading the schema would never send
# those, and one that does has a bug worth a 400.
_JSON_TYPES: list[tuple[type[serializers.Field], tuple[type, ...], str]] = [
    (serializers.BooleanField, (bool,), "true or false"),
    (serializers.IntegerField, (int,), "a whole number"),
    (serializers.FloatField, (int, float), "a number"),
    (serializers.CharField, (str,), "a string"),
    (serializers.ChoiceField, (str,), "a string"),
    (serializers.ListField, (list,), "a list"),
    (serializers.DictField, (dict,), "a JSON object"),
]


def json_type_problem(field: serializers.Field, value: Any) -> str | None:
    """Why ``value``, as parsed from JSON, is not of the type ``field`` declares (a list's
    items and an object's values too), or None. Null is the field's own business
    (``allow_null``)."""
    if value is None:
        return None
    for cls, types, words in _JSON_TYPES:
        if isinstance(field, cls):
            if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
                return f"Must be {words}."
            break
    if isinstance(field, serializers.ListField):
        return next(filter(None, (json_type_problem(field.child, item) for item in value)), None)
    if isinstance(field, serializers.DictField):
        values = (json_type_problem(field.child, item) for item in value.values())
        return next(filter(None, values), None)
    return None


def type_errors(serializer: serializers.Serializer, data: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``data`` whose JSON type is not their field's, with why."""
    found = {}
    for name, field in serializer.fields.items():
        problem = json_type_problem(field, data[name]) if name in data else None
        if problem is not None:
            found[name] = [problem]
    return found


class TypedInput(serializers.Serializer):
    """A request body whose fields take only their JSON type (see json_type_problem), but
    that may carry fields it does not take (StrictInput refuses those too)."""

    def to_internal_value(self, data: Any) -> Any:
        errors = type_errors(self, data) if isinstance(data, dict) else {}
        if errors:
            raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


@extend_schema_field({"type": "object", "additionalProperties": {}})
class JsonObjectField(serializers.JSONField):
    """A JSON object (a run's input, a connection's options): anything else is refused."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError("Must be a JSON object.")
        return super().to_internal_value(data)


class StrictInput(serializers.Serializer):
    """A request body that refuses fields it does not take (a misspelt ``max_concurency``
    would otherwise be ignored, and the client would believe it was set; a misspelt
    ``start_kye`` would start a run without the key that makes a retry safe) and anything but
    a JSON object. Checked where the data arrives, so a nested object (a signal's ``start``)
    is checked too. The other apps' APIs use it too."""

    def unknown_message(self, name: str) -> str:
        return f"Unknown field; this takes: {', '.join(self.fields)}."

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": ["The body must be a JSON object."]}
            )
        # Both kinds of error in one answer: a bare definition sent without its "definition"
        # wrapper is told that field is required as well as that its keys are unknown.
        errors: dict[str, Any] = {
            name: [self.unknown_message(name)] for name in sorted(set(data) - set(self.fields))
        }
        errors |= type_errors(self, data)
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as error:
            if not isinstance(error.detail, dict):
                raise
            errors = {**cast(dict[str, Any], error.detail), **errors}
        if errors:
            raise serializers.ValidationError(errors)
        return value


class AutomationIn(StrictInput):
    slug = serializers.SlugField(max_length=63)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)


class DefinitionIn(StrictInput):
    definition = JsonObjectField(help_text="The definition (docs/definitions.md).")


# Start keys the engine makes itself: a client may not take them ahead of time (a scheduled
# occurrence whose key was taken would count as started; a key derived from an input would
# collide with the start that derived it).
RESERVED_START_KEY_PREFIXES = ("schedule:", DERIVED_KEY_PREFIX)


def check_client_start_key(value: str) -> str:
    if value.startswith(RESERVED_START_KEY_PREFIXES):
        reserved = ", ".join(f'"{p}"' for p in RESERVED_START_KEY_PREFIXES)
        raise serializers.ValidationError(f"start keys starting with {reserved} are reserved")
    return value


_NOT_RESERVED = "|".join(re.escape(prefix) for prefix in RESERVED_START_KEY_PREFIXES)


@extend_schema_field(
    {"type": "string", "minLength": 1, "maxLength": MAX_START_KEY,
     "pattern": rf"^(?!{_NOT_RESERVED})[\s\S]*$"}
)  # fmt: skip
class StartKeyField(serializers.CharField):
    """A client's start key: kept exactly as sent (trimming would let two different keys
    collide), none of the reserved prefixes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=MAX_START_KEY, trim_whitespace=False, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        return check_client_start_key(super().to_internal_value(data))


class RunStartIn(StrictInput):
    automation = serializers.SlugField(max_length=63)
    start_key = StartKeyField(required=False)
    input = JsonObjectField(required=False, default=dict)


class RunEventOut(serializers.ModelSerializer):
    # No `worker`: it names the engine's host and process id (host:pid:lane), which tenants
    # have no use for and should not learn; the admin shows it. Who acted is `by`.
    by = serializers.SerializerMethodField(
        help_text="Who caused it, when a person, an API key or a command did: "
        "`api_key:<prefix>`, `admin:<user>`, `slack:<user>`, `command:<os user>` (a run "
        "cancelled, paused, resumed or retried, an approval decided, an effect resolved, a "
        "connection repaired). Null for the engine's own events."
    )

    class Meta:
        model = RunEvent
        fields = ["id", "kind", "step_id", "iteration", "attempt", "by", "detail", "at"]

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_by(self, event: RunEvent) -> str | None:
        by = event.detail.get("by") if isinstance(event.detail, dict) else None
        return str(by) if by else None


class RunLinksOut(serializers.Serializer):
    self = serializers.CharField()
    steps = serializers.CharField(help_text="Every step, paginated.")
    history = serializers.CharField(help_text="Every history event, paginated.")


def run_links(run_id: int) -> dict[str, str]:
    base = f"/api/v1/runs/{run_id}"
    return {"self": base, "steps": f"{base}/steps", "history": f"{base}/history"}


class RunStartedOut(serializers.Serializer):
    """What a start answers: the run's id and status, and where to read the rest. Not its
    whole detail: a start should cost a transaction, not a serialisation of its history."""

    id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=RunStatus.choices)
    created = serializers.BooleanField(help_text="False: this start key already started it.")
    start_key = serializers.CharField()
    links = RunLinksOut()


class RunOut(serializers.ModelSerializer):
    automation = serializers.CharField(source="automation.slug")
    version = serializers.IntegerField(source="version.number")

    class Meta:
        model = Run
        fields = [
            "id", "automation", "version", "start_key", "start_key_derived", "status", "input",
            "output", "error", "steps_executed", "max_steps", "deadline_at", "created_at",
            "finished_at",
        ]  # fmt: skip


class StepOut(serializers.ModelSerializer):
    """A step. Give ``steps_out`` the steps of a page: what the waiting ones wait on is read
    for all of them at once (``context["waits"]``, by step row id)."""

    waiting_on = serializers.SerializerMethodField(
        help_text="A waiting step: what it waits on, in words (a signal and its key, an "
        "effect in review with its full key, a timer's intent and instant, an approval and "
        "who decides it, a retry's backoff), and when time wakes it. Null otherwise."
    )
    waiting_on_link = serializers.SerializerMethodField(
        help_text="Where this API shows what it waits on (`/api/v1/effects/12`, "
        "`/api/v1/approvals/7`, `/api/v1/signals?name=…`), when it does."
    )

    # No `owner` either: it is the claiming worker's host:pid:lane (see RunEventOut).
    class Meta:
        model = Step
        fields = [
            "step_id", "iteration", "type", "lane", "status", "attempt", "max_attempts",
            "lease_until", "wait_kind", "wake_at", "wait_detail", "waiting_on",
            "waiting_on_link", "output", "error", "created_at", "finished_at",
        ]  # fmt: skip

    def _wait(self, step: Step) -> WaitDescription | None:
        waits = self.context.get("waits")
        if waits is None:  # one step on its own
            waits = describe_waits([step])
        return cast(WaitDescription | None, waits.get(step.pk))

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_waiting_on(self, step: Step) -> str | None:
        wait = self._wait(step)
        return wait.text if wait is not None else None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_waiting_on_link(self, step: Step) -> str | None:
        wait = self._wait(step)
        return wait.api_path if wait is not None else None


def steps_out(steps: Iterable[Step]) -> Any:
    """The steps as StepOut renders them, what they wait on read for all at once."""
    rows = list(steps)
    return StepOut(rows, many=True, context={"waits": describe_waits(rows)}).data


DETAIL_PAGE = 100  # steps and events shown inline in a run's detail; the rest by link


class RunDetailOut(RunOut):
    """A run with its first steps and history events; `links` page through the rest."""

    steps = serializers.SerializerMethodField()
    history = serializers.SerializerMethodField()
    links = serializers.SerializerMethodField()

    class Meta(RunOut.Meta):
        fields = [*RunOut.Meta.fields, "vars", "steps", "history", "links"]

    @extend_schema_field(StepOut(many=True))
    def get_steps(self, run: Run) -> Any:
        return steps_out(run.steps.order_by("id")[:DETAIL_PAGE])

    @extend_schema_field(RunEventOut(many=True))
    def get_history(self, run: Run) -> Any:
        return RunEventOut(run.events.order_by("id")[:DETAIL_PAGE], many=True).data

    @extend_schema_field(RunLinksOut)
    def get_links(self, run: Run) -> dict[str, str]:
        return run_links(run.pk)


class ApiRootOut(serializers.Serializer):
    automations = serializers.URLField()
    runs = serializers.URLField()
    schema = serializers.URLField(help_text="The OpenAPI schema.")
    docs = serializers.URLField(help_text="The schema as a browsable page.")


class ErrorOut(serializers.Serializer):
    code = serializers.CharField(help_text="Stable, machine-readable error code.")
    detail = serializers.CharField(help_text="What went wrong, for people.")
    # The serializer metaclass pops declared fields off the class, so this does not shadow
    # Serializer.errors at runtime; the stubs see a plain class attribute.
    errors = serializers.JSONField(  # type: ignore[assignment]
        required=False, help_text="Per-field or per-step problems."
    )


class RunActionOut(serializers.Serializer):
    id = serializers.IntegerField()
    action = serializers.ChoiceField(choices=["cancel", "pause", "resume", "retry"])
    status = serializers.ChoiceField(choices=RunStatus.choices)
    steps_changed = serializers.IntegerField(help_text="Steps the action cancelled, parked, "
                                             "made ready or retried.")  # fmt: skip


class RunBulkIn(StrictInput):
    status = serializers.ChoiceField(
        choices=RunStatus.choices,
        required=False,
        error_messages={"invalid_choice": f"must be one of {', '.join(RunStatus.values)}"},
    )
    automation = serializers.SlugField(max_length=63, required=False)
    dry_run = serializers.BooleanField(
        default=True, help_text="Only count the runs the action would apply to (the default)."
    )


class RunBulkOut(serializers.Serializer):
    action = serializers.CharField()
    matched = serializers.IntegerField(help_text="Runs the filter matches that the action "
                                       "applies to (at most 1000 per call).")  # fmt: skip
    changed = serializers.IntegerField()
    skipped = serializers.IntegerField(help_text="Matched, but changed meanwhile.")
    more = serializers.BooleanField(help_text="More runs match: call again.")
    dry_run = serializers.BooleanField()
