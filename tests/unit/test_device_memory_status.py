"""A model service whose device runs out of memory (a GPU full of KV caches under load) answers RESOURCE_EXHAUSTED;
one whose device failed (a sticky CUDA error) answers UNAVAILABLE and turns its health NOT_SERVING for good.

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
from calispec_core.observability import ManagedServer, Observe

SERVICE = draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name


class Failing(draft_pb2_grpc.DraftServiceServicer):
    def __init__(self) -> None:
        self.error: Exception = RuntimeError("boom")
        self.calls = 0

    def GetModelInfo(self, request, context):
        self.calls += 1
        raise self.error


def cuda_error(code: int, text: str) -> torch.AcceleratorError:
    """What torch raises for a failed CUDA call: the cudaError_t in `error_code` (one made in Python has none)."""
    error = torch.AcceleratorError(f"CUDA error: {text}\nCUDA kernel errors might be asynchronously reported")
    error.error_code = code  # type: ignore[attr-defined]
    return error


@pytest.fixture
def server_and_channel() -> Iterator[tuple[Failing, ManagedServer, grpc.Channel]]:
    servicer = Failing()
    server, port, _ = create_grpc_server(
        "127.0.0.1:0",
        [lambda s: draft_pb2_grpc.add_DraftServiceServicer_to_server(servicer, s)],
        [SERVICE],
        observe=Observe(admission=[f"/{SERVICE}/GetModelInfo"]),  # a call that starts work, as Prefill does
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


def still_serving(server: ManagedServer, channel: grpc.Channel) -> bool:
    health = health_pb2_grpc.HealthStub(channel)
    statuses = {health.Check(health_pb2.HealthCheckRequest(service=n), timeout=10).status for n in ("", SERVICE)}
    return statuses == {health_pb2.HealthCheckResponse.SERVING} and server.rpc_metrics.device_failed._value.get() == 0


@pytest.mark.parametrize(
    ("error", "first_line"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nallocator details"),
         "CUDA out of memory. Tried to allocate 2.00 GiB"),
        (cuda_error(2, "out of memory"), "CUDA error: out of memory"),  # a cudaMalloc outside torch's allocator
    ],
)  # fmt: skip
def test_a_device_out_of_memory_is_resource_exhausted_not_a_bug(
    server_and_channel, caplog: pytest.LogCaptureFixture, error: Exception, first_line: str
) -> None:
    servicer, server, channel = server_and_channel
    servicer.error = error
    with caplog.at_level(logging.WARNING):
        code, details = code_and_details(draft_pb2_grpc.DraftServiceStub(channel))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details == f"the device ran out of memory; retry later ({first_line})"
    assert "unhandled error in handler" not in caplog.text and "the device ran out of memory" in caplog.text
    assert still_serving(server, channel)  # overload: the replica stays


@pytest.mark.parametrize("error", [RuntimeError("boom"), cuda_error(9, "invalid configuration argument")])
def test_any_other_exception_is_still_internal(server_and_channel, caplog: pytest.LogCaptureFixture, error) -> None:
    """A CUDA error that is not sticky (an odd shape's launch configuration) fails its call only, as a bug."""
    servicer, server, channel = server_and_channel
    servicer.error = error
    with caplog.at_level(logging.WARNING):
        code, details = code_and_details(draft_pb2_grpc.DraftServiceStub(channel))
    assert (code, details) == (grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}")
    assert "unhandled error in handler" in caplog.text
    assert still_serving(server, channel)


def test_a_failed_device_is_unavailable_and_the_replica_stops_serving(
    server_and_channel, caplog: pytest.LogCaptureFixture
) -> None:
    servicer, server, channel = server_and_channel
    stub, health = draft_pb2_grpc.DraftServiceStub(channel), health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == serving
    servicer.error = cuda_error(700, "an illegal memory access was encountered")
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
    code, details = code_and_details(stub)  # refused at once: no call on the failed device
    assert (code, servicer.calls) == (grpc.StatusCode.UNAVAILABLE, 1)
    assert details == "the device failed: this replica is out of service until it is restarted; retry elsewhere"
