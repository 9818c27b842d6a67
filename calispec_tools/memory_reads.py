"""Reads of the memory service that tools share (calibrate, eval, tests): no writer token needed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import MEMORY, TlsConfig
from calispec_core.grpc_server import make_channel


def memory_failure(address: str, exc: Any) -> str:
    """One line for a memory service call that failed (`exc`: a grpc.RpcError), naming the service's address."""
    return f"memory service {address}: {exc.code().name}: {exc.details()}"


def memory_events(memory_address: str, namespace: str, timeout_s: float = 30.0, tls: TlsConfig | None = None) -> int:
    """Rejection events the namespace has ever recorded. `tls`: a client certificate of the CA (mutual TLS)."""
    with make_channel(memory_address, tls, server_name=MEMORY) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        return stub.GetStats(memory_pb2.GetStatsRequest(namespace=namespace), timeout=timeout_s).total_events


def wait_for_events(
    memory_address: str, namespace: str, at_least: int, timeout_s: float = 15.0, tls: TlsConfig | None = None
) -> int:
    """Polls until the memory holds `at_least` events: verifiers ship theirs in the background, so the
    last requests' rejections arrive a sync interval after their replies. Returns the count seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = memory_events(memory_address, namespace, tls=tls)
        if seen >= at_least or time.monotonic() >= deadline:
            return seen
        time.sleep(0.1)


def fetch_pairs(
    memory_address: str, namespace: str = "default", timeout_s: float = 30.0, tls: TlsConfig | None = None
) -> list[tuple[int, int, int]]:
    """All pairs of a namespace up to the service's default cap (GetPairs is a read: no writer token)."""
    with make_channel(memory_address, tls, server_name=MEMORY) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        reply = stub.GetPairs(memory_pb2.GetPairsRequest(namespace=namespace, min_count=1), timeout=timeout_s)
    return [(p.draft_token_id, p.target_token_id, p.count) for p in reply.pairs]


@dataclass(frozen=True)
class TableRead:
    """A namespace's whole table and its counters, read at one version."""

    pairs: list[tuple[int, int, int]]  # (draft, target, count): every pair in the table
    recorded_events: int  # ever recorded
    table_events: int  # the sum of the counts in the table now
    max_pairs: int  # the caps in force: a write past them evicts the lowest-ranked pairs
    max_pairs_per_draft: int
    half_life_s: float  # 0: no decay

    @property
    def dropped_events(self) -> int:
        """Recorded events no longer in the table: evicted by the caps or halved away by decay."""
        return self.recorded_events - self.table_events


def read_table(
    memory_address: str, namespace: str, timeout_s: float = 30.0, tls: TlsConfig | None = None, attempts: int = 20
) -> TableRead:
    """The whole table with GetStats' counters of the same version (retried while writes land in between)."""
    with make_channel(memory_address, tls, server_name=MEMORY) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        for _ in range(attempts):
            stats = stub.GetStats(memory_pb2.GetStatsRequest(namespace=namespace), timeout=timeout_s)
            # The table never holds more pairs than max_pairs (<= the GetPairs limit): ask for all of them.
            request = memory_pb2.GetPairsRequest(namespace=namespace, min_count=1, max_pairs=stats.distinct_pairs)
            reply = stub.GetPairs(request, timeout=timeout_s)
            if reply.version == stats.version:
                pairs = [(p.draft_token_id, p.target_token_id, p.count) for p in reply.pairs]
                return TableRead(pairs, stats.total_events, stats.table_events, stats.max_pairs,
                                 stats.max_pairs_per_draft, stats.half_life_s)  # fmt: skip
    raise RuntimeError(f"{namespace}: the table kept changing between GetStats and GetPairs ({attempts} tries)")
