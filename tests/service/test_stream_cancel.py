"""A gRPC client that walks away from a stream gives everything back: its quota slot, its sessions on the
model services, the coordinator's drain count."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from calispec.client import CalispecClient
from calispec.v1 import draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc
from calispec_core.access import Quota
from calispec_core.grpc_server import make_channel
from calispec_core.metrics import new_registry
from calispec_core.modeling import load_tokenizer
from coordinator.config import CoordinatorConfig
from coordinator.metrics import CoordinatorMetrics
from coordinator.server import build_orchestrator
from coordinator.server import create_server as create_coordinator
from tests.helpers import wait_until
from tests.service.conftest import ModelServices


@pytest.fixture
def one_at_a_time(model_services: ModelServices, tiny_pair_tokenizer: Path) -> Iterator[tuple[str, CoordinatorMetrics]]:
    """A coordinator whose (anonymous) callers may run one request at a time, and its metrics."""
    config = CoordinatorConfig(draft_address=model_services.draft_address,
                               target_addresses=(model_services.target_address,), tokenizer=tiny_pair_tokenizer,
                               port=0, quota=Quota(max_concurrent=1))  # fmt: skip
    metrics = CoordinatorMetrics(new_registry())
    server, port = create_coordinator(config, build_orchestrator(config), metrics=metrics)
    server.start()
    yield f"127.0.0.1:{port}", metrics
    server.stop(None)


@pytest.fixture
def tiny_pair_tokenizer(tiny_pair) -> Path:  # type: ignore[no-untyped-def]
    return tiny_pair.target


def open_sessions(services: ModelServices) -> tuple[int, int]:
    with make_channel(services.draft_address) as draft, make_channel(services.target_address) as target:
        d = draft_pb2_grpc.DraftServiceStub(draft).GetStats(draft_pb2.DraftStatsRequest()).sessions.open_sessions
        t = target_pb2_grpc.TargetServiceStub(target).GetStats(target_pb2.TargetStatsRequest()).sessions.open_sessions
    return d, t


def test_a_stream_the_client_leaves_gives_back_its_slot_and_sessions(
    one_at_a_time: tuple[str, CoordinatorMetrics],
    model_services: ModelServices,
    tiny_pair_tokenizer: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    address, metrics = one_at_a_time
    before = open_sessions(model_services)
    with CalispecClient(address, timeout=60) as client, caplog.at_level(logging.INFO, "coordinator.request_log"):
        stream = client.generate_stream("def add(a, b):", max_new_tokens=900, mode="sd", num_speculative_tokens=2)
        first = next(iter(stream))
        assert first.finish_reason is None and open_sessions(model_services) == (before[0] + 1, before[1] + 1)
        stream.close()  # the client walks away mid-stream
        # the request ends as cancelled (not by running its 900 tokens out), and both sessions close
        wait_until(lambda: metrics.requests.labels("sd", "CANCELLED")._value.get() == 1)
        wait_until(lambda: open_sessions(model_services) == before)
        # logged with what it had done (the log read only a last chunk's stats: prompt_tokens=0 rounds=0 session=-)
        (line,) = [r.getMessage() for r in caplog.records if "status=CANCELLED" in r.getMessage()]
        prompt_tokens = len(load_tokenizer(tiny_pair_tokenizer).encode("def add(a, b):"))
        assert f" prompt_tokens={prompt_tokens} " in line and f"session={first.request_id}" in line
        assert " rounds=0 " not in line
        # its acceptance from its counts (the rate is set on a finished request only: it logged 0.000; probed)
        counts = dict(field.split("=", 1) for field in line.split() if "=" in field)
        drafted, accepted = int(counts["drafted"]), int(counts["accepted"])
        assert drafted > 0 and counts["acceptance"] == f"{accepted / drafted:.3f}"
        result = client.generate("def add(a, b):", max_new_tokens=4, mode="sd")  # the one slot is free again
        assert result.finish_reason is not None
