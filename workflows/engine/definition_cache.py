"""Published definitions by version id, cached for the life of the process.

Safe to cache forever: a published version never changes (model layer and trigger).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, connection

from . import sql
from .sql.rows import fetch_dict

logger = logging.getLogger(__name__)

_cache: dict[int, dict[str, Any]] = {}
_labels: dict[int, tuple[str, int]] = {}


def definition_for(version_id: int) -> dict[str, Any]:
    definition = _cache.get(version_id)
    if definition is None:
        with connection.cursor() as cursor:
            cursor.execute(sql.PUBLISHED_DEFINITION, {"id": version_id})
            row = fetch_dict(cursor)
        if row is None:
            raise LookupError(f"version {version_id} is not published")
        definition = row["definition"]
        _cache[version_id] = definition
    return definition


def version_label(version_id: int) -> tuple[str, int]:
    """The version's automation slug and number, as a trace names them (engine/tracing.py);
    read once per version, and only by traced paths. A trace is never worth a failed start
    or step: when the database cannot say now, ("", 0), and it is asked again next time."""
    label = _labels.get(version_id)
    if label is None:
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql.VERSION_LABEL, {"id": version_id})
                row = fetch_dict(cursor)
        except DatabaseError:
            logger.warning("version %s: its name for a trace could not be read", version_id,
                           exc_info=True)  # fmt: skip
            return ("", 0)
        label = (row["slug"], row["number"]) if row is not None else ("", 0)
        _labels[version_id] = label
    return label
