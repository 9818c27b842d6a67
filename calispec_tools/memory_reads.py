"""Reads of the memory service that tools share (calibrate, eval, tests): no writer token needed."""

from __future__ import annotations

import time

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import MEMORY, TlsConfig
from calispec_core.grpc_server import make_channel


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
