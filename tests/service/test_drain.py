"""Draining before shutdown: health NOT_SERVING, new requests UNAVAILABLE, the running one finishes."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calispec.client import CalispecClient, CalispecRpcError
from calispec.v1 import draft_pb2, draft_pb2_grpc
from calispec_core.generation import Defaults, FinishReason, GenerationStats
from calispec_core.grpc_server import make_channel
from calispec_core.observability import DrainGate
from coordinator.config import CoordinatorConfig
from coordinator.engine import Chunk
from coordinator.openai_api import ApiSettings, create_app, start_http_server
from coordinator.server import SERVICE_NAME
from coordinator.server import create_server as create_coordinator
from draft_service.server import SERVICE_NAME as DRAFT
from tests.conftest import TinyPair
from tests.helpers import REPO_ROOT, wait_until


class BlockingOrchestrator:
    """Streams one chunk, then waits for `release`: a request held in flight for as long as a test needs."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.on_round = None

    def generate(self, prompt, params, deadline, cancelled=None, check_prompt=None, on_start=None) -> Iterator[Chunk]:
        yield Chunk([1], "a", "session-1")
        assert self.release.wait(60)
        yield Chunk([2], "b", "session-1", FinishReason.LENGTH, GenerationStats(rounds=2, emitted=2))


def health_status(address: str, service: str = "") -> int:
    with make_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status


@pytest.fixture
def coordinator() -> Iterator[tuple[object, str, BlockingOrchestrator]]:
    orchestrator = BlockingOrchestrator()
    config = CoordinatorConfig("127.0.0.1:1", ("127.0.0.1:2",), Path("unused"), port=0)
    server, port = create_coordinator(config, orchestrator)  # type: ignore[arg-type]
    server.start()
    yield server, f"127.0.0.1:{port}", orchestrator
    orchestrator.release.set()
    server.stop(None)


def test_drain_refuses_new_requests_and_lets_the_running_one_finish(coordinator) -> None:
    server, address, orchestrator = coordinator
    with CalispecClient(address, timeout=60) as client:
        stream = client.generate_stream("hello", max_new_tokens=2)
        assert next(stream).text == "a"  # handshake: the request is running
        drained: list[bool] = []
        drainer = threading.Thread(target=lambda: drained.append(server.drain(60)))
        drainer.start()
        wait_until(lambda: health_status(address, SERVICE_NAME) == health_pb2.HealthCheckResponse.NOT_SERVING)
        assert health_status(address) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(CalispecRpcError) as info:
            client.generate("a new request", max_new_tokens=2)
        assert info.value.code == "UNAVAILABLE"
        assert drainer.is_alive() and not drained  # still waiting for the running request
        orchestrator.release.set()
        rest = list(stream)
        assert rest[-1].finish_reason == "length" and rest[-1].text == "b"
        drainer.join(60)
        assert drained == [True]


def test_drain_gives_up_after_its_bound_and_says_so(coordinator) -> None:
    server, address, _ = coordinator
    with CalispecClient(address, timeout=60) as client:
        stream = client.generate_stream("hello", max_new_tokens=2)
        assert next(stream).text == "a"
        assert server.drain(0.01) is False  # the request is still held: the drain reports it did not finish
        server.stop(0).wait()  # what serve_until_signalled does next: the held request is cut off
        with pytest.raises(CalispecRpcError) as info:
            list(stream)
        assert info.value.code == "UNAVAILABLE"


def test_sigterm_drains_a_model_service_until_its_open_sessions_close(tiny_pair: TinyPair) -> None:
    """The real CLI: SIGTERM with a session open -> NOT_SERVING, Prefill refused, the session still served."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "draft_service", "--port", "0", "--model", str(tiny_pair.draft), "--dtype", "float32",
         "--device", "cpu", "--drain-timeout-s", "120", "--log-level", "WARNING"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()  # blocks until the server listens
        address = f"127.0.0.1:{banner.split()[3].rsplit(':', 1)[1]}"
        with make_channel(address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            stub.Prefill(draft_pb2.DraftPrefillRequest(session_id="open", token_ids=[5, 6, 7]), timeout=30)
            proc.send_signal(signal.SIGTERM)
            wait_until(lambda: health_status(address, DRAFT) == health_pb2.HealthCheckResponse.NOT_SERVING, 120)
            with pytest.raises(grpc.RpcError) as info:
                stub.Prefill(draft_pb2.DraftPrefillRequest(session_id="new", token_ids=[5]), timeout=30)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            proposal = stub.Propose(draft_pb2.ProposeRequest(session_id="open", num_tokens=2), timeout=30)
            assert len(proposal.token_ids) == 2
            assert proc.poll() is None  # the open session holds the drain
            stub.Close(draft_pb2.DraftCloseRequest(session_id="open"), timeout=30)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_http_requests_count_in_the_drain_and_new_ones_get_503() -> None:
    orchestrator = BlockingOrchestrator()
    gate = DrainGate(())
    settings = ApiSettings("m", Defaults(), request_timeout_s=60, gate=gate)
    http = start_http_server(create_app(orchestrator, settings), "127.0.0.1", 0)  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{http.port}/v1/completions"
    body = {"model": "m", "prompt": "hello", "max_tokens": 2, "stream": True}
    try:
        with httpx.stream("POST", url, json=body, timeout=60) as running:
            events = running.iter_lines()
            assert '"text":"a"' in next(e for e in events if e.startswith("data:"))  # the request is running
            gate.start_draining()
            refused = httpx.post(url, json={**body, "stream": False}, timeout=60)
            assert refused.status_code == 503
            assert refused.json()["error"]["type"] == "service_unavailable"
            assert gate.wait_idle(lambda: True, 0.01) is False  # the running HTTP request holds the drain
            orchestrator.release.set()
            rest = [e for e in events if e.startswith("data:")]
        assert rest[-1] == "data: [DONE]" and '"text":"b"' in rest[-2]
        assert gate.wait_idle(lambda: True, 60) is True
    finally:
        orchestrator.release.set()
        http.stop()
