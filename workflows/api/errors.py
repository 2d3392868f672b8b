"""One exception handler: every API error is JSON ``{"code", "detail", ...}`` with a stable code.

Domain errors carry their own code and status. DRF's and Django's errors are mapped to codes
here, so no client ever has to parse an HTML page or a message string.

The database away (restarting, stopped, a failover, the request's connection terminated) or
keeping the request waiting (a deadlock, a lock or statement timeout) is not the request's
fault and not a bug: 503 with ``Retry-After``, code ``database_unavailable`` (or
``database_busy``), one warning line in the log, no traceback. The same errors the engine
retries (workflows/engine/transient.py) are the ones answered so.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from django.core.exceptions import (
    BadRequest,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ..engine.transient import away, first_line, lost_connection
from ..errors import WaymarkError
from .renderers import JSONRenderer

logger = logging.getLogger(__name__)

# What a client is told to wait before trying again while the database is away: a restart of
# the server takes a few seconds.
DATABASE_RETRY_AFTER_SECONDS = 5

JSON = JSONRenderer()

_DRF_CODES: list[tuple[type[exceptions.APIException], str]] = [
    (exceptions.ParseError, "malformed_request"),
    (exceptions.ValidationError, "invalid_input"),
    (exceptions.NotAuthenticated, "not_authenticated"),
    (exceptions.AuthenticationFailed, "not_authenticated"),
    (exceptions.PermissionDenied, "permission_denied"),
    (exceptions.NotFound, "not_found"),
    (exceptions.MethodNotAllowed, "method_not_allowed"),
    (exceptions.NotAcceptable, "not_acceptable"),
    (exceptions.UnsupportedMediaType, "unsupported_media_type"),
    (exceptions.Throttled, "throttled"),
]


def _code_for(exc: exceptions.APIException) -> str:
    for cls, code in _DRF_CODES:
        if isinstance(exc, cls):
            return code
    return "error"


def database_unavailable(request: HttpRequest, exc: BaseException) -> dict[str, str] | None:
    """The answer's body when ``exc`` is the database's being away or busy (logged in one
    line), None when it is anything else."""
    transient = away(exc)
    if transient is None:
        return None
    if lost_connection(transient):
        code, detail = "database_unavailable", "The database is unavailable; try again shortly."
    else:
        code, detail = "database_busy", "The database is busy; try again shortly."
    logger.warning("%s %s: %s (%s)", request.method, request.path, code, first_line(transient))
    return {"code": code, "detail": detail}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = _answer(exc, context)
    request = context.get("request")
    if response is not None and request is not None:
        # JSON whatever the endpoint renders otherwise (the schema's YAML, first among its
        # renderers, is what DRF falls back to when negotiation failed: a 406 came as YAML).
        request.accepted_renderer = JSON
        request.accepted_media_type = JSON.media_type
    return response


def _answer(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, WaymarkError):
        ours = Response(exc.as_dict(), status=exc.status)
        if exc.status == 401:
            ours["WWW-Authenticate"] = "Bearer"
        retry_after = getattr(exc, "retry_after_seconds", None)
        if retry_after is not None:
            ours["Retry-After"] = str(retry_after)
        return ours
    if isinstance(exc, SuspiciousOperation) and not isinstance(exc, RequestDataTooBig):
        return Response(
            {"code": "bad_request", "detail": "The request is malformed."},
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, RequestDataTooBig):
        return Response(
            {"code": "payload_too_large", "detail": "The request body is too large."},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        request = context.get("request")
        unavailable = database_unavailable(request, exc) if request is not None else None
        if unavailable is not None:
            return _logged(Response(unavailable, status=503))
        return None  # a real bug: let Django log it and answer 500
    assert isinstance(exc, exceptions.APIException)
    body: dict[str, Any] = {"code": _code_for(exc)}
    if isinstance(exc, exceptions.ValidationError):
        body["detail"] = "The request body is invalid."
        body["errors"] = response.data
    else:
        body["detail"] = str(exc.detail)
    response.data = body
    return response


def _is_api(request: HttpRequest) -> bool:
    return request.path == "/api" or request.path.startswith("/api/")


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """JSON for API paths, Django's page for the admin and other pages."""
    if _is_api(request):
        return JsonResponse({"code": "not_found", "detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's own 400s (too many query fields, a disallowed Host header)."""
    if _is_api(request):
        return JsonResponse(
            {"code": "bad_request", "detail": "The request is malformed."}, status=400
        )
    return defaults.bad_request(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        return JsonResponse(
            {"code": "server_error", "detail": "Internal error; it has been logged."}, status=500
        )
    return defaults.server_error(request)


_ANSWERED_BY_DJANGO = (Http404, PermissionDenied, SuspiciousOperation, BadRequest)


class DatabaseUnavailableMiddleware:
    """The same 503 for every other view (the admin, the console, the health pages' own
    errors): JSON on API paths, a short text elsewhere. Last in MIDDLEWARE, so its
    ``process_exception`` is the first to see a view's error."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response: HttpResponse = self.get_response(request)
        return response

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if isinstance(exc, _ANSWERED_BY_DJANGO):
            return None  # a 4xx of Django's own: nothing to ask the database about
        body = database_unavailable(request, exc)
        if body is None:
            return None
        answer: HttpResponse
        if _is_api(request):
            answer = JsonResponse(body, status=503)
        else:
            answer = HttpResponse(body["detail"], status=503, content_type="text/plain")
        return _logged(answer)


_Answer = TypeVar("_Answer", bound=HttpResponse)


def _logged(answer: _Answer) -> _Answer:
    """Retry-After, and no second line for it: the warning said it (Django would log each 5xx
    at ERROR)."""
    answer["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
    answer._has_been_logged = True  # type: ignore[attr-defined]  # django.utils.log's mark
    return answer
