"""The target's link to the memory service: ships rejection events, refreshes the pair table.

Runs in one background thread, so verification never waits on it: each sync first sends the
table's unflushed events (RecordEvents), then fetches a fresh snapshot (GetPairs). Doing both
in one thread, in that order, means a snapshot is never fetched while a batch is in flight,
which is what keeps `PairTable` free of double counting. If the memory service is down the
verifier keeps serving with its last table plus its own local counts, and retries.
"""

from __future__ import annotations

import logging
import threading

import grpc

from calispec.grpc_server import make_channel
from calispec.v1 import memory_pb2, memory_pb2_grpc
from target_service.pair_table import PairTable

log = logging.getLogger(__name__)


class MemoryLink:
    def __init__(
        self,
        address: str,
        namespace: str,
        table: PairTable,
        sync_interval_s: float = 1.0,
        max_pairs: int = 65536,
        rpc_timeout_s: float = 5.0,
    ) -> None:
        self.address = address
        self.namespace = namespace
        self.table = table
        self.sync_interval_s = sync_interval_s
        self.max_pairs = max_pairs
        self.rpc_timeout_s = rpc_timeout_s
        self.connected = False  # outcome of the last sync; reported in logs (metrics: later issue)
        self._channel = make_channel(address)
        self._stub = memory_pb2_grpc.MemoryServiceStub(self._channel)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-link", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop syncing, then make one last attempt to ship what is left (bounded by the RPC timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.flush()
        self._channel.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sync()
            self._stop.wait(self.sync_interval_s)

    def sync(self) -> bool:
        """Flush, then refresh; True when both reached the memory service."""
        ok = self.flush() and self.refresh()
        if ok != self.connected:
            log.log(
                logging.INFO if ok else logging.WARNING,
                "memory service %s %s",
                self.address,
                "reachable" if ok else "unreachable: serving with the last table and local counts",
            )
        self.connected = ok
        return ok

    def flush(self) -> bool:
        batch = self.table.take_unflushed()
        if batch is None:
            return True
        events = [memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=c) for d, t, c in batch.pairs()]
        request = memory_pb2.RecordEventsRequest(namespace=self.namespace, events=events)
        try:
            response = self._stub.RecordEvents(request, timeout=self.rpc_timeout_s)
        except grpc.RpcError as exc:
            self.table.mark_failed(batch.batch_id)
            log.debug("RecordEvents failed: %s", exc)
            return False
        self.table.mark_flushed(batch.batch_id, response.version)
        return True

    def refresh(self) -> bool:
        # min_count 1: λ is per request (it may be 0), so the table must hold every recorded pair
        request = memory_pb2.GetPairsRequest(namespace=self.namespace, min_count=1, max_pairs=self.max_pairs)
        try:
            response = self._stub.GetPairs(request, timeout=self.rpc_timeout_s)
        except grpc.RpcError as exc:
            log.debug("GetPairs failed: %s", exc)
            return False
        pairs = [(p.draft_token_id, p.target_token_id, p.count) for p in response.pairs]
        self.table.replace_snapshot(pairs, response.version)
        return True
