"""A service dying mid-request, with real gRPC services in-process: degrade, fail over, recover.

Each test stops a real server at a chosen call (a wrapper around the coordinator's backend),
so the failure happens mid-request at a known round, not by timing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from calispec.client import CalispecClient, CalispecRpcError
from calispec_core.metrics import new_registry
from calispec_core.modeling import ModelRunner, ModelSpec
from coordinator.config import CoordinatorConfig
from coordinator.engine import Orchestrator
from coordinator.metrics import CoordinatorMetrics
from coordinator.server import build_orchestrator
from coordinator.server import create_server as create_coordinator
from draft_service.config import DraftConfig
from draft_service.server import create_server as create_draft
from target_service.config import TargetConfig
from target_service.server import create_server as create_target
from tests.conftest import TinyPair
from tests.helpers import reference_greedy, wait_until

PROMPT = "def fibonacci(n):"
KWARGS = {"max_new_tokens": 24, "mode": "sd", "num_speculative_tokens": 3}


@dataclass
class Stack:
    client: CalispecClient
    orchestrator: Orchestrator
    draft: grpc.Server
    draft_port: int
    targets: dict[str, grpc.Server]  # address -> server
    start_draft: Callable[[], grpc.Server]
    metrics: CoordinatorMetrics

    def target_failures(self, kind: str) -> float | None:
        return self.metrics.registry.get_sample_value("calispec_target_replica_failures_total", {"kind": kind})


@pytest.fixture
def stack(tiny_pair: TinyPair, draft_runner: ModelRunner, target_runner: ModelRunner) -> Iterator[Stack]:
    def start_draft(port: int = 0) -> tuple[grpc.Server, int]:
        server, bound = create_draft(DraftConfig(ModelSpec(tiny_pair.draft), port=port), runner=draft_runner)
        server.start()
        return server, bound

    draft, draft_port = start_draft()
    targets, runtimes = {}, []
    for _ in range(2):
        server, port, runtime = create_target(TargetConfig(ModelSpec(tiny_pair.target), port=0), runner=target_runner)
        server.start()
        targets[f"127.0.0.1:{port}"], runtimes = server, [*runtimes, runtime]
    config = CoordinatorConfig(f"127.0.0.1:{draft_port}", tuple(targets), tiny_pair.target, port=0)
    orchestrator = build_orchestrator(config)
    metrics = CoordinatorMetrics(new_registry())
    coordinator, port = create_coordinator(config, orchestrator, metrics=metrics)
    coordinator.start()
    servers = [coordinator, *targets.values()]
    restarted: list[grpc.Server] = []

    def restart_draft() -> grpc.Server:
        server, _ = start_draft(draft_port)
        restarted.append(server)
        return server

    with CalispecClient(f"127.0.0.1:{port}", timeout=60) as client:
        yield Stack(client, orchestrator, draft, draft_port, targets, restart_draft, metrics)
    for server in [*servers, draft, *restarted]:
        server.stop(None)
    for runtime in runtimes:
        runtime.stop()


def stop_before_call(backend: object, method: str, server: grpc.Server, call_number: int, once: list[bool]) -> None:
    """Stop `server` just before the coordinator's `call_number`-th `method` call on `backend` (if `once` is armed)."""
    original = getattr(backend, method)
    calls = 0

    def wrapped(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == call_number and once:
            once.clear()
            server.stop(None).wait()
        return original(*args, **kwargs)

    setattr(backend, method, wrapped)


def expected_tokens(target_runner: ModelRunner, n: int) -> list[int]:
    return reference_greedy(target_runner, target_runner.tokenizer.encode(PROMPT), n)


def test_a_target_lost_mid_request_fails_over_with_the_same_greedy_output(stack: Stack, target_runner) -> None:
    once = [True]  # whichever replica the request is on dies before its third round
    for backend in stack.orchestrator.replicas.backends():
        stop_before_call(backend, "verify", stack.targets[backend.address], 3, once)
    chunks = list(stack.client.generate_stream(PROMPT, **KWARGS))
    tokens = [t for c in chunks for t in c.token_ids]
    assert tokens == expected_tokens(target_runner, len(tokens)) and len(tokens) == 24
    assert chunks[-1].stats.target_failovers == 1 and chunks[-1].stats.drafted > 0
    assert (stack.target_failures("session"), stack.target_failures("placement")) == (1.0, 0.0)


def test_a_request_placed_after_a_replica_refused_it_is_counted_as_a_failed_placement(stack: Stack) -> None:
    """A failed first placement is no failover (stats.target_failovers 0), but an operator sees it: before,
    nothing counted it."""
    dead = stack.orchestrator.replicas.addresses()[0]
    stack.targets[dead].stop(None).wait()
    for _ in range(2):  # round-robin routes one of the two requests to the stopped replica first
        chunks = list(stack.client.generate_stream(PROMPT, **KWARGS))
        assert chunks[-1].stats.target_failovers == 0
    assert (stack.target_failures("session"), stack.target_failures("placement")) == (0.0, 1.0)


def test_no_replica_left_is_unavailable(stack: Stack) -> None:
    for server in stack.targets.values():
        server.stop(None).wait()
    with pytest.raises(CalispecRpcError) as info:
        stack.client.generate(PROMPT, **KWARGS)
    assert info.value.code == "UNAVAILABLE" and "no target replica" in info.value.details


def test_a_draft_lost_mid_request_degrades_then_speculation_resumes(stack: Stack, target_runner) -> None:
    stop_before_call(stack.orchestrator.draft, "propose", stack.draft, 2, [True])
    degraded = stack.client.generate(PROMPT, **KWARGS)
    assert degraded.token_ids == expected_tokens(target_runner, 24)
    assert degraded.stats.draft_unavailable_rounds > 0 and degraded.stats.degraded
    assert stack.client.generate(PROMPT, **KWARGS).token_ids == degraded.token_ids  # still served, draft down
    stack.start_draft()
    resumed = wait_until(
        lambda: (r := stack.client.generate(PROMPT, **KWARGS)).stats.draft_unavailable_rounds == 0 and r
    )
    assert resumed.token_ids == degraded.token_ids and resumed.stats.drafted > 0
