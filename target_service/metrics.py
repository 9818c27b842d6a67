"""The target service's Prometheus metrics: verification, batching, sessions, the memory link.

Counters move from the results the servicer already returns (`VerifyResult`); gauges of state
(queue depth, sessions, table, link) are read at scrape time, so no domain code knows metrics.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from calispec_core.metrics import PREFIX, PrefixCacheCollector, sessions_gauge
from target_service.engine import TargetEngine, VerifyResult
from target_service.memory_link import MemoryLink
from target_service.pair_table import PairTable

QUEUE_DEPTH = f"{PREFIX}verify_queue_depth"  # the GPU overlay's HPA scales on it (deploy/k8s)


class TargetMetrics:
    def __init__(self, registry: CollectorRegistry, engine: TargetEngine, link: MemoryLink | None) -> None:
        self.rounds = Counter(f"{PREFIX}verify_rounds", "Verify calls answered (one per round)", registry=registry)
        self.draft_tokens = Counter(f"{PREFIX}verify_draft_tokens", "Draft tokens verified", registry=registry)
        self.accepted = Counter(
            f"{PREFIX}verify_accepted_tokens", "Draft tokens accepted (rescued included)", registry=registry
        )
        self.rescued = Counter(
            f"{PREFIX}verify_rescued_tokens", "Draft tokens accepted by a CSD rescue", registry=registry
        )
        self.withheld = Counter(
            f"{PREFIX}verify_withheld_rescues",
            "Rejected draft tokens CSD would have rescued but the meaning guard refused (a changed numeral, "
            "operator or special token); at most one a round, the rejection that ended it",
            registry=registry,
        )
        self.rejections = Counter(
            f"{PREFIX}rejection_events", "Rejection events counted into the correction memory", registry=registry
        )
        self.batch_size = Histogram(
            f"{PREFIX}verify_batch_size",
            "Rows in the target forward each Verify ran in (observed once per Verify)",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64),
            registry=registry,
        )
        queue_depth = Gauge(QUEUE_DEPTH, "Verify rows waiting for the next batched forward", registry=registry)
        queue_depth.set_function(engine.scheduler.queue_depth)
        self.sessions = sessions_gauge(registry, lambda: len(engine.sessions))
        registry.register(MemoryTableCollector(engine.table, link))
        if engine.prefix_cache is not None:
            registry.register(PrefixCacheCollector(engine.prefix_cache))

    def verified(self, num_draft: int, result: VerifyResult) -> None:
        self.rounds.inc()
        self.draft_tokens.inc(num_draft)
        self.accepted.inc(result.accepted_count)
        self.rescued.inc(len(result.rescued_positions))
        self.withheld.inc(result.withheld_rescues)
        self.rejections.inc(result.rejections)
        self.batch_size.observe(result.batch_size)


class MemoryTableCollector(Collector):
    """The verifier's pair table and its link to the memory service, read at scrape time."""

    def __init__(self, table: PairTable, link: MemoryLink | None) -> None:
        self.table = table
        self.link = link

    def collect(self) -> Iterator[Metric]:
        stats = self.table.stats()
        yield GaugeMetricFamily(
            f"{PREFIX}memory_table_version", "Version of the installed memory snapshot (-1: none)", value=stats.version
        )
        yield GaugeMetricFamily(
            f"{PREFIX}memory_table_pairs", "Pairs in the installed memory snapshot", value=stats.snapshot_pairs
        )
        yield GaugeMetricFamily(
            f"{PREFIX}memory_local_events", "Local rejection events not in a snapshot yet", value=stats.local_events
        )
        if self.link is None:
            return
        status = self.link.status()
        yield GaugeMetricFamily(
            f"{PREFIX}memory_link_up", "1 while the memory service is reachable", value=status.connected
        )
        yield GaugeMetricFamily(
            f"{PREFIX}memory_link_seconds_since_update",
            "Seconds since the last message on the watch stream (-1: none yet)",
            value=-1 if status.seconds_since_update is None else status.seconds_since_update,
        )
        yield CounterMetricFamily(f"{PREFIX}memory_link_reconnects", "Watch streams re-opened", value=status.reconnects)
        yield CounterMetricFamily(
            f"{PREFIX}memory_link_flush_failures", "RecordEvents calls that failed", value=status.flush_failures
        )
