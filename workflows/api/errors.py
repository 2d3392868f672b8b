"""One exception handler: every API error is JSON ``{"code", "detail", ...}`` with a stable code.

Domain errors carry their own code and status. DRF's and Django's errors are mapped to codes
here, so no client ever has to parse an HTML page or a message string.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ..errors import WaymarkError

logger = logging.getLogger(__name__)

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


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
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
    return request.path.startswith("/api/")


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
