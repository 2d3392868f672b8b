"""Input and output shapes of the API. Inputs validate shape only; services validate meaning."""

from __future__ import annotations

from rest_framework import serializers

from ..models import Automation, AutomationVersion, Run, RunEvent, Step
from ..states import RunStatus


class VersionOut(serializers.ModelSerializer):
    automation = serializers.CharField(source="automation.slug")

    class Meta:
        model = AutomationVersion
        fields = ["automation", "number", "digest", "definition", "created_at", "published_at"]


class VersionSummaryOut(serializers.ModelSerializer):
    class Meta:
        model = AutomationVersion
        fields = ["number", "digest", "published_at"]


class AutomationOut(serializers.ModelSerializer):
    current_version = VersionSummaryOut(allow_null=True)

    class Meta:
        model = Automation
        fields = ["slug", "name", "created_at", "current_version"]


class AutomationIn(serializers.Serializer):
    slug = serializers.SlugField(max_length=63)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)


class DefinitionIn(serializers.Serializer):
    definition = serializers.JSONField()


class RunStartIn(serializers.Serializer):
    automation = serializers.SlugField(max_length=63)
    # Kept exactly as sent: trimming would let two different keys collide.
    start_key = serializers.CharField(
        max_length=255, required=False, allow_blank=False, trim_whitespace=False
    )
    input = serializers.JSONField(required=False, default=dict)


class StepOut(serializers.ModelSerializer):
    class Meta:
        model = Step
        fields = [
            "step_id", "iteration", "type", "lane", "status", "attempt", "max_attempts",
            "owner", "lease_until", "output", "error", "created_at", "finished_at",
        ]  # fmt: skip


class RunEventOut(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["id", "kind", "step_id", "iteration", "attempt", "worker", "detail", "at"]


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


class RunDetailOut(RunOut):
    steps = StepOut(many=True)
    history = RunEventOut(many=True, source="events")

    class Meta(RunOut.Meta):
        fields = [*RunOut.Meta.fields, "vars", "steps", "history"]


class AutomationListOut(serializers.Serializer):
    results = AutomationOut(many=True)


class VersionListOut(serializers.Serializer):
    results = VersionOut(many=True)


class ErrorOut(serializers.Serializer):
    code = serializers.CharField(help_text="Stable, machine-readable error code.")
    detail = serializers.CharField(help_text="What went wrong, for people.")
    errors = serializers.JSONField(required=False, help_text="Per-field or per-step problems.")


class RunFilterIn(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=RunStatus.values,
        required=False,
        error_messages={"invalid_choice": f"must be one of {', '.join(RunStatus.values)}"},
    )
    automation = serializers.SlugField(max_length=63, required=False)


class RunPageOut(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = RunOut(many=True)
