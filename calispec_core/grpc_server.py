"""gRPC plumbing shared by every service: server factory, error interceptor, channels.

Credentials will be read here and only here (TLS/mTLS is a later issue): every server
binds through `bind_port` and every client connects through `make_channel`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from calispec_core.errors import CalispecError

log = logging.getLogger(__name__)

# Draft distributions for sampling are [gamma, V] float32: 151,936 x 8 x 4 B is ~4.9 MB.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # a restarted service is found again within ~2 s (gRPC's default backoff grows to 120 s, and
    # calls on a channel in backoff fail at once, so a long outage would outlast the restart)
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def _status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, CalispecError):
        return getattr(grpc.StatusCode, exc.code), str(exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


class ErrorInterceptor(grpc.ServerInterceptor):
    """Maps domain errors to their gRPC status; anything else is a bug: logged, INTERNAL."""

    def intercept_service(self, continuation: Callable, handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        if handler.unary_unary:
            return handler._replace(unary_unary=self._wrap_unary(handler.unary_unary))
        if handler.unary_stream:
            return handler._replace(unary_stream=self._wrap_stream(handler.unary_stream))
        return handler  # no client- or bidi-streaming RPCs yet

    @staticmethod
    def _abort(context: grpc.ServicerContext, exc: BaseException) -> None:
        code, message = _status_for(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.exception("unhandled error in handler")
        context.abort(code, message)

    def _wrap_unary(self, fn: Callable) -> Callable:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                return fn(request, context)
            except grpc.RpcError:
                raise  # context.abort() already set the status
            except Exception as exc:
                self._abort(context, exc)

        return wrapped

    def _wrap_stream(self, fn: Callable) -> Callable:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Iterable[Any]:
            try:
                yield from fn(request, context)
            except grpc.RpcError:
                raise
            except Exception as exc:
                self._abort(context, exc)

        return wrapped


Registrar = Callable[[grpc.Server], None]


def create_grpc_server(
    address: str,
    registrars: Sequence[Registrar],
    service_names: Sequence[str],
    max_workers: int = 16,
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """Build a server with our services, grpc.health.v1, reflection and the error interceptor.

    `address` may use port 0; the bound port is returned. The server is not started.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        interceptors=[ErrorInterceptor()],
        options=CHANNEL_OPTIONS,
    )
    for register in registrars:
        register(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in [*service_names, ""]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    port = bind_port(server, address)
    return server, port, health_servicer


def bind_port(server: grpc.Server, address: str) -> int:
    """Bind `address` (host:port, port may be 0); returns the bound port."""
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind {address}")
    return port


def make_channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


def make_aio_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


def wait_for_ready(channel: grpc.Channel, timeout: float) -> None:
    """Block until the channel connects, or raise grpc.FutureTimeoutError."""
    grpc.channel_ready_future(channel).result(timeout=timeout)
