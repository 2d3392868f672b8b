"""The relay in-process: batches, duplicates on a crash, cleanup of sent rows."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from workflows.engine.relay import cleanup_sent, relay_once
from workflows.engine.transport import Message
from workflows.models import Outbox

pytestmark = pytest.mark.django_db


class Recorder:
    def __init__(self) -> None:
        self.published: list[list[Message]] = []

    def publish(self, messages: Any) -> None:
        self.published.append(list(messages))

    def subscribe(self, *args: Any) -> None:  # pragma: no cover - not used here
        raise NotImplementedError


def _outbox(org, count: int, lane: str = "io") -> list[int]:
    rows = [
        Outbox(org=org, topic="lane.wake", payload={"lane": lane, "run": i}) for i in range(count)
    ]
    return [row.pk for row in Outbox.objects.bulk_create(rows)]


def test_relay_publishes_with_outbox_ids_and_marks_sent(org) -> None:
    ids = _outbox(org, 5)
    transport = Recorder()
    assert relay_once(transport, batch=3) == 3
    assert relay_once(transport, batch=3) == 2
    assert relay_once(transport, batch=3) == 0
    assert [[m.id for m in batch] for batch in transport.published] == [ids[:3], ids[3:]]
    assert transport.published[0][0].payload == {"lane": "io", "run": 0}
    assert not Outbox.objects.filter(sent_at=None).exists()


def test_a_failed_publish_leaves_rows_unsent(org) -> None:
    _outbox(org, 2)

    class Broken(Recorder):
        def publish(self, messages: Any) -> None:
            raise ConnectionError("broker down")

    with pytest.raises(ConnectionError):
        relay_once(Broken())
    assert Outbox.objects.filter(sent_at=None).count() == 2
    assert relay_once(Recorder()) == 2


def test_cleanup_deletes_only_old_sent_rows(org) -> None:
    old, recent, unsent = _outbox(org, 3)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workflows_outbox SET sent_at = now() - interval '2 hours' WHERE id = %s", [old]
        )
        cursor.execute("UPDATE workflows_outbox SET sent_at = now() WHERE id = %s", [recent])
    assert cleanup_sent(older_than_seconds=3600) == 1
    assert sorted(Outbox.objects.values_list("pk", flat=True)) == [recent, unsent]


def test_cleanup_keeps_deleting_batches_until_done(org) -> None:
    ids = _outbox(org, 7)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workflows_outbox SET sent_at = now() - interval '2 hours' WHERE id = ANY(%s)",
            [ids],
        )
    assert cleanup_sent(older_than_seconds=3600, batch=2) == 7
    assert not Outbox.objects.exists()
