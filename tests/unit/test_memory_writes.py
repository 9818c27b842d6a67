"""record_when_admitted: a memory command's write, sent again only when the service says when."""

from __future__ import annotations

import grpc
import pytest

from calispec.v1 import memory_pb2
from calispec_core.grpc_server import RETRY_PUSHBACK_METADATA
from calispec_tools.memory_writes import record_when_admitted


class Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, pushback_ms: str | None) -> None:
        self._code = code
        self._trailing = ((RETRY_PUSHBACK_METADATA, pushback_ms),) if pushback_ms is not None else ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "refused"

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing


class Stub:
    def __init__(self, *refusals: Refused) -> None:
        self.refusals = list(refusals)
        self.calls = 0

    def RecordEvents(self, request: object, timeout: float, metadata: object) -> memory_pb2.RecordEventsResponse:
        self.calls += 1
        if self.refusals:
            raise self.refusals.pop(0)
        return memory_pb2.RecordEventsResponse(recorded=3, version=7)


REQUEST = memory_pb2.RecordEventsRequest(namespace="ns")


def test_a_refusal_with_a_pushback_is_sent_again() -> None:
    """An import or a seed met the writer's full share of the next commit (or its rate) and failed, where the
    same write a commit later is admitted."""
    stub = Stub(Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "1"), Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "0"))
    assert record_when_admitted(stub, REQUEST, 30, ()).version == 7
    assert stub.calls == 3


@pytest.mark.parametrize(
    "refusal",
    [
        Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, None),  # never admissible (too large, a full namespace)
        Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "60000"),  # later than the command's timeout
        Refused(grpc.StatusCode.UNAVAILABLE, "1"),
    ],
)
def test_other_refusals_are_raised_at_once(refusal: Refused) -> None:
    stub = Stub(refusal)
    with pytest.raises(grpc.RpcError) as info:
        record_when_admitted(stub, REQUEST, 30, ())
    assert info.value is refusal and stub.calls == 1
