"""An OTLP/HTTP trace receiver: what an OpenTelemetry collector is to the engine's processes.

It answers ``POST /v1/traces`` as a collector does: the body is a protobuf
``ExportTraceServiceRequest`` (gzip-compressed when the exporter says so), decoded with
opentelemetry-proto's own message classes, and each span is kept with its resource's
attributes (which process sent it). Anything else is a 404, and a body that does not decode
is a 400 and an error the test sees (``errors``).
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

# OTLP's span status codes (opentelemetry/proto/trace/v1/trace.proto, Status.StatusCode).
STATUS_ERROR = 2


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # hex, as W3C's traceparent writes it
    span_id: str
    parent_span_id: str  # "" for a root span
    name: str
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]  # service.name, waymark.process_role, ...
    status_code: int
    events: tuple[str, ...]  # event names ("exception", ...)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(), name=span.name, kind=span.kind,
                    attributes=_attributes(span.attributes), resource=resource,
                    status_code=span.status.code,
                    events=tuple(event.name for event in span.events),
                ))  # fmt: skip
    return spans


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/traces":
            self._answer(404, b"")
            return
        try:
            if self.headers.get("Content-Encoding", "").lower() == "gzip":
                body = gzip.decompress(body)
            spans = decode(body)
        except (DecodeError, OSError) as error:
            self.server.stub.record_error(f"undecodable export: {error!r}")
            self._answer(400, b"")
            return
        self.server.stub.record(spans)
        self._answer(200, ExportTraceServiceResponse().SerializeToString())

    def _answer(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, stub: OtlpStub) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.stub = stub


class OtlpStub:
    """A collector on 127.0.0.1: ``url`` is what ``OTEL_EXPORTER_OTLP_ENDPOINT`` names."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.errors: list[str] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def record(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def record_error(self, error: str) -> None:
        with self._lock:
            self.errors.append(error)

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)
