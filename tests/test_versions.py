"""Published versions never change: in the model layer and in the database itself."""

from __future__ import annotations

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction

from workflows.errors import AlreadyPublished, InvalidDefinitionError, VersionPublished
from workflows.models import Automation, AutomationVersion
from workflows.services.automations import (
    version_create_draft,
    version_publish,
    version_update_draft,
)

from .concurrency import race
from .factories import AutomationFactory, linear_definition

pytestmark = pytest.mark.django_db


def _sqlstate(exc: BaseException) -> str | None:
    cause = exc.__cause__
    return cause.sqlstate if isinstance(cause, psycopg.Error) else None


@pytest.fixture
def published() -> AutomationVersion:
    draft = version_create_draft(
        automation=AutomationFactory.create(), definition=linear_definition("a")
    )
    return version_publish(version=draft)


def test_draft_can_change_until_published() -> None:
    draft = version_create_draft(
        automation=AutomationFactory.create(), definition=linear_definition("a")
    )
    old_digest = draft.digest
    version_update_draft(version=draft, definition=linear_definition("a", "b"))
    stored = AutomationVersion.objects.get(pk=draft.pk)
    assert [s["id"] for s in stored.definition["steps"]] == ["a", "b", "finish"]
    assert stored.digest != old_digest


def test_model_refuses_saving_a_published_version(published: AutomationVersion) -> None:
    published.definition = linear_definition("x")
    with pytest.raises(VersionPublished):
        published.save()
    fresh = AutomationVersion.objects.get(pk=published.pk)
    with pytest.raises(VersionPublished):
        fresh.save(update_fields=["definition"])
    assert AutomationVersion.objects.get(pk=published.pk).definition == linear_definition("a")


def test_model_refuses_deleting_a_published_version(published: AutomationVersion) -> None:
    fresh = AutomationVersion.objects.get(pk=published.pk)
    with pytest.raises(VersionPublished):
        fresh.delete()
    assert AutomationVersion.objects.filter(pk=published.pk).exists()


def test_database_refuses_queryset_update_of_a_published_version(
    published: AutomationVersion,
) -> None:
    # QuerySet.update() bypasses save(): only the trigger stands in the way.
    with pytest.raises(DatabaseError) as caught, transaction.atomic():
        AutomationVersion.objects.filter(pk=published.pk).update(definition={"start": "x"})
    assert _sqlstate(caught.value) == "WM001"
    assert AutomationVersion.objects.get(pk=published.pk).definition == linear_definition("a")


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE workflows_automationversion SET definition = '{}'::jsonb WHERE id = %s",
        "UPDATE workflows_automationversion SET published_at = NULL WHERE id = %s",
        "UPDATE workflows_automationversion SET number = number + 100 WHERE id = %s",
        "DELETE FROM workflows_automationversion WHERE id = %s",
    ],
)
def test_database_refuses_raw_sql_changes(published: AutomationVersion, statement: str) -> None:
    with pytest.raises(DatabaseError) as caught, transaction.atomic(), connection.cursor() as cur:
        cur.execute(statement, [published.pk])
    assert _sqlstate(caught.value) == "WM001"
    row = AutomationVersion.objects.get(pk=published.pk)
    assert (row.number, row.published_at) == (published.number, published.published_at)


def test_database_allows_changing_drafts() -> None:
    draft = version_create_draft(
        automation=AutomationFactory.create(), definition=linear_definition("a")
    )
    AutomationVersion.objects.filter(pk=draft.pk).update(definition=linear_definition("z"))
    assert AutomationVersion.objects.get(pk=draft.pk).definition == linear_definition("z")
    AutomationVersion.objects.filter(pk=draft.pk).delete()
    assert not AutomationVersion.objects.filter(pk=draft.pk).exists()


def test_updating_a_published_version_through_the_service_is_refused(
    published: AutomationVersion,
) -> None:
    with pytest.raises(VersionPublished) as caught:
        version_update_draft(version=published, definition=linear_definition("b"))
    assert caught.value.code == "version_published"


def test_publishing_twice_is_refused(published: AutomationVersion) -> None:
    with pytest.raises(AlreadyPublished) as caught:
        version_publish(version=published)
    assert caught.value.code == "already_published"


def test_publish_sets_current_version_and_newer_wins() -> None:
    automation = AutomationFactory.create()
    v1 = version_create_draft(automation=automation, definition=linear_definition("a"))
    v2 = version_create_draft(automation=automation, definition=linear_definition("b"))
    assert (v1.number, v2.number) == (1, 2)
    version_publish(version=v2)
    version_publish(version=v1)  # an older draft published later does not become current
    assert Automation.objects.get(pk=automation.pk).current_version_id == v2.pk


def test_invalid_definition_writes_nothing() -> None:
    automation = AutomationFactory.create()
    with pytest.raises(InvalidDefinitionError) as caught:
        version_create_draft(automation=automation, definition={"start": "nope", "steps": []})
    assert caught.value.code == "invalid_definition"
    assert caught.value.issues
    assert not AutomationVersion.objects.filter(automation=automation).exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_publish_has_exactly_one_winner() -> None:
    draft = version_create_draft(
        automation=AutomationFactory.create(), definition=linear_definition("a")
    )

    def publish(_: int) -> str:
        try:
            version_publish(version=AutomationVersion.objects.get(pk=draft.pk))
        except AlreadyPublished:
            return "already"
        return "published"

    assert sorted(race(6, publish)) == ["already"] * 5 + ["published"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_drafts_get_distinct_numbers() -> None:
    automation = AutomationFactory.create()
    versions = race(
        5, lambda _: version_create_draft(automation=automation, definition=linear_definition("a"))
    )
    assert sorted(version.number for version in versions) == [1, 2, 3, 4, 5]
