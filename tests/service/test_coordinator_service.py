"""Coordinator in-process with in-process draft and target services, all on port 0."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from calispec.client import AsyncCalispecClient, CalispecClient, CalispecRpcError
from calispec_core.errors import Unavailable
from calispec_core.limits import MAX_NEW_TOKENS, MAX_SPECULATIVE_TOKENS
from calispec_core.modeling import ModelRunner, ModelSpec
from coordinator.config import CoordinatorConfig
from coordinator.server import create_server as create_coordinator
from draft_service.config import DraftConfig
from draft_service.server import create_server as create_draft
from target_service.config import TargetConfig
from target_service.server import create_server as create_target
from tests.conftest import TinyPair
from tests.helpers import reference_greedy


@dataclass
class Services:
    address: str
    draft_address: str
    target_address: str


@pytest.fixture(scope="module")
def services(tiny_pair: TinyPair, draft_runner: ModelRunner, target_runner: ModelRunner) -> Iterator[Services]:
    draft, draft_port = create_draft(DraftConfig(ModelSpec(tiny_pair.draft), port=0), runner=draft_runner)
    target, target_port, runtime = create_target(
        TargetConfig(ModelSpec(tiny_pair.target), port=0), runner=target_runner
    )
    draft.start()
    target.start()
    config = CoordinatorConfig(
        draft_address=f"127.0.0.1:{draft_port}",
        target_addresses=(f"127.0.0.1:{target_port}",),
        tokenizer=tiny_pair.target,
        port=0,
    )
    coordinator, port = create_coordinator(config)
    coordinator.start()
    yield Services(f"127.0.0.1:{port}", config.draft_address, config.target_addresses[0])
    for server in (coordinator, target, draft):
        server.stop(None)
    runtime.stop()


@pytest.fixture
def client(services: Services) -> Iterator[CalispecClient]:
    with CalispecClient(services.address, timeout=60) as c:
        yield c


def test_greedy_sd_and_csd_defaults_produce_text_and_stats(client: CalispecClient, tiny_pair, target_runner) -> None:
    prompt = "Question: what is 7 times 6?"
    ar = client.generate(prompt, max_new_tokens=24, mode="ar")
    sd = client.generate(prompt, max_new_tokens=24, mode="sd", num_speculative_tokens=4)
    assert sd.token_ids == ar.token_ids and sd.text == ar.text
    prompt_ids = target_runner.tokenizer.encode(prompt)
    expected = reference_greedy(target_runner, prompt_ids, len(ar.token_ids))
    assert ar.token_ids == expected
    assert sd.stats.drafted > 0 and sd.stats.rounds < len(sd.token_ids) + 1
    assert ar.stats.drafted == 0 and ar.stats.rounds == len(ar.token_ids)
    assert sd.stats.prompt_tokens == len(prompt_ids)
    assert sd.finish_reason in ("eos", "length")
    csd = client.generate(prompt, max_new_tokens=24, num_speculative_tokens=6)  # server defaults: csd, τ, λ
    assert csd.stats.drafted > 0 and csd.text and csd.stats.mean_gamma > 0
    adaptive = client.generate(prompt, max_new_tokens=24)  # γ chosen per round by the cost model
    assert adaptive.text and adaptive.stats.mean_gamma <= 10  # the coordinator's max_gamma


def test_stream_equals_unary(client: CalispecClient) -> None:
    kwargs = {"max_new_tokens": 30, "mode": "sd"}
    unary = client.generate("Once upon a time", **kwargs)
    chunks = list(client.generate_stream("Once upon a time", **kwargs))
    assert "".join(c.text for c in chunks) == unary.text
    assert [t for c in chunks for t in c.token_ids] == unary.token_ids
    assert chunks[-1].finish_reason == unary.finish_reason and chunks[-1].stats is not None
    assert all(c.finish_reason is None for c in chunks[:-1])


def test_length_limit_and_stop_strings(client: CalispecClient) -> None:
    capped = client.generate("The quick brown", max_new_tokens=3, mode="sd", num_speculative_tokens=6)
    assert len(capped.token_ids) == 3 and capped.finish_reason == "length"
    full = client.generate("def add(a, b):", max_new_tokens=40, mode="sd")
    assert "return" in full.text
    stopped = client.generate("def add(a, b):", max_new_tokens=40, mode="sd", stop=["return"])
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.index("return")]


def test_seeded_sampling_reproduces(client: CalispecClient) -> None:
    kwargs = {"max_new_tokens": 20, "mode": "sd", "temperature": 0.8, "top_p": 0.95, "seed": 11}
    a = client.generate("Once upon a time", **kwargs)
    b = client.generate("Once upon a time", **kwargs)
    assert a.token_ids == b.token_ids and a.stats.drafted > 0


def test_async_client(services: Services) -> None:
    async def run() -> tuple[str, str]:
        async with AsyncCalispecClient(services.address, timeout=60) as client:
            unary = await client.generate("def square(x):", max_new_tokens=16, mode="sd")
            streamed = "".join(
                [c.text async for c in client.generate_stream("def square(x):", max_new_tokens=16, mode="sd")]
            )
            return unary.text, streamed

    unary, streamed = asyncio.run(run())
    assert unary == streamed and unary


@pytest.mark.parametrize(
    ("prompt", "kwargs"),
    [
        ("", {}),
        ("hi", {"max_new_tokens": -1}),
        ("hi", {"max_new_tokens": MAX_NEW_TOKENS + 1}),
        ("hi", {"num_speculative_tokens": 0}),
        ("hi", {"num_speculative_tokens": MAX_SPECULATIVE_TOKENS + 1}),
        ("hi", {"num_speculative_tokens": -3}),
        ("hi", {"tau": 0.0}),
        ("hi", {"tau": 2.0}),
        ("hi", {"lambda_": -1}),
        ("hi", {"temperature": -0.5}),
        ("hi", {"top_p": 1.5}),
        ("hi", {"top_k": -2}),
        ("hi", {"stop": [""]}),
    ],
)
def test_bad_requests_are_invalid_argument(client: CalispecClient, prompt: str, kwargs: dict) -> None:
    with pytest.raises(CalispecRpcError) as info:
        client.generate(prompt, **kwargs)
    assert info.value.code == "INVALID_ARGUMENT", info.value


def test_unknown_mode_is_invalid_argument(services: Services) -> None:
    from calispec.v1 import coordinator_pb2, coordinator_pb2_grpc
    from calispec_core.grpc_server import make_channel

    with make_channel(services.address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        request = coordinator_pb2.GenerateRequest(prompt="hi", params=coordinator_pb2.GenerationParams(mode=99))
        with pytest.raises(grpc.RpcError) as info:
            stub.Generate(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_deadline_exceeded(client: CalispecClient) -> None:
    with pytest.raises(CalispecRpcError) as info:
        client.generate("Once upon a time", max_new_tokens=500, mode="sd", timeout=0.001)
    assert info.value.code == "DEADLINE_EXCEEDED"


def test_sessions_are_closed_on_every_service_after_a_request(services: Services, client: CalispecClient) -> None:
    from coordinator.clients import GrpcDraftBackend, GrpcTargetBackend

    result = client.generate("def add(a, b):", max_new_tokens=8, mode="csd")
    for backend in (GrpcDraftBackend(services.draft_address), GrpcTargetBackend(services.target_address)):
        with pytest.raises(Unavailable, match="unknown session"):  # NOT_FOUND, as the coordinator maps it
            backend.close(result.request_id, timeout=10)


def test_a_request_without_a_deadline_gets_the_server_default(services: Services) -> None:
    """gRPC reports "no deadline" as ~9e18 s remaining; passed downstream it failed every such request at once."""
    from calispec.v1 import coordinator_pb2, coordinator_pb2_grpc
    from calispec_core.grpc_server import make_channel

    with make_channel(services.address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        params = coordinator_pb2.GenerationParams(max_new_tokens=4, mode=2)
        response = stub.Generate(coordinator_pb2.GenerateRequest(prompt="hi", params=params))  # no timeout
        chunks = list(stub.GenerateStream(coordinator_pb2.GenerateStreamRequest(prompt="hi", params=params)))
    assert len(response.token_ids) == 4 and [t for c in chunks for t in c.token_ids] == list(response.token_ids)
    with CalispecClient(services.address) as sdk:  # the SDK's documented default: no timeout
        assert sdk.generate("hi", max_new_tokens=4, mode="sd").token_ids == list(response.token_ids)


@pytest.mark.parametrize("timeout", [1e10, float("inf")])
def test_a_timeout_past_grpcs_clock_is_no_deadline(client: CalispecClient, timeout: float) -> None:
    """grpcio's deadline overflows past ~7.4e9 s: the SDK's call failed at once with DEADLINE_EXCEEDED (wave 50)."""
    result = client.generate("hi", max_new_tokens=4, mode="sd", timeout=timeout)
    chunks = list(client.generate_stream("hi", max_new_tokens=4, mode="sd", timeout=timeout))
    assert len(result.token_ids) == 4 and [t for c in chunks for t in c.token_ids] == result.token_ids


def test_adaptive_gamma_runs_target_only_where_costs_say_drafting_loses(services: Services, tiny_pair) -> None:
    """Verification linear in tokens (float32 on a CPU without bf16 units, exaggerated): no round drafts,
    and greedy output is the target's own."""
    from calispec_core.generation import Defaults, GenerationParams, Mode
    from calispec_core.modeling import load_tokenizer
    from calispec_core.sampling import SamplingConfig
    from calispec_core.timing import Deadline
    from coordinator.clients import GrpcDraftBackend, GrpcTargetBackend
    from coordinator.cost_model import CostModel
    from coordinator.engine import Orchestrator

    tokenizer = load_tokenizer(tiny_pair.target)
    linear = CostModel.from_measured({1: 100.0, 17: 1700.0}, {1: 30.0})
    draft, target = GrpcDraftBackend(services.draft_address), GrpcTargetBackend(services.target_address)
    orchestrator = Orchestrator(tokenizer, draft, [target], (tokenizer.eos_token_id,), 2048, costs=linear)
    d = Defaults()

    def run(mode: Mode) -> tuple[list[int], object]:
        params = GenerationParams(24, SamplingConfig(), (), None, mode, d.tau, d.lambda_)
        chunks = list(orchestrator.generate("Once upon a time", params, Deadline(60)))
        return [t for c in chunks for t in c.token_ids], chunks[-1].stats

    ar_tokens, _ = run(Mode.AR)
    sd_tokens, stats = run(Mode.SD)
    assert sd_tokens == ar_tokens
    assert stats.drafted == 0 and stats.mean_gamma == 0 and stats.target_only_rounds == stats.rounds > 0
