"""The request id: where it lives while a request is served, how it travels, how it reaches logs.

A client may send `x-request-id` in gRPC metadata; the coordinator makes one otherwise. The
server interceptor (`calispec_core.observability`) binds it to a context variable for the
handler's duration; `RequestIdLogFilter` puts it on every log record (`%(request_id)s`), and
`RequestIdClientInterceptor` forwards it to the next service (coordinator -> draft, target).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import Any

import grpc

from calispec.types import MAX_REQUEST_ID_CHARS as MAX_REQUEST_ID_CHARS  # re-exported for the services
from calispec.types import REQUEST_ID_METADATA as REQUEST_ID_METADATA
from calispec.types import is_valid_request_id

NO_REQUEST = "-"

_request_id: ContextVar[str | None] = ContextVar("calispec_request_id", default=None)


def new_request_id() -> str:
    return uuid.uuid4().hex


def current_request_id() -> str | None:
    return _request_id.get()


def sanitize(value: str | None) -> str | None:
    """A client's id if it is safe to log and forward (bounded, no spaces or control characters)."""
    return value if value and is_valid_request_id(value) else None


def from_metadata(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    for key, value in metadata or ():
        if key == REQUEST_ID_METADATA and isinstance(value, str):
            return sanitize(value)
    return None


@contextmanager
def bound_request_id(request_id: str | None) -> Iterator[None]:
    """Make `request_id` current for the block (and the generator it wraps)."""
    token = _request_id.set(request_id)
    try:
        yield
    finally:
        with suppress(ValueError):  # a stream closed from another thread: that context is gone anyway
            _request_id.reset(token)


class RequestIdLogFilter(logging.Filter):
    """Adds `record.request_id` (the current id, or "-") so formats can print it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = _request_id.get() or NO_REQUEST
        return True


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


def configure_logging(level: str) -> None:
    """Root logging for a service process: every line carries the request id it was logged under."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(RequestIdLogFilter())
    logging.basicConfig(level=level, handlers=[handler], force=True)


def request_metadata(extra: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """Outgoing metadata: `extra` plus the current request id, if any."""
    request_id = _request_id.get()
    return [*extra, (REQUEST_ID_METADATA, request_id)] if request_id else list(extra)


class _ClientCallDetails(grpc.ClientCallDetails):
    def __init__(self, details: grpc.ClientCallDetails, metadata: list[tuple[str, str]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class RequestIdClientInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Forwards the current request id (and trace context) to the service being called."""

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        from calispec_core.tracing import inject

        metadata = [(k, v) for k, v in (details.metadata or ()) if k != REQUEST_ID_METADATA]
        return _ClientCallDetails(details, inject(request_metadata(metadata)))

    def intercept_unary_unary(self, continuation: Callable, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)


def with_request_id(channel: grpc.Channel) -> grpc.Channel:
    """`channel` whose calls carry the current request id; keep the raw one for readiness waits."""
    return grpc.intercept_channel(channel, RequestIdClientInterceptor())
