"""The web's side of the metrics, traces and logs: ``/metrics``, the request-latency
middleware, the middleware that continues a caller's trace, and the one that gives each
request's log lines their own context.

``/metrics`` answers in Prometheus' text format (``engine/scrape.py``), only to a scraper
that shows the bearer token ``WAYMARK_METRICS_TOKEN``; with no token set it is off (404).
Waymark's web is the public one, so its metrics are not left open on it. Include it from a
URLconf (``path("", include("workflows.monitoring"))``) and list
``workflows.monitoring.RequestMetricsMiddleware`` first in ``MIDDLEWARE`` to time requests
(docs/reference/metrics.md, "Metrics"). ``TraceContextMiddleware`` (after it) makes the spans a
request causes (a run's start) children of the caller's, from its ``traceparent`` header
(docs/how-to/monitor.md, "Tracing and logs").
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import MiddlewareNotUsed
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.urls import path
from opentelemetry import context as otel_context
from prometheus_client import Histogram

from .engine import logcontext, tracing
from .engine.scrape import render

REQUEST_DURATION = Histogram(
    "waymark_http_request_duration_seconds",
    "Web requests, from the first middleware in to the response out, by method, route "
    "pattern (never the raw path) and status code.",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
# A request's method is the client's to choose: any other is counted as "other", so no client
# can grow the label's values.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"  # answered before or without a route: a 404, a static file, a redirect


class RequestMetricsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        started = time.perf_counter()
        response = self.get_response(request)
        REQUEST_DURATION.labels(
            method=request.method if request.method in METHODS else "other",
            route=_route(request),
            status=str(response.status_code),
        ).observe(time.perf_counter() - started)
        return response


class LogContextMiddleware:
    """Each request's log lines carry what was bound while serving it (the API key's
    organisation: api/auth.py), and nothing of the request before it on this thread: the
    context is cleared as a request begins, not when it ends, so Django's own lines after the
    middleware (a 404's "Not Found") and the access log carry it too. Not in the chain at all
    unless logs are JSON (WAYMARK_LOG_FORMAT=json)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        if not logcontext.on():
            raise MiddlewareNotUsed
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        logcontext.clear()
        return self.get_response(request)


HEADERS = (("traceparent", "HTTP_TRACEPARENT"), ("tracestate", "HTTP_TRACESTATE"))


class TraceContextMiddleware:
    """A request's W3C ``traceparent`` (and ``tracestate``) header, as the current context
    while the request is handled: a run it starts (POST /api/v1/runs, a signal that starts
    its run) continues the caller's trace. A header that does not parse is ignored (a new
    trace), as W3C asks. Not in the chain at all while tracing is off."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        if not tracing.on():
            raise MiddlewareNotUsed  # Django leaves it out: no cost per request
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        carrier = {name: request.META[meta] for name, meta in HEADERS if meta in request.META}
        if not carrier:
            return self.get_response(request)
        token = otel_context.attach(tracing.context_from(carrier))
        try:
            return self.get_response(request)
        finally:
            otel_context.detach(token)


def _route(request: HttpRequest) -> str:
    """The URL pattern that answered (``/api/v1/runs/<int:run_id>``): as many values as the
    URLconf has patterns, whatever paths clients ask for."""
    match = getattr(request, "resolver_match", None)
    return "/" + match.route if match is not None else UNMATCHED


def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.WAYMARK.get("METRICS_TOKEN", "")
    if not token:
        return _error(404, "not_found", "Metrics are off: set WAYMARK_METRICS_TOKEN to serve them.")
    if request.method not in ("GET", "HEAD"):
        refused = _error(405, "method_not_allowed", f'Method "{request.method}" not allowed.')
        refused["Allow"] = "GET, HEAD"
        return refused
    if not _shows(request, token):
        refused = _error(401, "not_authenticated", "A valid bearer token is required.")
        refused["WWW-Authenticate"] = "Bearer"
        return refused
    body, content_type = render(request.headers.get("Accept", ""))
    return HttpResponse(body, content_type=content_type)


def _shows(request: HttpRequest, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    matches = hmac.compare_digest(given.strip().encode(), token.encode())
    return scheme.lower() == "bearer" and matches


def _error(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"code": code, "detail": detail}, status=status)


urlpatterns = [path("metrics", metrics, name="metrics")]
