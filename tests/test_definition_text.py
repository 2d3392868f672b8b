"""A version reads back as it was written: its keys in their order (jsonb keeps its own),
through the API and in the admin, drafts and published versions alike; versions stored
before the text was kept get it from their jsonb."""

from __future__ import annotations

import json
from html import unescape

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from rest_framework.test import APIClient

from workflows.models import AutomationVersion

# Keys in an order jsonb does not keep (it sorts shorter keys first): type before id, the
# step's own fields before next, a description at the end.
WRITTEN: dict = {
    "start": "greet",
    "steps": [
        {"type": "set", "id": "greet", "values": {"zeta": "z", "alpha": "a"}, "next": "done"},
        {"type": "end", "id": "done", "output": {"second": 2, "first": 1}},
    ],
    "description": "keys in the order written",
}


def keys_in_order(value: object) -> list:
    """Every object's keys, depth first, in order: equal lists mean equal key orders."""
    if isinstance(value, dict):
        return [[*value], *(keys_in_order(v) for v in value.values())]
    if isinstance(value, list):
        return [keys_in_order(v) for v in value]
    return []


@pytest.mark.django_db
def test_a_definition_reads_back_with_its_keys_in_the_order_written(api: APIClient) -> None:
    assert api.post("/api/v1/automations", {"slug": "greet"}, format="json").status_code == 201
    created = api.post("/api/v1/automations/greet/versions", {"definition": WRITTEN},
                       format="json").json()  # fmt: skip
    assert keys_in_order(created["definition"]) == keys_in_order(WRITTEN)

    # jsonb, what the engine reads, has its own order: the text is what keeps the author's.
    stored = AutomationVersion.objects.get(number=created["number"])
    assert keys_in_order(stored.definition) != keys_in_order(WRITTEN)
    assert stored.definition == WRITTEN

    changed = {**WRITTEN, "description": "changed"}
    api.put("/api/v1/automations/greet/versions/1", {"definition": changed}, format="json")
    api.post("/api/v1/automations/greet/versions/1/publish")
    read = api.get("/api/v1/automations/greet/versions/1")
    assert read.json()["definition"] == changed
    assert keys_in_order(read.json()["definition"]) == keys_in_order(changed)
    raw = read.content.decode()
    assert raw.index('"type":"set"') < raw.index('"id":"greet"')  # as sent, type first
    listed = api.get("/api/v1/automations/greet/versions").json()["results"][0]
    assert keys_in_order(listed["definition"]) == keys_in_order(changed)


@pytest.mark.django_db
def test_the_admin_shows_a_published_version_as_written(
    api: APIClient, admin_client: Client
) -> None:
    api.post("/api/v1/automations", {"slug": "greet"}, format="json")
    api.post("/api/v1/automations/greet/versions", {"definition": WRITTEN}, format="json")
    api.post("/api/v1/automations/greet/versions/1/publish")
    version = AutomationVersion.objects.get()

    html = unescape(
        admin_client.get(
            f"/admin/workflows/automationversion/{version.pk}/change/"
        ).content.decode()
    )

    assert json.dumps(WRITTEN, indent=2) in html


# --- versions stored before the text was kept ---------------------------------------------------

BEFORE = [("workflows", "0025_run_search")]
AFTER = [("workflows", "0026_version_definition_text")]


def _migrate(targets: list[tuple[str, str]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


def _migrate_to_latest() -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_versions_stored_before_get_their_text_from_jsonb_and_stay_immutable() -> None:
    apps = _migrate(BEFORE).loader.project_state(BEFORE).apps
    try:
        org = apps.get_model("workflows", "Organisation").objects.create(name="o", slug="o")
        automation = apps.get_model("workflows", "Automation").objects.create(
            org=org, slug="old", name="old"
        )
        Version = apps.get_model("workflows", "AutomationVersion")
        for number, published_at in ((1, "2024-01-01T00:00:00Z"), (2, None)):
            Version.objects.create(
                org=org, automation=automation, number=number, definition=WRITTEN,
                digest="d", published_at=published_at,
            )  # fmt: skip
        _migrate(AFTER)
    finally:
        _migrate_to_latest()  # the test database's state: every app's newest migration

    for version in AutomationVersion.objects.order_by("number"):
        assert json.loads(version.definition_text) == WRITTEN  # jsonb's order: all there is
        assert version.document() == WRITTEN
    first = AutomationVersion.objects.get(number=1)
    with pytest.raises(DatabaseError, match="is published and cannot change"), transaction.atomic():
        AutomationVersion.objects.filter(pk=first.pk).update(definition_text="{}")
