"""Prometheus plumbing shared by the services: one registry per server, its `/metrics` endpoint.

Each server owns a `CollectorRegistry` (never the process-global one), so several servers in
one process (the tests, `calispec demo`, a Ray worker) keep separate figures. Metric names
follow vLLM's (`vllm:spec_decode_num_draft_tokens`, `time_to_first_token_seconds`, ...) under
the Prometheus-legal prefix `calispec_`. The metric definitions live in one module per service
(`<service>/metrics.py`); what every server shares (RPCs by method and status) lives here.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from calispec_core.limits import host_port

if TYPE_CHECKING:  # it imports torch and transformers (seconds): the memory service needs neither
    from calispec_core.prefix_cache import PrefixCache

PREFIX = "calispec_"
# seconds: from a sub-millisecond RPC on loopback to a long generation on a CPU
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def new_registry() -> CollectorRegistry:
    return CollectorRegistry()


@dataclass
class MetricsEndpoint:
    """A running `/metrics` HTTP server (on its own daemon thread)."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host_port(host, self.port)}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


METRICS_CONNECTIONS = 8  # connections served at once (scrapers); one more is closed unread
METRICS_READ_TIMEOUT_S = 10.0  # a connection silent this long (mid-request, or not reading the reply) is closed
METRICS_CONNECTION_DEADLINE_S = 30.0  # and one open this long, however it trickles (a scrape takes milliseconds)


class _QuietHandler(WSGIRequestHandler):
    def setup(self) -> None:
        self.timeout = self.server.read_timeout_s  # type: ignore[attr-defined]  # socket timeout of the connection
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


class _BoundedMetricsServer(ThreadingMixIn, WSGIServer):
    """prometheus_client's server (a thread per connection) with a bound on connections and a read timeout. It has
    neither: anyone reaching the port held a thread of the service's process per idle connection (probed: 300
    connections, 300 threads; the gRPC workers and the model's threads are started from the same process)."""

    daemon_threads = True

    def __init__(self, host: str, port: int, connections: int, read_timeout_s: float, deadline_s: float) -> None:
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        self.read_timeout_s = read_timeout_s
        self.deadline_s = deadline_s
        self._slots = threading.BoundedSemaphore(connections)
        self._deadline = threading.local()  # the connection this handler thread serves
        super().__init__((host, port), _QuietHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # closed unread: a scraper retries at its next interval
            return
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        # The read timeout is per read: a byte every few seconds held the slot for good.
        self._deadline.value = _ConnectionDeadline(request, self.deadline_s)
        try:
            super().process_request_thread(request, client_address)  # ends in shutdown_request
        finally:
            self._slots.release()

    def shutdown_request(self, request: Any) -> None:
        deadline: _ConnectionDeadline | None = getattr(self._deadline, "value", None)
        self._deadline.value = None
        if deadline is None:  # refused unread, on the accepting thread
            super().shutdown_request(request)
        else:
            deadline.close(lambda: super(_BoundedMetricsServer, self).shutdown_request(request))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that timed out or went away is no error worth a traceback on stderr."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _ConnectionDeadline:
    """Shuts a connection's socket `seconds` after it was accepted, which ends the handler's blocked read or
    write; never after the handler closed it (its descriptor may then be another connection's)."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._closed = False
        self._timer = threading.Timer(seconds, self._shut)
        self._timer.daemon = True
        self._timer.start()

    def _shut(self) -> None:
        with self._lock:
            if not self._closed:
                with contextlib.suppress(OSError):  # the peer went away meanwhile
                    self._sock.shutdown(socket.SHUT_RDWR)

    def close(self, close_socket: Callable[[], None]) -> None:
        self._timer.cancel()
        with self._lock:
            self._closed = True
            close_socket()


def serve_metrics(
    registry: CollectorRegistry,
    host: str,
    port: int,
    connections: int = METRICS_CONNECTIONS,
    read_timeout_s: float = METRICS_READ_TIMEOUT_S,
    deadline_s: float = METRICS_CONNECTION_DEADLINE_S,
) -> MetricsEndpoint:
    """Serve `registry` on http://host:port/metrics (port 0 picks a free one)."""
    try:
        server = _BoundedMetricsServer(host, port, connections, read_timeout_s, deadline_s)
    except OSError as exc:  # "Address already in use" alone named neither the endpoint nor its port (probed)
        raise OSError(exc.errno, f"the metrics endpoint {host_port(host, port)}: {exc.strerror or exc}") from exc
    server.set_app(make_wsgi_app(registry))
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return MetricsEndpoint(host, server.server_port, server, thread)


class RpcMetrics:
    """What every server records for every RPC, by the interceptor in `calispec_core.observability`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            f"{PREFIX}rpc_requests", "RPCs handled, by method and status code", ["method", "code"], registry=registry
        )
        self.duration = Histogram(
            f"{PREFIX}rpc_duration_seconds", "RPC handling time", ["method"], buckets=LATENCY_BUCKETS, registry=registry
        )
        self.in_flight = Gauge(f"{PREFIX}rpc_in_flight", "RPCs being handled now", registry=registry)
        self.draining = Gauge(
            f"{PREFIX}draining", "1 while the server drains before it stops (health NOT_SERVING)", registry=registry
        )
        self.device_failed = Gauge(
            f"{PREFIX}device_failed",
            "1 once a call failed on a sticky CUDA error: health NOT_SERVING until the process restarts",
            registry=registry,
        )


class PrefixCacheCollector(Collector):
    """A model service's prefix cache (calispec_core/prefix_cache.py), read at scrape time."""

    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        stats = self.cache.stats
        yield CounterMetricFamily(f"{PREFIX}prefix_cache_lookups", "Prompts looked up", value=stats.lookups)
        yield CounterMetricFamily(f"{PREFIX}prefix_cache_hits", "Prompts that reused cached KV", value=stats.hits)
        yield CounterMetricFamily(
            f"{PREFIX}prefix_cache_reused_tokens", "Prompt tokens whose prefill a hit saved", value=stats.reused_tokens
        )
        yield GaugeMetricFamily(f"{PREFIX}prefix_cache_tokens", "Prompt tokens cached", value=self.cache.cached_tokens)


def sessions_gauge(registry: CollectorRegistry, count: Callable[[], int]) -> Gauge:
    """Open sessions (KV caches held) of a model service, read at scrape time."""
    gauge = Gauge(f"{PREFIX}sessions_open", "Sessions open (each holds a KV cache)", registry=registry)
    gauge.set_function(count)
    return gauge
