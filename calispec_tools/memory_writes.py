"""One RecordEvents of a memory command, sent again while the service says when to retry.

The memory service refuses a write it may admit later (its writer over the rate limit, or with a full share of
the next commit) with RESOURCE_EXHAUSTED and `grpc-retry-pushback-ms`; a refusal without it (a write too large, a
full namespace) never succeeds and is raised at once. A refused write changed nothing, so sending it again is safe.
"""

from __future__ import annotations

import time

import grpc

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.grpc_server import retry_pushback_s


def record_when_admitted(
    stub: memory_pb2_grpc.MemoryServiceStub,
    request: memory_pb2.RecordEventsRequest,
    timeout_s: float,
    metadata: tuple[tuple[str, str], ...],
) -> memory_pb2.RecordEventsResponse:
    """RecordEvents, retried after each pushback until `timeout_s` is spent (then the last refusal is raised)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return stub.RecordEvents(request, timeout=max(deadline - time.monotonic(), 1.0), metadata=metadata)
        except grpc.RpcError as exc:
            wait_s = retry_pushback_s(exc)
            if wait_s is None or time.monotonic() + wait_s >= deadline:
                raise
            time.sleep(wait_s)
