"""Concurrent publishes (the admin's publish action, the API, the command) on real connections:
the newest published version is always the automation's current one."""

from __future__ import annotations

import pytest

from workflows.models import Automation, AutomationVersion
from workflows.services.automations import version_create_draft, version_publish

from .concurrency import race
from .factories import AutomationFactory, linear_definition

ROUNDS = 20
PUBLISHERS = 4  # versions n .. n+3 published at once, each round


@pytest.mark.django_db(transaction=True)
def test_racing_publishes_never_leave_an_older_version_current() -> None:
    automation = AutomationFactory.create()
    wrong = []
    for round_number in range(ROUNDS):
        drafts = [
            version_create_draft(automation=automation, definition=linear_definition(f"r{n}"))
            for n in range(PUBLISHERS)
        ]

        def publish(i: int, drafts: list[AutomationVersion] = drafts) -> AutomationVersion:
            return version_publish(version=drafts[i])

        results = race(PUBLISHERS, publish)

        assert not [r for r in results if isinstance(r, Exception)], results
        current = Automation.objects.get(pk=automation.pk).current_version
        assert current is not None
        if current.number != drafts[-1].number:
            wrong.append((round_number, current.number, drafts[-1].number))
    assert not wrong, f"(round, current, newest) where an older version stayed current: {wrong}"
