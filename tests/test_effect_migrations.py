"""Data migrations of the effects app, run forwards on rows written as older code wrote them."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("effects", "0004_connection_checks_egress_created")]
AFTER = [("effects", "0005_suppressions_as_mailboxes")]


def _migrate_to_latest() -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


def _migrate(targets: list[tuple[str, str]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


def test_suppressions_written_with_a_name_become_the_mailbox_they_name() -> None:
    apps = _migrate(BEFORE).loader.project_state(BEFORE).apps
    try:
        org = apps.get_model("workflows", "Organisation").objects.create(name="o", slug="o")
        Suppression = apps.get_model("effects", "Suppression")
        for address, channel in [
            ("Ann <Ann@Example.com>", "email"),  # matched nobody before
            ("bob@example.com", "email"),
            ('"Bob" <BOB@example.com>', "email"),  # the same mailbox as the row above
            ("#Ops", "slack"),
        ]:
            Suppression.objects.create(org=org, address=address, channel=channel, reason=address)
        _migrate(AFTER)
    finally:
        _migrate_to_latest()  # the test database's state: every app's newest migration

    from effects.models import Suppression as Now

    kept = sorted(Now.objects.values_list("address", "channel", "reason"))
    assert kept == [
        ("#ops", "slack", "#Ops"),
        ("ann@example.com", "email", "Ann <Ann@Example.com>"),
        ("bob@example.com", "email", "bob@example.com"),  # the older entry stays
    ]
