"""OpenTelemetry spans: a run's start, each step attempt and each effect call, as one trace.

In this process with the SDK's in-memory exporter (starts through the API, steps through a
real worker's code path: tests/effect_setup.drive), and once end to end: ``runengine`` as
real processes exporting over OTLP/HTTP to a local receiver (tests/stubs/otlp.py), the
caller's trace going on through the web and the worker.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from opentelemetry.trace import SpanKind, StatusCode

from workflows.engine import tracing
from workflows.models import Run
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start
from workflows.services.tenancy import api_key_create

from .effect_setup import connect, drive, one_step, post_item
from .processes import ROOT, engine_env, wait_for
from .stubs import ProviderStub
from .stubs.otlp import STATUS_ERROR, OtlpStub, ReceivedSpan
from .tracing_setup import attempt_of, hex_span, hex_trace, named, parent_of

pytestmark = pytest.mark.django_db(transaction=True)

# A caller's span: W3C's own example (trace 4bf9..., span 00f0..., sampled).
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


def stored(run_id: int) -> tuple[str, str]:
    """The trace and span ids a run stores (its traceparent, flags aside: the SDK may set
    more than "sampled")."""
    trace_context = Run.objects.get(pk=run_id).trace_context
    assert trace_context is not None
    version, trace_id, span_id, _flags = trace_context.split("-")
    assert version == "00"
    return trace_id, span_id


def post_run(api, slug: str, key: str, **headers: str):
    return api.post("/api/v1/runs", {"automation": slug, "input": {"n": 1}, "start_key": key},
                    format="json", headers=headers)  # fmt: skip


# --- in this process ----------------------------------------------------------------------------


def test_a_run_is_one_trace_from_the_callers_span_through_its_step_and_effect(
    org, exported, provider_stub, api
):
    """POST /runs with a traceparent: the start's span is the caller's child, the run stores
    it, the worker's attempt is the start's child, and the effect call the attempt's."""
    connect(org, base_url=provider_stub.url)
    automation_publish_definition(org=org, slug="call", definition=one_step(
        post_item(provider_stub.url)))  # fmt: skip
    answer = post_run(api, "call", "k1", traceparent=CALLER)
    assert answer.status_code == 201, answer.content
    run_id = answer.json()["id"]

    [start] = named(exported, "waymark.run.start")
    assert (hex_trace(start), parent_of(start)) == (CALLER_TRACE, CALLER_SPAN)
    assert start.kind == SpanKind.PRODUCER
    assert start.attributes is not None
    described = ("waymark.run_id", "waymark.org_id", "waymark.automation", "waymark.version",
                 "waymark.created")  # fmt: skip
    assert {key: start.attributes.get(key) for key in described} == {
        "waymark.run_id": run_id, "waymark.org_id": org.pk, "waymark.automation": "call",
        "waymark.version": 1, "waymark.created": True,
    }  # fmt: skip
    run = Run.objects.get(pk=run_id)
    assert stored(run_id) == (CALLER_TRACE, hex_span(start))

    assert drive() == 1
    [step] = named(exported, "waymark.step")
    assert (hex_trace(step), parent_of(step)) == (CALLER_TRACE, hex_span(start))
    assert step.kind == SpanKind.CONSUMER
    assert step.attributes is not None
    assert dict(step.attributes) == {
        "waymark.run_id": run_id,
        "waymark.org_id": org.pk,
        "waymark.automation": "call",
        "waymark.version": 1,
        "waymark.version_id": run.version_id,
        "waymark.step": "send",
        "waymark.iteration": 1,
        "waymark.attempt": 1,
        "waymark.lane": "io",
        "waymark.step_type": "http",
        "waymark.outcome": "succeeded",
    }
    [effect] = named(exported, "waymark.effect")
    assert (hex_trace(effect), parent_of(effect)) == (CALLER_TRACE, hex_span(step))
    assert effect.kind == SpanKind.CLIENT
    assert effect.attributes is not None
    assert effect.attributes["waymark.effect_key"] == f"{run_id}/send/1"
    assert effect.attributes["waymark.provider"] == "http"
    assert effect.attributes["waymark.connection"] == "api"
    assert effect.attributes["waymark.effect_called"] is True
    assert effect.attributes["waymark.outcome"] == "ok"
    assert (effect.attributes["waymark.step"], effect.attributes["waymark.attempt"]) == ("send", 1)
    for span in (start, step, effect):
        assert span.status.status_code == StatusCode.UNSET


def test_a_failed_attempt_is_an_error_on_its_span_and_the_retry_is_in_the_same_trace(
    org, exported, provider_stub
):
    connect(org, base_url=provider_stub.url)
    provider_stub.rate_limit_next(1)  # refused, nothing made: the attempt fails, retried
    automation_publish_definition(org=org, slug="call", definition=one_step(
        post_item(provider_stub.url), retry=3))  # fmt: skip
    run_id = run_start(org=org, automation_slug="call", run_input={"n": 1}, start_key="k").run_id
    drive()
    assert Run.objects.get(pk=run_id).status == "succeeded"

    [start] = named(exported, "waymark.run.start")
    steps = sorted(named(exported, "waymark.step"), key=attempt_of)
    assert [attempt_of(span) for span in steps] == [1, 2]
    assert {hex_trace(span) for span in steps} == {hex_trace(start)}
    assert {parent_of(span) for span in steps} == {hex_span(start)}
    failed, succeeded = steps
    assert failed.status.status_code == StatusCode.ERROR
    assert "429" in (failed.status.description or "")
    assert [event.name for event in failed.events] == ["exception"]
    assert failed.attributes["waymark.outcome"] == "failed"  # type: ignore[index]
    assert succeeded.status.status_code == StatusCode.UNSET
    efforts = sorted(named(exported, "waymark.effect"), key=lambda span: span.start_time or 0)
    assert [span.status.status_code for span in efforts] == [StatusCode.ERROR, StatusCode.UNSET]
    assert [parent_of(span) for span in efforts] == [hex_span(failed), hex_span(succeeded)]


def test_both_kinds_of_start_store_their_spans_context(org, exported, provider_stub):
    """The first start of an automation in a process looks it up (the ordinary start, in a
    transaction); the next goes in one statement (engine/starts.py). Each run keeps its own
    start's span."""
    automation_publish_definition(org=org, slug="call", definition=one_step(
        post_item(provider_stub.url)))  # fmt: skip
    first = run_start(org=org, automation_slug="call", run_input={"n": 1}, start_key="a")
    second = run_start(org=org, automation_slug="call", run_input={"n": 2}, start_key="b")
    again = run_start(org=org, automation_slug="call", run_input={"n": 2}, start_key="b")
    assert (first.created, second.created, again.created) == (True, True, False)
    spans = named(exported, "waymark.run.start")
    assert len(spans) == 3 and len({hex_trace(span) for span in spans}) == 3
    for span, started in ((spans[0], first), (spans[1], second)):
        assert stored(started.run_id) == (hex_trace(span), hex_span(span))
    # A repeat answers with the run its key started, which keeps its first start's trace.
    repeat = spans[2].attributes
    assert repeat is not None
    assert (repeat["waymark.run_id"], repeat["waymark.created"]) == (second.run_id, False)


def test_a_signal_that_starts_its_run_continues_the_callers_trace(org, exported, api):
    automation_publish_definition(org=org, slug="waits", definition={
        "start": "wait", "steps": [
            {"id": "wait", "type": "wait_signal", "signal": "go", "correlation": "c",
             "next": "done"},
            {"id": "done", "type": "end"}],
    })  # fmt: skip
    answer = api.post("/api/v1/signals", {
        "name": "go", "correlation": "c", "start": {"automation": "waits", "start_key": "s1"}},
        format="json", headers={"traceparent": CALLER})  # fmt: skip
    assert answer.status_code in (200, 201), answer.content
    [start] = named(exported, "waymark.run.start")
    assert (hex_trace(start), parent_of(start)) == (CALLER_TRACE, CALLER_SPAN)
    assert stored(Run.objects.get(start_key="s1").pk) == (CALLER_TRACE, hex_span(start))


@pytest.mark.parametrize("header", ["garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", ""])
def test_a_traceparent_that_does_not_parse_starts_a_trace_of_its_own(org, exported, api, header):
    automation_publish_definition(org=org, slug="call", definition=one_step(
        post_item("http://127.0.0.1:9")))  # fmt: skip
    answer = post_run(api, "call", "k", traceparent=header)
    assert answer.status_code == 201, answer.content
    [start] = named(exported, "waymark.run.start")
    assert start.parent is None
    assert hex_trace(start) != "0" * 32


def test_a_refused_start_is_an_error_with_its_code(org, exported, api):
    answer = post_run(api, "nothing-here", "k", traceparent=CALLER)
    assert answer.status_code == 404
    [start] = named(exported, "waymark.run.start")
    assert start.status.status_code == StatusCode.ERROR
    assert start.attributes is not None
    assert start.attributes["waymark.error_code"] == "unknown_automation"


def test_off_no_span_is_made_and_no_context_is_written(org, provider_stub, monkeypatch, api):
    """Tracing off (the default): every traced path takes its untraced branch. Asking for
    the tracer would fail this test."""
    assert not tracing.on()

    def no_tracer() -> None:
        raise AssertionError("a span was asked for while tracing is off")

    monkeypatch.setattr(tracing, "tracer", no_tracer)
    connect(org, base_url=provider_stub.url)
    automation_publish_definition(org=org, slug="call", definition=one_step(
        post_item(provider_stub.url)))  # fmt: skip
    first = post_run(api, "call", "a", traceparent=CALLER).json()["id"]
    second = post_run(api, "call", "b", traceparent=CALLER).json()["id"]  # the one-trip start
    assert drive() == 2
    runs = Run.objects.filter(pk__in=[first, second])
    assert [(run.status, run.trace_context) for run in runs] == [("succeeded", None)] * 2


# --- configuration from the environment ---------------------------------------------------------


@pytest.mark.parametrize("environ", [
    {}, {"OTEL_TRACES_EXPORTER": "none"},
    {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"},
])  # fmt: skip
def test_tracing_is_off_unless_an_exporter_is_named(environ):
    assert tracing.configure("web", environ) is False
    assert not tracing.on()


@pytest.mark.parametrize(("environ", "named_in_error"), [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     "OTEL_EXPORTER_OTLP_PROTOCOL"),
])  # fmt: skip
def test_an_exporter_waymark_does_not_ship_stops_start_up(environ, named_in_error):
    with pytest.raises(ImproperlyConfigured, match=f"^invalid_setting: {named_in_error}"):
        tracing.configure("web", environ)
    assert not tracing.on()


def test_on_the_process_is_named_by_its_role_and_the_service_defaults_to_waymark(monkeypatch):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert tracing.configure("worker-io", {"OTEL_TRACES_EXPORTER": "console"}) is True
    try:
        provider = tracing._provider
        assert provider is not None
        assert provider.resource.attributes["service.name"] == "waymark"
        assert provider.resource.attributes["waymark.process_role"] == "worker-io"
    finally:
        tracing.shutdown()
    assert not tracing.on()


# --- end to end: runengine's processes, exported over OTLP/HTTP --------------------------------


def test_one_trace_across_the_web_the_worker_and_the_effect_over_otlp(org, procs, tmp_path):
    """``runengine`` (one web process, the workers, relay and sweep) with tracing on through
    the standard variables, exporting to a local OTLP/HTTP receiver: a run started through
    the web with the caller's traceparent is one trace, its start span sent by the web
    process, its step's and effect's by the io worker."""
    with ProviderStub(idempotent=True) as provider, OtlpStub() as collector:
        connect(org, base_url=provider.url)
        automation_publish_definition(org=org, slug="call", definition=one_step(
            post_item(provider.url)))  # fmt: skip
        raw_key = api_key_create(org=org, name="e2e")[1]
        port = start_engine(procs, tmp_path / "engine.out", collector.url)
        answer = httpx.post(
            f"http://127.0.0.1:{port}/api/v1/runs", timeout=30,
            json={"automation": "call", "input": {"n": 1}, "start_key": "e2e"},
            headers={"Authorization": f"Bearer {raw_key}", "traceparent": CALLER},
        )  # fmt: skip
        assert answer.status_code == 201, answer.text
        run_id = answer.json()["id"]
        wait_for(lambda: Run.objects.get(pk=run_id).status == "succeeded",
                 what="the run to succeed")  # fmt: skip

        def exported() -> dict[str, ReceivedSpan] | None:
            spans = {span.name: span for span in collector.spans
                     if span.attributes.get("waymark.run_id") == run_id}  # fmt: skip
            wanted = {"waymark.run.start", "waymark.step", "waymark.effect"}
            return spans if wanted <= set(spans) else None

        spans = wait_for(exported, what="the web's and the worker's spans at the receiver")
        assert not collector.errors, collector.errors
        start, step, effect = (spans[name] for name in (
            "waymark.run.start", "waymark.step", "waymark.effect"))  # fmt: skip
        assert {start.trace_id, step.trace_id, effect.trace_id} == {CALLER_TRACE}
        assert (start.parent_span_id, step.parent_span_id, effect.parent_span_id) == (
            CALLER_SPAN, start.span_id, step.span_id)  # fmt: skip
        assert start.resource["waymark.process_role"] == "web"
        assert step.resource["waymark.process_role"] == "worker-io"
        assert effect.resource["waymark.process_role"] == "worker-io"
        assert {span.resource["service.name"] for span in (start, step)} == {"waymark-e2e"}
        assert step.attributes["waymark.automation"] == "call"
        assert STATUS_ERROR not in {start.status_code, step.status_code, effect.status_code}
        assert stored(run_id) == (CALLER_TRACE, start.span_id)
        assert "Traceback" not in (tmp_path / "engine.out").read_text(errors="replace")


def start_engine(procs: list, out: Path, collector: str) -> int:
    """`runengine` with one web process on a free port, tracing to ``collector``."""
    from .test_web_server import free_port

    port = free_port()
    with out.open("wb") as sink:
        engine = subprocess.Popen(
            [sys.executable, "manage.py", "runengine", "--port", str(port), "--web-workers", "1",
             "--grace", "1"],
            cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
            env=engine_env(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=collector,
                           OTEL_SERVICE_NAME="waymark-e2e", OTEL_BSP_SCHEDULE_DELAY="100"),
        )  # fmt: skip
    procs.append(engine)
    wait_for(lambda: b"ready" in out.read_bytes() or engine.poll() is not None,
             what="runengine to say ready")  # fmt: skip
    assert engine.poll() is None, out.read_text(errors="replace")[-3000:]
    return port
