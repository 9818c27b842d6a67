"""The coordinator's deadline for a request: the client's, or the server default when it set none."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import coordinator.server as server_module
from calispec.v1 import coordinator_pb2
from calispec_core.errors import Cancelled, DeadlineExceeded
from calispec_core.timing import Deadline
from coordinator.__main__ import parse_config
from coordinator.config import CoordinatorConfig
from coordinator.engine import Orchestrator
from coordinator.server import CoordinatorServicer, request_timeout
from tests.unit.fakes import EOS, CharTokenizer, FakeDraft, FakeTarget
from tests.unit.test_orchestrator import alphabet_target, params, sloppy_draft


def test_no_client_deadline_gets_the_server_default() -> None:
    assert request_timeout(None, 60.0) == 60.0
    assert request_timeout(9.223372035e18, 60.0) == 60.0  # what grpc reports for a call without a deadline


def test_a_client_deadline_is_honoured_shorter_or_longer() -> None:
    assert request_timeout(0.5, 60.0) == 0.5
    assert request_timeout(600.0, 60.0) == 600.0


def test_the_default_is_configurable() -> None:
    config, _ = parse_config(["--draft-addr", "d:1", "--target-addr", "t:1", "--tokenizer", "x", "--rpc-timeout", "9"])
    assert config.rpc_timeout_s == 9.0


class UnreadStreamContext:
    """A call whose client set no deadline and stops reading after the first message."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def time_remaining(self) -> None:
        return None

    def is_active(self) -> bool:
        return not self.cancelled.is_set()

    def cancel(self) -> None:
        self.cancelled.set()


def test_a_stream_its_client_stops_reading_is_cancelled_past_its_deadline(monkeypatch) -> None:
    """Its worker thread blocked in gRPC's send, where no round checks the deadline: 32 unread streams held
    every worker of the coordinator, and every other gRPC request timed out, for as long as they stayed open."""
    monkeypatch.setattr(server_module, "CANCEL_GRACE_S", 0.0)
    orchestrator = Orchestrator(CharTokenizer(), FakeDraft(sloppy_draft), [FakeTarget(alphabet_target)], (EOS,), 4096)
    config = CoordinatorConfig("d:1", ("t:1",), Path("tokenizer"), rpc_timeout_s=0.2)
    servicer = CoordinatorServicer(orchestrator, config)
    context = UnreadStreamContext()
    request = coordinator_pb2.GenerateStreamRequest(
        prompt="c", params=coordinator_pb2.GenerationParams(max_new_tokens=8)
    )
    stream = servicer.GenerateStream(request, context)
    assert next(stream).text  # the client reads one message, then gRPC's send of the next one blocks
    assert context.cancelled.wait(timeout=20)  # cancelled (by the watchdog) past the request's deadline
    stream.close()  # as gRPC drops the cancelled call's iterator


class ExpiringContext(UnreadStreamContext):
    """A call whose client's deadline runs out after the first message: gRPC ends the call (inactive) a moment
    before the request's own Deadline, made a little later, runs out."""

    def __init__(self) -> None:
        super().__init__()
        self.expired = False

    def time_remaining(self) -> float:
        return -0.001 if self.expired else 30.0

    def is_active(self) -> bool:
        return not self.expired


def servicer_and_stream(context: UnreadStreamContext, timeout_s: float = 60.0) -> tuple[CoordinatorServicer, Any]:
    orchestrator = Orchestrator(CharTokenizer(), FakeDraft(sloppy_draft), [FakeTarget(alphabet_target)], (EOS,), 4096)
    config = CoordinatorConfig("d:1", ("t:1",), Path("tokenizer"), rpc_timeout_s=timeout_s)
    servicer = CoordinatorServicer(orchestrator, config)
    request = coordinator_pb2.GenerateStreamRequest(
        prompt="c", params=coordinator_pb2.GenerationParams(max_new_tokens=8)
    )
    return servicer, servicer.GenerateStream(request, context)


def requests_counted(servicer: CoordinatorServicer, status: str) -> float:
    return servicer.metrics.registry.get_sample_value("calispec_requests_total", {"mode": "csd", "status": status})


def test_a_call_ended_by_the_clients_deadline_is_deadline_exceeded_not_cancelled() -> None:
    """The round start saw the call inactive and counted and logged it CANCELLED (1 of 20 timed-out requests in a
    probe), though the client got DEADLINE_EXCEEDED: alerts on timeouts undercounted, cancels looked inflated."""
    context = ExpiringContext()
    servicer, stream = servicer_and_stream(context)
    assert next(stream).text
    context.expired = True
    with pytest.raises(DeadlineExceeded):
        next(stream)
    assert requests_counted(servicer, "DEADLINE_EXCEEDED") == 1


def test_a_call_the_client_cancelled_is_still_cancelled() -> None:
    context = UnreadStreamContext()
    servicer, stream = servicer_and_stream(context)
    assert next(stream).text
    context.cancel()
    with pytest.raises(Cancelled):
        next(stream)
    assert requests_counted(servicer, "CANCELLED") == 1


class SettableDeadline(Deadline):
    def __init__(self) -> None:
        super().__init__(60.0)
        self.expired = False

    def remaining(self) -> float:
        if self.expired:
            raise DeadlineExceeded("deadline exceeded")
        return super().remaining()


def test_a_call_cancelled_at_the_requests_own_deadline_is_deadline_exceeded() -> None:
    """The watchdog cancels a call whose send blocks a moment past the request's deadline (the server's default for
    a client that set none): that end is the deadline's too, not the client's cancel."""
    orchestrator = Orchestrator(CharTokenizer(), FakeDraft(sloppy_draft), [FakeTarget(alphabet_target)], (EOS,), 4096)
    deadline, gone = SettableDeadline(), threading.Event()
    chunks = orchestrator.generate("c", params(max_new_tokens=8), deadline, gone.is_set)
    assert next(chunks).token_ids
    deadline.expired = True
    gone.set()
    with pytest.raises(DeadlineExceeded):
        next(chunks)
