"""OpenTelemetry spans for a run's start, each step attempt and each effect call.

Off by default, and then free: ``on()`` is one global read, and every traced path asks it
once and takes its untraced branch, creating no span object and writing no trace context.
On with the standard variables (``OTEL_TRACES_EXPORTER=otlp`` with
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``,
``OTEL_BSP_*``...), read by ``configure`` when an engine process starts (web, worker, relay,
sweep: ``processes.engine_process``), with a batch processor flushed when it stops.

**One trace per run, across processes.** The start's span (``waymark.run.start``, in the web,
the sweep for a scheduled start, any process that starts runs) is written on the run's row as
a W3C traceparent (``Run.trace_context``), in the start's own statement. A worker's claim
reads it back with the step, and each attempt's span (``waymark.step``) is its child; an
effect call (``waymark.effect``) is the attempt's child. A web request's ``traceparent``
header (``monitoring.TraceContextMiddleware``) makes the start a child of the caller's span,
so the caller's trace goes on through the engine.

Attribute names start with ``waymark.`` (``ATTRIBUTES``); docs/how-to/monitor.md, "Tracing and
logs", lists them.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .definition_cache import version_label

if TYPE_CHECKING:
    from .executors import StepContext

logger = logging.getLogger(__name__)

INSTRUMENTATION = "waymark"
EXPORTERS = ("otlp", "console")
PROTOCOL = "http/protobuf"  # the one OTLP transport Waymark ships

RUN_ID = "waymark.run_id"
ORG_ID = "waymark.org_id"
AUTOMATION = "waymark.automation"
VERSION = "waymark.version"
VERSION_ID = "waymark.version_id"
STEP = "waymark.step"
ITERATION = "waymark.iteration"
ATTEMPT = "waymark.attempt"
LANE = "waymark.lane"
STEP_TYPE = "waymark.step_type"
OUTCOME = "waymark.outcome"
CREATED = "waymark.created"
ERROR_CODE = "waymark.error_code"
ROLE = "waymark.process_role"
ATTRIBUTES = (RUN_ID, ORG_ID, AUTOMATION, VERSION, VERSION_ID, STEP, ITERATION, ATTEMPT, LANE,
              STEP_TYPE, OUTCOME, CREATED, ERROR_CODE)  # fmt: skip

_PROPAGATOR = TraceContextTextMapPropagator()
_tracer: Tracer | None = None  # None: tracing is off
_provider: Any = None  # the SDK's TracerProvider this module made, and shuts down
_lock = threading.Lock()


def on() -> bool:
    """Whether spans are made. The one check every traced path makes, once."""
    return _tracer is not None


def tracer() -> Tracer:
    assert _tracer is not None, "tracing is off: ask on() first"
    return _tracer


# --- turning it on ----------------------------------------------------------------------------


def configure(role: str, environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on in this process as the ``OTEL_*`` variables say (none set: off), with
    a batch span processor flushed at ``shutdown`` (and at exit). ``role`` (web, worker-io,
    relay, sweep) goes on every span as the resource attribute ``waymark.process_role``.
    Returns whether tracing is on. A variable Waymark cannot honour stops start-up
    (``ImproperlyConfigured``: one line and exit 78, as every other setting)."""
    env = os.environ if environ is None else environ
    exporters = _exporter_names(env)
    if not exporters:
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({ROLE: role})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "waymark"}))
    # The sampler comes from OTEL_TRACES_SAMPLER (default: parent-based, always on).
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    for name in exporters:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    use(provider, owned=True)
    atexit.register(shutdown)
    logger.info("tracing on (%s), process role %s", ", ".join(exporters), role)
    return True


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n and n != "none"]
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise ImproperlyConfigured(
            f"invalid_setting: OTEL_TRACES_EXPORTER must be {', '.join(EXPORTERS)} or none "
            f"(comma-separated); {unknown[0]!r} is not one Waymark ships"
        )
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", PROTOCOL
    )
    if "otlp" in names and protocol.strip() != PROTOCOL:
        raise ImproperlyConfigured(
            f"invalid_setting: OTEL_EXPORTER_OTLP_PROTOCOL must be {PROTOCOL} (OTLP over "
            "HTTP, port 4318 by default); unset it for the default"
        )
    return list(dict.fromkeys(names))


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # Endpoint, headers, timeout and compression from OTEL_EXPORTER_OTLP_(TRACES_)*.
    return OTLPSpanExporter()


def use(provider: trace.TracerProvider | None, *, owned: bool = False) -> None:
    """Make spans with ``provider`` from now on (None: tracing off). For a host project that
    configures OpenTelemetry itself (``workflows.plugins.engine.use_tracer_provider``) and for
    tests (the SDK's in-memory exporter). ``owned``: this module shuts it down."""
    global _tracer, _provider
    with _lock:
        previous = _provider
        _tracer = provider.get_tracer(INSTRUMENTATION) if provider is not None else None
        _provider = provider if owned else None
    if previous is not None and previous is not provider:
        previous.shutdown()


def shutdown() -> None:
    """Flush the spans still queued and stop exporting (an engine process that stops).
    Idempotent; tracing is off afterwards."""
    global _tracer, _provider
    with _lock:
        provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


# --- the trace context --------------------------------------------------------------------------


def traceparent(span: Span) -> str | None:
    """``span``'s W3C traceparent, as a run stores it; None when it has no valid context."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def context_from(carrier: Mapping[str, str]) -> Context:
    """The trace context in ``carrier`` (``traceparent``, ``tracestate``): a stored run's or
    an incoming request's. A missing or malformed one gives an empty context (a new trace),
    never an error: W3C asks receivers to ignore what they cannot parse."""
    return _PROPAGATOR.extract(carrier)


def parent_of_run(trace_context: str | None) -> Context | None:
    """The context a span of the run continues: its start's span, or None (a trace of its
    own) for a run started untraced."""
    return context_from({"traceparent": trace_context}) if trace_context else None


# --- spans --------------------------------------------------------------------------------------


@contextmanager
def span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    parent: Context | None = None,
    attributes: Mapping[str, Any] | None = None,
    not_errors: tuple[type[BaseException], ...] = (),
) -> Iterator[Span]:
    """A span, current in this thread while the block runs; an exception leaving the block is
    recorded on it as an error (with its ``code`` when it is one of Waymark's errors), unless
    it is one of ``not_errors`` (a step deferred: not now, and nobody's fault)."""
    with tracer().start_as_current_span(
        name, context=parent, kind=kind, attributes=dict(attributes or {}),
        record_exception=False, set_status_on_exception=False,
    ) as current:  # fmt: skip
        try:
            yield current
        except not_errors:
            raise
        except BaseException as error:
            failed(current, error)
            raise


def step_span(
    name: str,
    ctx: StepContext,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    not_errors: tuple[type[BaseException], ...] = (),
) -> AbstractContextManager[Span]:
    """A span of work an executor does for its step (an effect call), the child of the
    attempt's span, with the step's attributes (run, automation, version, step, iteration,
    attempt) and ``attributes``. Ask ``on()`` first."""
    described = {
        RUN_ID: ctx.run_id, ORG_ID: ctx.org_id, STEP: ctx.step_id, ITERATION: ctx.iteration,
        ATTEMPT: ctx.attempt, LANE: ctx.lane,
    }  # fmt: skip
    if ctx.version_id is not None:
        automation, number = version_label(ctx.version_id)
        described.update({AUTOMATION: automation, VERSION: number, VERSION_ID: ctx.version_id})
    return span(name, kind=kind, attributes={**described, **(attributes or {})},
                not_errors=not_errors)  # fmt: skip


def current() -> Span:
    """The span current in this thread (a non-recording one when there is none)."""
    return trace.get_current_span()


def failed(span: Span, error: BaseException, *, message: str | None = None) -> None:
    """Record ``error`` on ``span``: an exception event and the status ERROR."""
    span.record_exception(error)
    code = getattr(error, "code", None)
    if isinstance(code, str):
        span.set_attribute(ERROR_CODE, code)
    span.set_status(Status(StatusCode.ERROR, message or f"{type(error).__name__}: {error}"))


def current_ids() -> tuple[str, str] | None:
    """The current span's trace and span ids (hex), for log lines; None when tracing is off or
    no span is current."""
    if _tracer is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")
