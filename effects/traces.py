"""An effect call as an OpenTelemetry span (``waymark.effect``), the child of its step
attempt's span, when tracing is on (workflows.plugins.engine.tracing_on; off, the ledger
never comes here). The span says which effect (its key, provider and connection), whether
the provider was called this time or the stored answer returned (``waymark.effect_called``),
and how it ended: a failure is the span's error, a deferral (not now, no attempt spent) is
not."""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from workflows.plugins import StepContext, StepDeferred, StepResult
from workflows.plugins.engine import step_span

EFFECT_KEY = "waymark.effect_key"
PROVIDER = "waymark.provider"
CONNECTION = "waymark.connection"
CALLED = "waymark.effect_called"
OUTCOME = "waymark.outcome"


def traced_effect(
    ctx: StepContext, *, provider: str, connection: str | None, run: Callable[[], StepResult]
) -> StepResult:
    attributes = {EFFECT_KEY: ctx.effect_key, PROVIDER: provider, CALLED: False}
    if connection is not None:
        attributes[CONNECTION] = connection
    with step_span("waymark.effect", ctx, kind=SpanKind.CLIENT, attributes=attributes,
                   not_errors=(StepDeferred,)) as span:  # fmt: skip
        try:
            result = run()
        except StepDeferred:
            span.set_attribute(OUTCOME, "deferred")
            raise
        span.set_attribute(OUTCOME, "parked" if result.park is not None else result.outcome or "ok")
        return result


def provider_called() -> None:
    """The effect's span (current in this thread): the provider is being called now."""
    trace.get_current_span().set_attribute(CALLED, True)
