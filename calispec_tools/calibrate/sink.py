"""Sends calibration events to the memory service the way verifiers do: RecordEvents with the writer token."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterable

import grpc

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import MEMORY, TlsConfig, writer_metadata
from calispec_core.grpc_server import make_channel, retry_pushback_s

Pair = tuple[int, int]
MAX_PAIRS_PER_CALL = 50_000  # under the service's 100,000 events per request
RETRY_S = 0.5  # between tries of a write whose reply was lost (the service asks for its own waits: pushbacks)
TRY_TIMEOUT_S = 45.0  # one try (the service's durable wait gives up after 30 s); tries go on until the deadline
# A lost reply (the service may have counted the write): resend the same request, whose write_id the service
# counts at most once. Refused for later (a pushback: over its rate or its share of a commit): nothing was counted,
# resend after the wait asked for. A refusal without one (a write over the burst) never succeeds: it was retried
# for the whole 120 s (found by probing).
_RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class MemoryWriter:
    """Ships each batch of events as they come; `close()` sends the last one durably (so everything sent
    before it is committed too: the service commits in order) and closes the channel."""

    def __init__(
        self,
        address: str,
        namespace: str,
        token: str | None,
        vocab_size: int = 0,
        writer_id: str = "calispec-calibrate",
        tls: TlsConfig | None = None,  # a verifier's certificate when the memory service runs mutual TLS
    ) -> None:
        self.namespace = namespace
        self.vocab_size = vocab_size  # declared with every write: the service refuses another pair's vocabulary
        self._channel = make_channel(address, tls, server_name=MEMORY)
        self._stub = memory_pb2_grpc.MemoryServiceStub(self._channel)
        self._metadata = writer_metadata(token, writer_id)
        self._held: Counter[Pair] = Counter()  # the latest batch, held back to be the durable one
        self.recorded = 0
        self.version = 0

    def check(self, timeout_s: float = 30.0) -> None:
        """One write of no events, before any work: the service checks the token, the namespaces it may write and
        (with `vocab_size` set) the namespace's vocabulary as for every write, and a fresh namespace takes this
        vocabulary. grpc.RpcError where it refuses or does not answer (a refusal came after the whole run)."""
        request = memory_pb2.RecordEventsRequest(namespace=self.namespace, vocab_size=self.vocab_size)
        self._stub.RecordEvents(request, timeout=timeout_s, metadata=self._metadata)

    def send(self, events: Counter[Pair]) -> None:
        if not events:
            return
        self._ship(self._held, durable=False)
        self._held = Counter(events)

    def close(self) -> None:
        try:
            self._ship(self._held, durable=True)
            self._held = Counter()
        finally:
            self._channel.close()

    def _ship(self, events: Counter[Pair], durable: bool, timeout_s: float = 120.0) -> None:
        items = list(events.items())
        for i in range(0, len(items), MAX_PAIRS_PER_CALL):
            last = i + MAX_PAIRS_PER_CALL >= len(items)
            self._record(items[i : i + MAX_PAIRS_PER_CALL], durable and last, timeout_s)

    def _record(self, chunk: Iterable[tuple[Pair, int]], durable: bool, timeout_s: float) -> None:
        pairs = [memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=c) for (d, t), c in chunk]
        request = memory_pb2.RecordEventsRequest(
            namespace=self.namespace,
            events=pairs,
            wait_durable=durable,
            vocab_size=self.vocab_size,
            write_id=uuid.uuid4().hex,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                remaining = max(deadline - time.monotonic(), 1.0)
                reply = self._stub.RecordEvents(request, timeout=min(TRY_TIMEOUT_S, remaining), metadata=self._metadata)
                break
            except grpc.RpcError as exc:
                pushback = retry_pushback_s(exc)
                wait_s = RETRY_S if pushback is None else pushback
                if (exc.code() not in _RETRIED and pushback is None) or time.monotonic() + wait_s >= deadline:
                    raise
                time.sleep(wait_s)
        self.recorded += reply.recorded
        self.version = reply.version
