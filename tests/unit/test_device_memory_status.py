"""A model service whose device runs out of memory (a GPU full of KV caches under load) answers RESOURCE_EXHAUSTED.

Found by a CUDA audit: torch's OutOfMemoryError reached clients as INTERNAL (not retryable) and was logged as
"unhandled error in handler", a bug, where it is the overload a GPU's fixed memory makes ordinary. Any other
exception stays INTERNAL.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc
import pytest
import torch

from calispec.v1 import draft_pb2, draft_pb2_grpc
from calispec_core.grpc_server import create_grpc_server, make_channel

SERVICE = draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name


class Failing(draft_pb2_grpc.DraftServiceServicer):
    def __init__(self) -> None:
        self.error: Exception = RuntimeError("boom")

    def GetModelInfo(self, request, context):
        raise self.error


@pytest.fixture
def served() -> Iterator[tuple[Failing, draft_pb2_grpc.DraftServiceStub]]:
    servicer = Failing()
    server, port, _ = create_grpc_server(
        "127.0.0.1:0", [lambda s: draft_pb2_grpc.add_DraftServiceServicer_to_server(servicer, s)], [SERVICE]
    )
    server.start()
    with make_channel(f"127.0.0.1:{port}") as channel:
        yield servicer, draft_pb2_grpc.DraftServiceStub(channel)
    server.stop(None)


def code_and_details(stub: draft_pb2_grpc.DraftServiceStub) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as failed:
        stub.GetModelInfo(draft_pb2.DraftModelInfoRequest(), timeout=10)
    return failed.value.code(), failed.value.details()


def test_a_device_out_of_memory_is_resource_exhausted_not_a_bug(served, caplog: pytest.LogCaptureFixture) -> None:
    servicer, stub = served
    servicer.error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nallocator details")
    with caplog.at_level(logging.WARNING):
        code, details = code_and_details(stub)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details == "the device ran out of memory; retry later (CUDA out of memory. Tried to allocate 2.00 GiB)"
    assert "unhandled error in handler" not in caplog.text and "the device ran out of memory" in caplog.text


def test_any_other_exception_is_still_internal(served, caplog: pytest.LogCaptureFixture) -> None:
    _, stub = served  # its error: a RuntimeError
    with caplog.at_level(logging.WARNING):
        code, details = code_and_details(stub)
    assert (code, details) == (grpc.StatusCode.INTERNAL, "internal error: RuntimeError: boom")
    assert "unhandled error in handler" in caplog.text
