"""OpenTelemetry spans where they cost nothing when unused (the optional `otel` extra).

Without `opentelemetry-api` every function here is a no-op. With it but without a configured
SDK, OpenTelemetry's own no-op tracer answers. To export spans, run a service under
`opentelemetry-instrument` (opentelemetry-distro and an exporter; see docs/observability.md):
servers open one span per RPC, and trace context travels in gRPC metadata (W3C traceparent)
next to `x-request-id`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # the extra is not installed
    propagate = trace = None  # type: ignore[assignment]

TRACER_NAME = "calispec"


def enabled() -> bool:
    return trace is not None


def inject(metadata: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`metadata` plus the current trace context (nothing when no span is recording)."""
    if propagate is None:
        return metadata
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [*metadata, *carrier.items()]


@contextmanager
def server_span(method: str, metadata: Sequence[tuple[str, Any]] | None, request_id: str | None) -> Iterator[None]:
    """A SERVER span for one RPC, child of the caller's span when its metadata carries one."""
    if trace is None or propagate is None:
        with nullcontext():
            yield
        return
    carrier = {k: v for k, v in metadata or () if isinstance(v, str)}
    attributes = {"rpc.system": "grpc", "rpc.method": method}
    if request_id:
        attributes["calispec.request_id"] = request_id
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        method, context=propagate.extract(carrier), kind=trace.SpanKind.SERVER, attributes=attributes
    ):
        yield
