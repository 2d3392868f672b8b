"""Django's database cache, with ``set`` as one PostgreSQL upsert.

The rate limits count in this cache on every API request. Django's ``DatabaseCache.set``
counts the whole table (to decide on culling), looks the key up, then inserts or updates, in
a transaction: four statements and a commit per count. Here ``set`` is a single
``INSERT … ON CONFLICT DO UPDATE`` (atomic on its own), and expired rows are culled on about
one ``set`` in ``CULL_EVERY``. Reads, ``add``, ``touch`` and the table (``createcachetable``)
are Django's.
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
        connection = connections[router.db_for_write(self.cache_model_class)]
        table = connection.ops.quote_name(self._table)  # type: ignore[attr-defined]
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (cache_key, value, expires) VALUES (%s, %s, %s) "  # noqa: S608
                "ON CONFLICT (cache_key) DO UPDATE "
                "SET value = EXCLUDED.value, expires = EXCLUDED.expires",
                [key, pickled, expires],
            )
            if random.random() < 1 / CULL_EVERY:  # noqa: S311 (not a secret)
                cursor.execute(f"DELETE FROM {table} WHERE expires < %s", [now])  # noqa: S608
