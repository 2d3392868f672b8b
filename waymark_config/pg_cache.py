"""Django's database cache, with ``set`` as one PostgreSQL upsert, and atomic counters.

The rate limits count in this cache on every API request. Django's ``DatabaseCache.set``
counts the whole table (to decide on culling), looks the key up, then inserts or updates, in
a transaction: four statements and a commit per count. Here ``set`` is a single
``INSERT … ON CONFLICT DO UPDATE`` (atomic on its own), and expired rows are culled on about
one write in ``CULL_EVERY``. Reads, ``add``, ``touch`` and the table (``createcachetable``)
are Django's.

``count_one`` adds one to a counter and returns the new count in that one statement: two
requests counted at once both count (a read, then a write of the read plus one, would let
them both write the same number). A counter's value is its count as plain digits, not a
pickle: read it with ``peek_count``, never ``get``.
"""

from __future__ import annotations

import base64
import pickle
import random
from datetime import UTC, datetime
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.db import DatabaseCache
from django.db import connections, router

CULL_EVERY = 200


class PostgresDatabaseCache(DatabaseCache):
    def set(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> None:
        key = self.make_and_validate_key(key, version=version)
        when = self.get_backend_timeout(timeout)  # an absolute time (epoch), or None
        now = datetime.now(UTC)
        expires = (
            datetime.max.replace(tzinfo=UTC)
            if when is None
            else datetime.fromtimestamp(when, tz=UTC)
        )
        pickled = base64.b64encode(pickle.dumps(value, self.pickle_protocol)).decode("latin1")
        connection, table = self._writing()
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (cache_key, value, expires) VALUES (%s, %s, %s) "  # noqa: S608
                "ON CONFLICT (cache_key) DO UPDATE "
                "SET value = EXCLUDED.value, expires = EXCLUDED.expires",
                [key, pickled, expires],
            )
            self._maybe_cull(cursor, table, now)

    def count_one(self, key: Any, timeout: int) -> int:
        """Add one to the counter at ``key`` (a new or expired counter starts at 1; it expires
        ``timeout`` seconds from now) and return its count: one statement, atomic."""
        key = self.make_and_validate_key(key)
        now = datetime.now(UTC)
        expires = datetime.fromtimestamp(now.timestamp() + timeout, tz=UTC)
        connection, table = self._writing()
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} AS c (cache_key, value, expires) "  # noqa: S608
                "VALUES (%(key)s, '1', %(expires)s) "
                "ON CONFLICT (cache_key) DO UPDATE SET "
                "value = CASE WHEN c.expires < %(now)s THEN '1' "
                "ELSE (c.value::bigint + 1)::text END, expires = EXCLUDED.expires "
                "RETURNING value",
                {"key": key, "expires": expires, "now": now},
            )
            count = int(cursor.fetchone()[0])
            self._maybe_cull(cursor, table, now)
        return count

    def peek_count(self, key: Any) -> int:
        """The count of the counter at ``key``; 0 when it is absent or expired."""
        key = self.make_and_validate_key(key)
        connection = connections[router.db_for_read(self.cache_model_class)]
        table = connection.ops.quote_name(self._table)  # type: ignore[attr-defined]
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT value FROM {table} WHERE cache_key = %s AND expires >= %s",  # noqa: S608
                [key, datetime.now(UTC)],
            )
            row = cursor.fetchone()
        return 0 if row is None else int(row[0])

    def _writing(self) -> tuple[Any, str]:
        connection = connections[router.db_for_write(self.cache_model_class)]
        return connection, connection.ops.quote_name(self._table)  # type: ignore[attr-defined]

    @staticmethod
    def _maybe_cull(cursor: Any, table: str, now: datetime) -> None:
        if random.random() < 1 / CULL_EVERY:  # noqa: S311 (not a secret)
            cursor.execute(f"DELETE FROM {table} WHERE expires < %s", [now])  # noqa: S608
