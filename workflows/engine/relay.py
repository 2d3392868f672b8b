"""The outbox relay: publishes intents written by committed transactions.

Per batch: lock unsent rows (FOR UPDATE SKIP LOCKED, so relays never share rows), publish
them with the outbox id as message id, mark them sent, commit. A relay killed after publishing
and before committing leaves the rows unsent: they are published again, and consumers treat
every message as possibly duplicated. Sent rows are deleted after the retention period.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import connection, transaction

from . import metrics, sql
from .faults import crash_point
from .lanes import engine_setting
from .sql.rows import fetch_dicts
from .transient import Outage
from .transport import Message, Transport, default_transport

logger = logging.getLogger(__name__)


def relay_once(transport: Transport, *, batch: int | None = None) -> int:
    """Publish one batch; return how many rows it sent."""
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(sql.RELAY_BATCH, {"n": batch or engine_setting("RELAY_BATCH")})
        rows = fetch_dicts(cursor)
        if not rows:
            return 0
        transport.publish(
            [Message(id=r["id"], topic=r["topic"], payload=r["payload"]) for r in rows]
        )
        crash_point("relay.after_publish")
        cursor.execute(sql.RELAY_MARK_SENT, {"ids": [row["id"] for row in rows]})
    metrics.relay_published(len(rows), max(row["age_seconds"] for row in rows))
    return len(rows)


def cleanup_sent(
    *, older_than_seconds: float | None = None, batch: int = 10_000, max_batches: int = 50
) -> int:
    """Delete sent rows past retention, in batches, until none are left (or max_batches)."""
    age = older_than_seconds
    if age is None:
        age = engine_setting("OUTBOX_RETENTION_SECONDS")
    removed = 0
    with connection.cursor() as cursor:
        for _ in range(max_batches):
            cursor.execute(sql.OUTBOX_CLEANUP, {"age": age, "batch": batch})
            removed += cursor.rowcount
            if cursor.rowcount < batch:
                break
    return removed


def run_relay(stop: threading.Event, *, transport: Transport | None = None) -> None:
    transport = transport or default_transport()
    poll = engine_setting("RELAY_POLL_SECONDS")
    batch = engine_setting("RELAY_BATCH")
    next_cleanup = 0.0
    outage = Outage("relay", logger)  # a warning when the database goes, one when it is back
    while not stop.is_set():
        try:
            sent = relay_once(transport, batch=batch)
            if time.monotonic() >= next_cleanup:
                removed = cleanup_sent()
                if removed:
                    logger.info("relay removed %s sent outbox rows", removed)
                next_cleanup = time.monotonic() + 60
        except Exception as exc:
            pause = outage.failed(exc)
            connection.close()
            stop.wait(pause)
            continue
        outage.ok()
        if sent < batch:
            # Caught up: wait a poll interval so the next batch gathers rows instead of
            # committing one tiny batch per settle. A full batch means more are waiting.
            stop.wait(poll)
    connection.close()
