"""A model service whose device runs out of memory (a GPU full of KV caches under load) answers RESOURCE_EXHAUSTED;
one whose device failed (a CUDA error) answers UNAVAILABLE and turns its health NOT_SERVING for good.

Found by a CUDA audit: torch's OutOfMemoryError reached clients as INTERNAL (not retryable) and was logged as
"unhandled error in handler", a bug, where it is the overload a GPU's fixed memory makes ordinary. A sticky CUDA error
(an illegal address, a device-side assert) failed every later call while health said SERVING: neither a load
balancer nor a liveness probe could take the replica out. Any other exception stays INTERNAL.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calispec.v1 import draft_pb2, draft_pb2_grpc
from calispec_core.grpc_server import create_grpc_server, make_channel
from calispec_core.observability import ManagedServer

SERVICE = draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name


class Failing(draft_pb2_grpc.DraftServiceServicer):
    def __init__(self) -> None:
        self.error: Exception = RuntimeError("boom")

    def GetModelInfo(self, request, context):
        raise self.error


@pytest.fixture
def server_and_channel() -> Iterator[tuple[Failing, ManagedServer, grpc.Channel]]:
    servicer = Failing()
    server, port, _ = create_grpc_server(
        "127.0.0.1:0", [lambda s: draft_pb2_grpc.add_DraftServiceServicer_to_server(servicer, s)], [SERVICE]
    )
    server.start()
    with make_channel(f"127.0.0.1:{port}") as channel:
        yield servicer, server, channel
    server.stop(None)


@pytest.fixture
def served(server_and_channel) -> tuple[Failing, draft_pb2_grpc.DraftServiceStub]:
    servicer, _, channel = server_and_channel
    return servicer, draft_pb2_grpc.DraftServiceStub(channel)


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


def test_a_failed_device_is_unavailable_and_the_replica_stops_serving(
    server_and_channel, caplog: pytest.LogCaptureFixture
) -> None:
    servicer, server, channel = server_and_channel
    stub, health = draft_pb2_grpc.DraftServiceStub(channel), health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == serving
    servicer.error = torch.AcceleratorError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors")
    with caplog.at_level(logging.WARNING):
        code, details = code_and_details(stub)
    assert code == grpc.StatusCode.UNAVAILABLE
    failed = "the device failed; this replica stops serving (CUDA error: an illegal memory access was encountered)"
    assert details == failed
    assert "unhandled error in handler" not in caplog.text and "until the process is restarted" in caplog.text
    server.health.set(SERVICE, serving)  # what a later state change (e.g. the memory link's) would publish
    for name in ("", SERVICE):  # the liveness probe asks for "", readiness for the service
        status = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert server.rpc_metrics.device_failed._value.get() == 1
