"""gRPC plumbing shared by every service: server factory, error interceptor, channels.

Transport credentials are applied here and only here: every server binds through `bind_port`
and every client connects through `make_channel`, each given the process's `TlsConfig`
(None or no certificate: plaintext, which `TlsConfig.check` allows on loopback only).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from calispec._channel import channel_options
from calispec_core.credentials import TlsConfig
from calispec_core.errors import DEVICE_FAILED, STOPS_SERVING, CalispecError, InvalidArgument

if TYPE_CHECKING:
    from grpc_health.v1 import health

    from calispec_core.observability import ManagedServer, Observe

log = logging.getLogger(__name__)

# Draft distributions for sampling are [gamma, V] float32: 151,936 x 8 x 4 B is ~4.9 MB.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
RETRY_PUSHBACK_METADATA = "grpc-retry-pushback-ms"  # trailing: when a refused call may be retried (gRPC A6)
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # a restarted service is found again within ~2 s (gRPC's default backoff grows to 120 s, and
    # calls on a channel in backoff fail at once, so a long outage would outlast the restart)
    ("grpc.max_reconnect_backoff_ms", 2000),
]
# gRPC servers set SO_REUSEPORT by default: a second server on a port already served binds silently and
# takes a share of its connections (grpc/grpc#16005), and servers binding port 0 while others stop can
# land on one port, so a client reaches the wrong one (grpc/grpc#10755; the likely cause of a one-off
# "connection refused" from a coordinator that was up, in a test). Without it, a port in use fails to bind.
SERVER_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)]
REFLECTION_PREFIX = "/grpc.reflection."
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
# Streams anyone may open and hold (health and reflection are exempt from keys and roles) run on a pool of their
# own, at most this many at once (more: RESOURCE_EXHAUSTED). On the service's pool, 32 held open (no API key
# needed) stopped every other RPC of the coordinator. gRPC's non-blocking health Watch is no way out: it sends
# under the health servicer's lock, so one Watch client that stops reading stalls every Check.
MAX_REFLECTION_STREAMS = 2
MAX_HEALTH_WATCHES = 8
HEALTH_PORT_MAX_REQUEST_BYTES = 4096  # a HealthCheckRequest names one service; the port is plaintext and open


def retry_pushback_s(exc: grpc.RpcError) -> float | None:
    """Seconds a RESOURCE_EXHAUSTED refusal asked the caller to wait before a retry (`RETRY_PUSHBACK_METADATA`); None:
    no such refusal, or one that did not ask (it never succeeds: a write too large, a full namespace)."""
    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    trailing = getattr(exc, "trailing_metadata", None)  # grpc.RpcError itself declares none; calls' errors have it
    for key, value in (trailing() if trailing is not None else None) or ():
        if key == RETRY_PUSHBACK_METADATA:
            try:
                return max(int(value), 0) / 1000
            except ValueError:
                return None
    return None


def server_options(max_receive_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """SERVER_OPTIONS with the largest request a server reads: gRPC refuses a larger one unread
    (RESOURCE_EXHAUSTED), where a handler would only refuse it after reading and parsing it."""
    return [
        *(o for o in SERVER_OPTIONS if o[0] != "grpc.max_receive_message_length"),
        ("grpc.max_receive_message_length", max_receive_bytes),
    ]


OTHER_CALLS = 8  # a model service's calls beside a batch's: Prefill, Close, GetModelInfo, GetStats, health


def handler_threads(max_workers: int, max_batch_size: int) -> int:
    """A model service's gRPC pool: each row of a batch holds a handler thread while the batch runs, so a pool of 16
    never let `--max-batch-size 32` batch more than 16 rows (found by probing: 672 batches, none over 16)."""
    return max(max_workers, max_batch_size + OTHER_CALLS)


def _torch_error(exc: BaseException, name: str) -> bool:
    """Whether `exc` is torch's exception class `name`, by name: this module does not import torch (the light
    client uses it)."""
    return any(c.__name__ == name and c.__module__.startswith("torch") for c in type(exc).__mro__)


CUDA_OUT_OF_MEMORY = 2  # cudaErrorMemoryAllocation: a cudaMalloc outside torch's allocator, a workspace
# cudaError_t values after which the CUDA context is lost (ECC uncorrectable, an NVLink uncorrectable, a contained
# error, an illegal address, a launch timeout, a destroyed context, a device-side assert, a hardware stack error, an
# illegal instruction, a misaligned address, an invalid address space or pc, a launch failure): every later call on
# the device fails too, and only a new process recovers
STICKY_CUDA_ERRORS = frozenset({214, 220, 226, 700, 702, 709, 710, 714, 715, 716, 717, 718, 719})


def _out_of_device_memory(exc: BaseException) -> bool:
    """A GPU's memory full (of KV caches under load: overload, not a bug): torch's OutOfMemoryError, or a CUDA
    error of that code (review)."""
    cuda_oom = _torch_error(exc, "AcceleratorError") and getattr(exc, "error_code", None) == CUDA_OUT_OF_MEMORY
    return cuda_oom or _torch_error(exc, "OutOfMemoryError")


def _device_failed(exc: BaseException) -> bool:
    """A sticky CUDA error (torch's AcceleratorError carries the cudaError_t): the process must be restarted. Any
    other CUDA error (an odd shape's invalid configuration, say) fails its call only, as any bug does."""
    return _torch_error(exc, "AcceleratorError") and getattr(exc, "error_code", None) in STICKY_CUDA_ERRORS


def _first_line(exc: BaseException) -> str:
    return str(exc).split("\n", 1)[0][:200]


def _status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, CalispecError):
        return getattr(grpc.StatusCode, exc.code), str(exc)
    if _out_of_device_memory(exc):  # it was INTERNAL, logged as a bug (found by a CUDA audit)
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"the device ran out of memory; retry later ({_first_line(exc)})"
    if _device_failed(exc):  # another replica can serve the call: UNAVAILABLE is what clients retry
        return grpc.StatusCode.UNAVAILABLE, f"{STOPS_SERVING} ({_first_line(exc)})"
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class _Undecodable:
    """A request whose bytes do not parse: answered INVALID_ARGUMENT (gRPC itself says INTERNAL)."""

    error: Exception


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:
            return _Undecodable(exc)

    return parse


def _check_decoded(request: Any) -> None:
    if isinstance(request, _Undecodable):
        raise InvalidArgument(f"malformed request: not a valid protobuf message ({request.error})")


class ErrorInterceptor(grpc.ServerInterceptor):
    """Maps domain errors to their gRPC status; anything else is a bug: logged, INTERNAL. A failed device (a sticky
    CUDA error) calls `on_device_failure`: the server's health turns NOT_SERVING for good, so that a load balancer stops
    sending it calls and a liveness probe restarts it (it stayed SERVING, every call failing; found by a CUDA audit)."""

    def __init__(self) -> None:
        self.on_device_failure: Callable[[], None] = lambda: None
        self._device_lost = threading.Lock()  # held from the first failure on

    def _device_failure(self, exc: BaseException, message: str) -> None:
        """The first one with its traceback, then once a call (until a restart every call on the device fails; a
        batch's rows fail at once, so the first is taken under a lock)."""
        if not self._device_lost.acquire(blocking=False):
            log.warning("%s", message)
            return
        log.error("%s: health NOT_SERVING until the process is restarted", message, exc_info=exc)
        self.on_device_failure()

    def intercept_service(self, continuation: Callable, handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        if handler.unary_unary:
            handler = handler._replace(request_deserializer=_tolerant(handler.request_deserializer))
            return handler._replace(unary_unary=self._wrap_unary(handler.unary_unary))
        if handler.unary_stream:
            handler = handler._replace(request_deserializer=_tolerant(handler.request_deserializer))
            return handler._replace(unary_stream=self._wrap_stream(handler.unary_stream))
        # client- and bidi-streaming (reflection; an access guard's refusal of one gets its status too)
        if handler.stream_unary:
            return handler._replace(stream_unary=self._wrap_unary(handler.stream_unary))
        return handler._replace(stream_stream=self._wrap_stream(handler.stream_stream))

    def _abort(self, context: grpc.ServicerContext, exc: BaseException) -> None:
        code, message = _status_for(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.exception("unhandled error in handler")
        elif _device_failed(exc):
            self._device_failure(exc, message)
        elif not isinstance(exc, CalispecError):  # the device's memory: the operator's to size, said once a call
            log.warning("%s", message)
        if (retry_after_s := getattr(exc, "retry_after_s", None)) is not None:  # gRPC's retry policies read it
            context.set_trailing_metadata(((RETRY_PUSHBACK_METADATA, str(math.ceil(retry_after_s * 1000))),))
        context.abort(code, message)

    def _wrap_unary(self, fn: Callable) -> Callable:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                _check_decoded(request)
                return fn(request, context)
            except grpc.RpcError:
                raise  # context.abort() already set the status
            except Exception as exc:
                self._abort(context, exc)

        return wrapped

    def _wrap_stream(self, fn: Callable) -> Callable:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Iterable[Any]:
            try:
                _check_decoded(request)
                yield from fn(request, context)
            except grpc.RpcError:
                raise
            except Exception as exc:
                self._abort(context, exc)

        return wrapped


class SidePoolInterceptor(grpc.ServerInterceptor):
    """The server-streaming or bidi-streaming RPCs under `prefix` run on a pool of their own, at most `streams` at
    once (more: RESOURCE_EXHAUSTED), so that clients holding them open never take the workers of other RPCs.
    Outermost of a server's interceptors: gRPC reads the pool off the handler it is finally given."""

    def __init__(self, prefix: str, streams: int) -> None:
        self._prefix = prefix
        # a thread more than the streams: a stream over the limit is refused at once, not queued behind them
        self._pool = futures.ThreadPoolExecutor(max_workers=streams + 1, thread_name_prefix="side-pool")
        self._slots = threading.BoundedSemaphore(streams)

    def intercept_service(self, continuation: Callable, handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self._prefix):
            return handler
        if handler.unary_stream:
            return handler._replace(unary_stream=self._on_own_pool(handler.unary_stream))
        if handler.stream_stream:
            return handler._replace(stream_stream=self._on_own_pool(handler.stream_stream))
        return handler

    def _on_own_pool(self, fn: Callable) -> Callable:
        # A plain generator, even around gRPC's non-blocking health Watch (called without its callback, it
        # returns a blocking iterator): the stream's sends then happen on this pool's thread, never under a lock.
        def wrapped(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            if not self._slots.acquire(blocking=False):
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"too many {self._prefix} streams open; retry later")
            try:
                yield from fn(request, context)
            finally:
                self._slots.release()

        wrapped.experimental_thread_pool = self._pool  # type: ignore[attr-defined]  # gRPC runs it there
        return wrapped


def side_pools() -> list[grpc.ServerInterceptor]:
    """A server's first interceptors: health Watch and reflection streams on pools of their own."""
    return [
        SidePoolInterceptor(HEALTH_WATCH, MAX_HEALTH_WATCHES),
        SidePoolInterceptor(REFLECTION_PREFIX, MAX_REFLECTION_STREAMS),
    ]


Registrar = Callable[[grpc.Server], None]


def create_grpc_server(
    address: str,
    registrars: Sequence[Registrar],
    service_names: Sequence[str],
    max_workers: int = 16,
    tls: TlsConfig | None = None,
    require_client_cert: bool = True,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
    health_port: int | None = None,
    observe: Observe | None = None,
    max_receive_bytes: int = MAX_MESSAGE_BYTES,
) -> tuple[ManagedServer, int, health.HealthServicer]:
    """Build a server with our services, grpc.health.v1, reflection and the interceptors.

    `address` may use port 0; the bound port is returned. The server is not started; its
    `/metrics` endpoint (when `observe.metrics_port` is set) already serves.
    `interceptors` (access control) run inside the error interceptor, so the domain errors they
    raise get their status; the observability interceptor (request ids, metrics, drain) runs
    outside both, and `side_pools` outside all (health Watch and reflection streams). `health_port`:
    also serve grpc.health.v1 alone, plaintext, there (the kubelet's gRPC probe speaks no TLS); the
    returned server starts and stops both.
    `max_receive_bytes`: the largest request read (a server open to the public: what a valid request needs).
    """
    # imported here: tools (and the light client install) use this module's channels without them
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    from calispec_core.metrics import RpcMetrics, serve_metrics
    from calispec_core.observability import DrainGate, ManagedServer, ObservabilityInterceptor, Observe, host_of

    observe = observe or Observe()
    rpc_metrics = RpcMetrics(observe.registry)
    gate = DrainGate(observe.admission)
    errors = ErrorInterceptor()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        interceptors=[
            *side_pools(),
            ObservabilityInterceptor(rpc_metrics, gate, observe.originates_ids),
            errors,
            *interceptors,
        ],
        options=server_options(max_receive_bytes),
    )
    for register in registrars:
        register(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in [*service_names, ""]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    errors.on_device_failure = lambda: _device_lost(health_servicer, rpc_metrics, gate)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    port = bind_port(server, address, tls, require_client_cert)
    if health_port is not None:
        server = _with_health_port(server, health_servicer, address.rpartition(":")[0], health_port)
    endpoint = None
    if observe.metrics_port is not None:
        endpoint = serve_metrics(observe.registry, host_of(address), observe.metrics_port)
    return ManagedServer(server, health_servicer, gate, rpc_metrics, endpoint), port, health_servicer


def _device_lost(health_servicer: Any, rpc_metrics: Any, gate: Any) -> None:
    """Every health service NOT_SERVING, kept so (later `set` calls, e.g. the memory link's, are ignored), and new
    sessions refused at once: their clients go to another replica without a call on the failed device."""
    rpc_metrics.device_failed.set(1)
    health_servicer.enter_graceful_shutdown()
    gate.start_draining(f"{DEVICE_FAILED}: this replica is out of service until it is restarted")


def bind_port(server: grpc.Server, address: str, tls: TlsConfig | None = None, require_client_cert: bool = True) -> int:
    """Bind `address` (host:port, port may be 0); returns the bound port.

    With TLS, `require_client_cert` makes it mutual: peers must present a certificate of the CA.
    """
    tls = tls or TlsConfig()
    tls.check(address.rpartition(":")[0])
    # checked before binding: gRPC reports a bad certificate, key or CA as a failure to bind
    credentials = _server_credentials(tls, require_client_cert) if tls.enabled else None
    try:
        if credentials is not None:
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as exc:  # newer gRPC raises where older ones returned 0
        raise OSError(f"could not bind {address} (in use?): {exc}") from exc
    if port == 0:
        raise OSError(f"could not bind {address} (in use?)")
    return port


def _server_credentials(tls: TlsConfig, require_client_cert: bool) -> grpc.ServerCredentials:
    cert, key, ca = tls.read_checked()
    return grpc.ssl_server_credentials([(key, cert)], ca, require_client_auth=require_client_cert)


def _channel_options(server_name: str | None) -> list[tuple[str, Any]]:
    # The peer's certificate must name its role (e.g. "target"), whatever address we dial.
    return [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", server_name)] if server_name else CHANNEL_OPTIONS


def channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    """Trust the CA; present this process's certificate (mutual TLS), checked for that use first: its peer alone
    would log why the handshake failed (the caller saw "no service at ..." after its connect timeout)."""
    cert, key, ca = tls.read_checked("clientAuth")
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def make_channel(address: str, tls: TlsConfig | None = None, server_name: str | None = None) -> grpc.Channel:
    """A channel to `address`; with TLS, the server must prove `server_name` (default: the address's host)."""
    if tls is None or not tls.enabled:
        return grpc.insecure_channel(address, options=channel_options(address, CHANNEL_OPTIONS))
    options = channel_options(address, _channel_options(server_name))
    return grpc.secure_channel(address, channel_credentials(tls), options=options)


def make_aio_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=channel_options(address, CHANNEL_OPTIONS))


def wait_for_ready(channel: grpc.Channel, timeout: float) -> None:
    """Block until the channel connects, or raise grpc.FutureTimeoutError."""
    grpc.channel_ready_future(channel).result(timeout=timeout)


class _ServerWithHealthPort(grpc.Server):
    """The service's server plus a plaintext health-only server; starts and stops both."""

    def __init__(self, main: grpc.Server, health_only: grpc.Server) -> None:
        self._main, self._health = main, health_only

    def start(self) -> None:
        self._main.start()
        self._health.start()

    def stop(self, grace: float | None) -> Any:
        event = self._main.stop(grace)
        self._health.stop(None)  # after the main server: probes see SERVING until it stops
        return event

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._main.wait_for_termination(timeout)

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Any) -> None:
        self._main.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: Any) -> None:
        self._main.add_registered_method_handlers(service_name, method_handlers)

    def add_insecure_port(self, address: str) -> int:
        return self._main.add_insecure_port(address)

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        return self._main.add_secure_port(address, server_credentials)


def _with_health_port(main: grpc.Server, servicer: health.HealthServicer, host: str, port: int) -> grpc.Server:
    from grpc_health.v1 import health_pb2_grpc

    options = server_options(HEALTH_PORT_MAX_REQUEST_BYTES)
    health_only = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=side_pools(), options=options)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, health_only)
    bind_port(health_only, f"{host}:{port}", TlsConfig(plaintext=True))  # the kubelet's probe speaks no TLS
    return _ServerWithHealthPort(main, health_only)
