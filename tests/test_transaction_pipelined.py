"""rows.transaction_pipelined: BEGIN, statements and COMMIT in one round trip, as one
transaction that commits whole or not at all, on the engine's own (autocommit) connection."""

from __future__ import annotations

import pytest
from django.db import DataError, connection

from workflows.engine.sql.rows import transaction_pipelined

ADD = (
    "INSERT INTO workflows_outbox (org_id, topic, payload, created_at)"
    " VALUES (%(org)s, %(topic)s, '{}', now()) RETURNING id"
)


def topics() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT topic FROM workflows_outbox ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)  # no test transaction around it: the engine's way
def test_the_statements_commit_together_and_a_failure_writes_none_of_them(org) -> None:
    with connection.cursor() as cursor:
        first, second = transaction_pipelined(
            cursor, [(ADD, {"org": org.pk, "topic": "one"}), (ADD, {"org": org.pk, "topic": "two"})]
        )
    assert len(first) == len(second) == 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT xmin::text) FROM workflows_outbox WHERE id = ANY(%s)",
            [[first[0]["id"], second[0]["id"]]],
        )
        assert cursor.fetchone()[0] == 1  # one transaction

    with pytest.raises(DataError), connection.cursor() as cursor:
        transaction_pipelined(
            cursor, [(ADD, {"org": org.pk, "topic": "three"}), ("SELECT 1 / %(zero)s", {"zero": 0})]
        )
    # Rolled back, and the connection is in autocommit and usable again, outside any
    # transaction (a failed one left open would refuse every later statement).
    assert topics() == ["one", "two"]
    assert connection.connection.info.transaction_status.name == "IDLE"
