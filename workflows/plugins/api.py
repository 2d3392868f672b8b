"""What an app's REST endpoints share with Waymark's own (docs/how-to/call-the-api.md): API-key
authentication's principal (``request_key``, ``request_actor``), the strict input serializer
(unknown fields refused), the error body's schema, and the cursor-paginated list endpoint."""

from __future__ import annotations

from ..api.auth import request_actor, request_key
from ..api.filters import BooleanFilter
from ..api.serializers import ErrorOut, JsonObjectField, StrictInput
from ..api.views import CursorPage, ListEndpoint

__all__ = [
    "BooleanFilter",
    "CursorPage",
    "ErrorOut",
    "JsonObjectField",
    "ListEndpoint",
    "StrictInput",
    "request_actor",
    "request_key",
]
