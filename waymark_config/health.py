"""Health endpoints for load balancers and orchestrators.

``/livez``: the web process answers (no database): restart the process when it fails.
``/healthz``: the process answers *and* reaches the database: take it out of rotation (not
restart it) when it fails, since a database outage is not cured by restarting the web.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse

logger = logging.getLogger(__name__)


def livez(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def healthz(request: HttpRequest) -> JsonResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        logger.warning("healthz: database unreachable: %s", first_line)
        return JsonResponse({"status": "unavailable", "database": "unreachable"}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})
