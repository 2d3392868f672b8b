"""Automations and their immutable versions.

A version is a draft until it is published; from then on it never changes. The model layer
refuses to save or delete a published version, and a database trigger (migration 0002)
refuses the same for any UPDATE or DELETE that bypasses the model, so a run can always find
the exact steps it started on.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import models

from ..errors import VersionPublished


class Automation(models.Model):
    org = models.ForeignKey("workflows.Organisation", on_delete=models.PROTECT)
    slug = models.SlugField(max_length=63)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    # The newest published version: new runs start on it. Set only by version_publish.
    current_version = models.ForeignKey(
        "workflows.AutomationVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )

    class Meta:
        ordering = ["org", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["org", "slug"], name="automation_slug_per_org"),
        ]

    def __str__(self) -> str:
        return self.slug


class AutomationVersion(models.Model):
    org = models.ForeignKey("workflows.Organisation", on_delete=models.PROTECT)
    automation = models.ForeignKey(Automation, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    definition = models.JSONField()
    # The document as its author wrote it, keys in their order (``type`` beside ``id``, not
    # where jsonb's own order puts it): what the admin and the API show. The engine reads
    # ``definition``. Empty for none (a row no code of ours wrote).
    definition_text = models.TextField(blank=True, default="")
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["automation", "-number"]
        constraints = [
            models.UniqueConstraint(
                fields=["automation", "number"], name="automation_version_number"
            ),
        ]
        indexes = [models.Index(fields=["org", "automation", "published_at"])]

    def __str__(self) -> str:
        return f"{self.automation.slug} v{self.number}"

    def document(self) -> Any:
        """The definition with its keys in the order written (``definition_text``), else
        as jsonb keeps it."""
        if self.definition_text:
            return json.loads(self.definition_text)
        return self.definition

    @property
    def is_published(self) -> bool:
        return self.published_at is not None

    def _guard_published(self) -> None:
        # Ask the database, not this instance: a stale or hand-built instance must not be
        # able to overwrite a version that was published meanwhile.
        if self.pk is None:  # unsaved (the stubs type pk as never None)
            return  # type: ignore[unreachable]
        stored = AutomationVersion.objects.filter(pk=self.pk, published_at__isnull=False)
        if stored.exists():
            raise VersionPublished(version=self.number)

    def save(self, *args: Any, **kwargs: Any) -> None:
        self._guard_published()
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        self._guard_published()
        return super().delete(*args, **kwargs)


def definition_text_of(definition: Any) -> str:
    """A definition as it is kept in ``definition_text``: its keys in the order given (the
    order a client sent them in: JSON objects are read into ordered dicts), indented."""
    return json.dumps(definition, ensure_ascii=False, indent=2)
