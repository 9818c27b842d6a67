"""Prometheus plumbing shared by the services: one registry per server, its `/metrics` endpoint.

Each server owns a `CollectorRegistry` (never the process-global one), so several servers in
one process (the tests, `calispec demo`, a Ray worker) keep separate figures. Metric names
follow vLLM's (`vllm:spec_decode_num_draft_tokens`, `time_to_first_token_seconds`, ...) under
the Prometheus-legal prefix `calispec_`. The metric definitions live in one module per service
(`<service>/metrics.py`); what every server shares (RPCs by method and status) lives here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # it imports torch and transformers (seconds): the memory service needs neither
    from calispec_core.prefix_cache import PrefixCache

PREFIX = "calispec_"
# seconds: from a sub-millisecond RPC on loopback to a long generation on a CPU
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def new_registry() -> CollectorRegistry:
    return CollectorRegistry()


@dataclass
class MetricsEndpoint:
    """A running `/metrics` HTTP server (prometheus_client's, on its own daemon thread)."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> MetricsEndpoint:
    """Serve `registry` on http://host:port/metrics (port 0 picks a free one)."""
    server, thread = start_http_server(port, addr=host, registry=registry)
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
