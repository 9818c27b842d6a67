"""OpenTelemetry spans per RPC: the caller's trace context travels in metadata, the request id is an attribute."""

from __future__ import annotations

from opentelemetry import trace  # the otel extra, which `make install` installs
from opentelemetry.sdk import trace as sdk
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from calispec_core import tracing


def test_a_server_span_continues_the_callers_trace() -> None:
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # once per process; nothing else in the suite sets one

    with tracing.server_span("/calispec.v1.Coordinator/Generate", [], "req-1"):
        outgoing = tracing.inject([("x-request-id", "req-1")])  # what the coordinator sends the draft
        with tracing.server_span("/calispec.v1.DraftService/Propose", outgoing, "req-1"):
            pass
    assert tracing.inject([]) == []  # no span recording: nothing to propagate

    child, parent = exporter.get_finished_spans()
    assert any(key == "traceparent" for key, _ in outgoing)
    assert child.context.trace_id == parent.context.trace_id and child.parent.span_id == parent.context.span_id
    assert parent.kind == trace.SpanKind.SERVER and parent.attributes["calispec.request_id"] == "req-1"
    assert child.attributes["rpc.method"] == "/calispec.v1.DraftService/Propose"
