"""Reads, always scoped to one organisation."""

from __future__ import annotations

from django.db.models import QuerySet

from .errors import UnknownAutomation, UnknownOrganisation, UnknownVersion
from .models import Automation, AutomationVersion, Organisation


def organisation_get(*, slug: str) -> Organisation:
    try:
        return Organisation.objects.get(slug=slug)
    except Organisation.DoesNotExist as exc:
        raise UnknownOrganisation(slug=slug) from exc


def automation_list(*, org: Organisation) -> QuerySet[Automation]:
    return Automation.objects.filter(org=org).select_related("current_version")


def automation_get(*, org: Organisation, slug: str) -> Automation:
    try:
        return automation_list(org=org).get(slug=slug)
    except Automation.DoesNotExist as exc:
        raise UnknownAutomation(slug=slug) from exc


def version_get(*, automation: Automation, number: int) -> AutomationVersion:
    try:
        return AutomationVersion.objects.get(
            org_id=automation.org_id, automation=automation, number=number
        )
    except AutomationVersion.DoesNotExist as exc:
        raise UnknownVersion(slug=automation.slug, number=number) from exc
