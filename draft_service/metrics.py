"""The draft service's Prometheus metrics (RPC counts and latencies come from calispec_core)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from calispec_core.metrics import PREFIX, PrefixCacheCollector, sessions_gauge
from draft_service.proposer import Proposer


class DraftMetrics:
    def __init__(self, registry: CollectorRegistry, proposer: Proposer) -> None:
        self.proposals = Counter(f"{PREFIX}draft_proposals", "Propose calls answered", registry=registry)
        self.proposed_tokens = Counter(f"{PREFIX}draft_proposed_tokens", "Draft tokens proposed", registry=registry)
        self.sessions = sessions_gauge(registry, lambda: len(proposer.sessions))
        if proposer.prefix_cache is not None:
            registry.register(PrefixCacheCollector(proposer.prefix_cache))

    def proposed(self, num_tokens: int) -> None:
        self.proposals.inc()
        self.proposed_tokens.inc(num_tokens)
