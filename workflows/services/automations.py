"""Use cases for automations and their versions. Each function owns its transaction."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.db.models.functions import Now

from ..definitions.validator import InvalidDefinition, definition_digest, ensure_valid
from ..errors import (
    AlreadyPublished,
    AutomationExists,
    InvalidDefinitionError,
    VersionPublished,
)
from ..models import Automation, AutomationVersion, Organisation
from ..models.automations import definition_text_of
from . import quotas
from .audit import Actor, record_audit
from .naming import check_slug_and_name


def _validated(definition: Any, *, for_publish: bool = False) -> str:
    """Validate a definition and return its digest; raise InvalidDefinitionError otherwise."""
    try:
        ensure_valid(definition, for_publish=for_publish)
    except InvalidDefinition as exc:
        raise InvalidDefinitionError([issue.as_dict() for issue in exc.issues]) from exc
    return definition_digest(definition)


def automation_create(*, org: Organisation, slug: str, name: str = "") -> Automation:
    check_slug_and_name(Automation, slug=slug, name=name)
    try:
        with transaction.atomic():
            quotas.lock_organisation(org)
            quotas.check_automations(org)
            return Automation.objects.create(org=org, slug=slug, name=name or slug)
    except IntegrityError as exc:
        raise AutomationExists(slug=slug) from exc


def version_create_draft(*, automation: Automation, definition: Any) -> AutomationVersion:
    """Add the next-numbered draft version. Numbers are dense and never reused."""
    digest = _validated(definition)
    with transaction.atomic():
        quotas.lock_organisation(automation.org)
        quotas.check_versions(automation.org)
        # Lock the automation row so two concurrent drafts cannot take the same number.
        Automation.objects.select_for_update().filter(pk=automation.pk).get()
        latest = automation.versions.aggregate(n=Max("number"))["n"] or 0
        return AutomationVersion.objects.create(
            org_id=automation.org_id,
            automation=automation,
            number=latest + 1,
            definition=definition,
            definition_text=definition_text_of(definition),
            digest=digest,
        )


def version_update_draft(*, version: AutomationVersion, definition: Any) -> AutomationVersion:
    digest = _validated(definition)
    with transaction.atomic():
        changed = AutomationVersion.objects.filter(pk=version.pk, published_at__isnull=True).update(
            definition=definition, definition_text=definition_text_of(definition), digest=digest
        )
        if changed != 1:
            raise VersionPublished(version=version.number)
    version.refresh_from_db()
    return version


def version_publish(*, version: AutomationVersion, actor: Actor | None = None) -> AutomationVersion:
    """Publish a draft: from now on it is immutable and new runs start on it. Audited
    (``automation.publish``) as ``actor``; None: Waymark itself (the demo, scripts)."""
    _validated(version.definition, for_publish=True)
    with transaction.atomic():
        # Lock the automation row first: concurrent publishes of one automation take turns,
        # and each reads the current version only once the one before it has committed.
        # Without it, the UPDATE below waits on the row, then re-checks only the row itself:
        # its subquery keeps the old snapshot, so an older version could overwrite a newer one.
        Automation.objects.select_for_update().filter(pk=version.automation_id).get()
        changed = AutomationVersion.objects.filter(pk=version.pk, published_at__isnull=True).update(
            published_at=Now()
        )
        if changed != 1:
            version.refresh_from_db()
            raise AlreadyPublished(version=version.number, published_at=version.published_at)
        # Newer versions win even if an older draft is published later.
        became_current = (
            Automation.objects.filter(pk=version.automation_id)
            .exclude(current_version__number__gt=version.number)
            .update(current_version=version)
        )
        record_audit(
            org=version.org_id, actor=actor or Actor.system(), action="automation.publish",
            target_type="automation", target_id=version.automation.slug,
            detail={"version": version.number, "digest": version.digest,
                    "current": bool(became_current)},
        )  # fmt: skip
    version.refresh_from_db()
    return version


def automation_publish_definition(
    *, org: Organisation, slug: str, definition: Any, name: str = "", actor: Actor | None = None
) -> AutomationVersion:
    """Create the automation if needed and publish ``definition`` unless it is already current.

    Used by the demo bootstrap and ``manage.py publish_automation``: publishing the same
    definition twice returns the current version instead of making an identical new one. All
    of it or nothing: a definition refused leaves no automation it created behind.
    """
    with transaction.atomic():
        return _publish_definition(org, slug, definition, name, actor)


def _publish_definition(
    org: Organisation, slug: str, definition: Any, name: str, actor: Actor | None
) -> AutomationVersion:
    automation = Automation.objects.filter(org=org, slug=slug).first()
    if automation is None:
        try:
            automation = automation_create(org=org, slug=slug, name=name)
        except AutomationExists:  # created by a concurrent call meanwhile
            automation = Automation.objects.get(org=org, slug=slug)
    current = automation.current_version
    if current is not None and current.digest == definition_digest(definition):
        return current
    draft = version_create_draft(automation=automation, definition=definition)
    return version_publish(version=draft, actor=actor)
