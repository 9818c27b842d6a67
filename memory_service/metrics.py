"""The memory service's Prometheus metrics: events received, dropped and committed; tables."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from calispec_core.metrics import PREFIX
from memory_service.store import CorrectionStore


class MemoryMetrics:
    def __init__(self, registry: CollectorRegistry, store: CorrectionStore) -> None:
        self.received = Counter(
            f"{PREFIX}memory_events_received", "Rejection events accepted by RecordEvents", registry=registry
        )
        self.dropped = Counter(
            f"{PREFIX}memory_events_dropped",
            "Entries (draft, target, count) of refused RecordEvents writes, whatever count each claims "
            "(by status: UNAUTHENTICATED, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...)",
            ["code"],
            registry=registry,
        )
        registry.register(StoreCollector(store))


class StoreCollector(Collector):
    """Commit progress and per-namespace table figures, read at scrape time."""

    def __init__(self, store: CorrectionStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            f"{PREFIX}memory_events_committed",
            "Rejection events committed to SQLite by this process",
            value=self.store.committed_events,
        )
        yield CounterMetricFamily(
            f"{PREFIX}memory_commit_failures",
            "Flushes to SQLite that failed (a full disk, ...); writes are refused until one succeeds",
            value=self.store.commit_failures,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}memory_commit_failing",
            "1 while the last flush failed (writes refused with UNAVAILABLE), else 0",
            value=int(self.store.failing is not None),
        )
        versions = GaugeMetricFamily(
            f"{PREFIX}memory_table_version", "Committed version of a namespace's table", labels=["namespace"]
        )
        pairs = GaugeMetricFamily(f"{PREFIX}memory_table_pairs", "Pairs in a namespace's table", labels=["namespace"])
        for namespace, version in sorted(self.store.committed_versions().items()):
            versions.add_metric([namespace], version)
            pairs.add_metric([namespace], self.store.stats(namespace)[1])
        yield versions
        yield pairs
