"""Input and output shapes of the API. Inputs validate shape only; services validate meaning."""

from __future__ import annotations

from rest_framework import serializers

from ..models import Automation, AutomationVersion


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
