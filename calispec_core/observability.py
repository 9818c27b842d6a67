"""What every server does around each RPC, and how it drains before it stops.

`ObservabilityInterceptor` (the outermost interceptor) binds the caller's `x-request-id` (the
coordinator makes one for its public RPCs when the client sent none), opens an OpenTelemetry
span when tracing is on, records the RPC in the server's `RpcMetrics`, logs one DEBUG access
line, and asks the `DrainGate` whether the RPC may start.

Draining (SIGTERM; `ManagedServer.drain`): health turns NOT_SERVING at once for every service
name, *admission* RPCs (the ones that start new work: Generate, Prefill) get UNAVAILABLE, and
everything else still runs, so requests and sessions already open finish. The drain ends when
no admitted RPC is running and the service's `idle()` holds (e.g. no open sessions), or when
its time bound runs out; then the gRPC server stops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import CollectorRegistry

from calispec_core.metrics import MetricsEndpoint, RpcMetrics, new_registry
from calispec_core.request_context import bound_request_id, from_metadata, new_request_id
from calispec_core.timing import now_ns
from calispec_core.tracing import server_span

if TYPE_CHECKING:
    from grpc_health.v1 import health

log = logging.getLogger(__name__)
QUIET_METHODS = ("/grpc.health.v1.Health/", "/grpc.reflection.")  # probes: counted, not logged


@dataclass
class Observe:
    """A server's observability settings: its metrics registry and port, and its drain rules."""

    registry: CollectorRegistry = field(default_factory=new_registry)
    metrics_port: int | None = None  # None: no /metrics endpoint; 0: a free port
    admission: Sequence[str] = ()  # full method names refused while draining (they start new work)
    originates_ids: Sequence[str] = ()  # full method names that make a request id when the caller sent none


def host_of(address: str) -> str:
    """ "HOST:PORT" or "[V6]:PORT" -> the host, to bind /metrics next to the gRPC port."""
    return address.rsplit(":", 1)[0].strip("[]")


def short_method(full: str) -> str:
    """ "/calispec.v1.Coordinator/Generate" -> "Coordinator/Generate" (a compact metric label)."""
    service, _, name = full.lstrip("/").rpartition("/")
    return f"{service.rsplit('.', 1)[-1]}/{name}"


class DrainGate:
    """Counts running admission RPCs and refuses new ones once draining starts."""

    def __init__(self, admission: Iterable[str]) -> None:
        self.admission = frozenset(admission)
        self.draining = False
        self.refusal = "the server is draining before shutdown"
        self._running = 0
        self._cond = threading.Condition()

    def enter(self, method: str) -> bool:
        return self.admit() if method in self.admission else True

    def leave(self, method: str) -> None:
        with self._cond:
            if method in self.admission:
                self._running -= 1
            self._cond.notify_all()  # any RPC may have closed a session: drain() re-checks idle()

    def admit(self) -> bool:
        """Count new work that does not arrive as a gRPC method (the coordinator's HTTP requests);
        False while draining. Pair each True with `release()`."""
        with self._cond:
            if self.draining:
                return False
            self._running += 1
            return True

    def release(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def start_draining(self, refusal: str | None = None) -> None:
        """Refuse new work from now on, saying `refusal` (default: a shutdown's drain)."""
        with self._cond:
            self.draining = True
            self.refusal = refusal or self.refusal

    def wait_idle(self, idle: Callable[[], bool], timeout_s: float) -> bool:
        """True once no admission RPC runs and idle() holds; False when timeout_s ran out first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not (self._running == 0 and idle()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))  # also re-checks idle() for state that changes without an RPC
            return True


class ObservabilityInterceptor(grpc.ServerInterceptor):
    def __init__(self, metrics: RpcMetrics, gate: DrainGate, originates_ids: Iterable[str] = ()) -> None:
        self.metrics = metrics
        self.gate = gate
        self.originates_ids = frozenset(originates_ids)

    def intercept_service(self, continuation: Callable, details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method, metadata = details.method, details.invocation_metadata
        # every kind of call: the request side (one message or a stream of them) is passed through as it is;
        # server reflection's calls stream both ways
        for kind in ("unary_unary", "stream_unary"):
            if fn := getattr(handler, kind):
                return handler._replace(**{kind: self._observed_call(fn, method, metadata)})
        for kind in ("unary_stream", "stream_stream"):
            if fn := getattr(handler, kind):
                return handler._replace(**{kind: self._observed_stream(fn, method, metadata)})
        return handler

    def _observed_call(self, fn: Callable, method: str, metadata: Any) -> Callable:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            with self._observe(method, metadata, context):
                return fn(request, context)

        return call

    def _observed_stream(self, fn: Callable, method: str, metadata: Any) -> Callable:
        def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            with self._observe(method, metadata, context):
                yield from fn(request, context)

        return stream

    @contextmanager
    def _observe(self, method: str, metadata: Sequence[tuple[str, Any]] | None, context: Any) -> Iterator[None]:
        label = short_method(method)
        request_id = from_metadata(metadata)
        if request_id is None and method in self.originates_ids:
            request_id = new_request_id()
        if not self.gate.enter(method):
            self.metrics.requests.labels(label, grpc.StatusCode.UNAVAILABLE.name).inc()
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.gate.refusal}; retry elsewhere")
        start = now_ns()
        self.metrics.in_flight.inc()
        failed: BaseException | None = None
        try:
            with bound_request_id(request_id), server_span(method, metadata, request_id):
                try:
                    yield
                except BaseException as exc:
                    failed = exc
                    raise
                finally:
                    code = _status(context, failed)
                    seconds = (now_ns() - start) / 1e9
                    self.metrics.requests.labels(label, code).inc()
                    self.metrics.duration.labels(label).observe(seconds)
                    if not method.startswith(QUIET_METHODS):
                        log.debug("rpc %s %s %.1fms", label, code, seconds * 1e3)
        finally:
            self.metrics.in_flight.dec()
            self.gate.leave(method)


# A client's deadline reaches the server as a timeout, so the server's runs out a few ms after the client's: the
# client's cancel at its own deadline arrives with that much left (probed: 7-8 ms on a loaded 2-core VM).
DEADLINE_SLACK_S = 0.1


def ended_by_deadline(context: Any) -> bool:
    """Whether a call that ended under its handler ended for its deadline (as its client sees it), not a cancel."""
    left = context.time_remaining()  # gRPC gives ~9.2e18 for a call without a deadline, never None
    return left is not None and left <= DEADLINE_SLACK_S


def _status(context: Any, failed: BaseException | None) -> str:
    """The status a call ended with, as its client saw it where the server can tell. A call that ended under its handler
    (its client left, its deadline passed) is CANCELLED or DEADLINE_EXCEEDED: the read of a request stream (server
    reflection's) then raises a bare RpcError, counted UNKNOWN as a bug would be. Best effort: such a read can also end
    as if the client had closed its stream, and a handler that returns before the call turns inactive counts OK."""
    if isinstance(failed, GeneratorExit):
        return grpc.StatusCode.CANCELLED.name  # the client went away mid-stream
    code = context.code() if hasattr(context, "code") else None
    if code is not None:
        return code.name
    if hasattr(context, "is_active") and hasattr(context, "time_remaining") and not context.is_active():
        return (grpc.StatusCode.DEADLINE_EXCEEDED if ended_by_deadline(context) else grpc.StatusCode.CANCELLED).name
    return grpc.StatusCode.UNKNOWN.name if failed is not None else grpc.StatusCode.OK.name


class ManagedServer:
    """A `grpc.Server` with its health servicer, `/metrics` endpoint and graceful drain.

    Everything else (add_insecure_port, wait_for_termination, ...) goes to the gRPC server.
    `idle` is the service's own "nothing left to finish" test (draft/target: no open session).
    """

    def __init__(
        self,
        server: grpc.Server,
        health_servicer: health.HealthServicer,
        gate: DrainGate,
        metrics: RpcMetrics,
        endpoint: MetricsEndpoint | None,
    ) -> None:
        self.server = server
        self.health = health_servicer
        self.gate = gate
        self.rpc_metrics = metrics
        self.metrics_endpoint = endpoint
        self.idle: Callable[[], bool] = lambda: True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)

    @property
    def metrics_url(self) -> str | None:
        return self.metrics_endpoint.url if self.metrics_endpoint else None

    def start(self) -> None:
        self.server.start()

    def drain(self, timeout_s: float) -> bool:
        """NOT_SERVING, refuse new work, wait (at most timeout_s) for open work; True if all finished."""
        self.health.enter_graceful_shutdown()
        self.gate.start_draining()
        self.rpc_metrics.draining.set(1)
        log.info("draining: health NOT_SERVING, new requests refused, waiting up to %.0fs", timeout_s)
        drained = self.gate.wait_idle(self.idle, timeout_s)
        if not drained:
            log.warning("drain timed out after %.0fs; stopping with work still open", timeout_s)
        return drained

    def stop(self, grace: float | None) -> threading.Event:
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.stop()
            self.metrics_endpoint = None
        return self.server.stop(grace)
