"""gRPC face of the correction memory: proto in, `CorrectionStore` call, proto out.

Handlers hold no logic of their own; validation and errors live in the store and reach
clients through the shared error interceptor of `calispec.grpc_server`.
"""

from __future__ import annotations

import logging

import grpc

from calispec.grpc_server import create_grpc_server
from calispec.v1 import memory_pb2, memory_pb2_grpc
from memory_service.config import MemoryConfig
from memory_service.store import CorrectionStore, Pair

log = logging.getLogger(__name__)

SERVICE_NAME = memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name


def _pair_counts(pairs: list[Pair]) -> list[memory_pb2.PairCount]:
    return [memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=c) for d, t, c in pairs]


class MemoryServicer(memory_pb2_grpc.MemoryServiceServicer):
    def __init__(self, store: CorrectionStore, max_pairs_default: int) -> None:
        self._store = store
        self._max_pairs_default = max_pairs_default

    def RecordEvents(
        self, request: memory_pb2.RecordEventsRequest, context: grpc.ServicerContext
    ) -> memory_pb2.RecordEventsResponse:
        events = [(e.draft_token_id, e.target_token_id, e.count) for e in request.events]
        recorded, version = self._store.record(request.namespace, events)
        return memory_pb2.RecordEventsResponse(recorded=recorded, version=version)

    def GetPairs(
        self, request: memory_pb2.GetPairsRequest, context: grpc.ServicerContext
    ) -> memory_pb2.GetPairsResponse:
        max_pairs = request.max_pairs or self._max_pairs_default  # 0 = server default cap
        pairs, version = self._store.pairs(request.namespace, request.min_count, max_pairs)
        return memory_pb2.GetPairsResponse(pairs=_pair_counts(pairs), version=version)

    def GetStats(
        self, request: memory_pb2.GetStatsRequest, context: grpc.ServicerContext
    ) -> memory_pb2.GetStatsResponse:
        total, distinct, version = self._store.stats(request.namespace)
        return memory_pb2.GetStatsResponse(total_events=total, distinct_pairs=distinct, version=version)


def create_server(config: MemoryConfig) -> tuple[grpc.Server, int, CorrectionStore]:
    """Open the store and build a server bound to config.host:config.port (not started).

    Returns the bound port (config.port may be 0) and the store, which the caller closes
    after `server.stop()` so that no handler writes to a closed store.
    """
    store = CorrectionStore(config.db_path)
    servicer = MemoryServicer(store, config.max_pairs_default)
    try:
        server, port, _health = create_grpc_server(
            config.address,
            [lambda s: memory_pb2_grpc.add_MemoryServiceServicer_to_server(servicer, s)],
            [SERVICE_NAME],
            max_workers=config.max_workers,
        )
    except BaseException:
        store.close()  # a failed bind must not leave the database open
        raise
    log.debug("memory service bound to %s:%d, db=%s", config.host, port, config.db_path)
    return server, port, store
