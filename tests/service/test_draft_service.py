"""Draft service in-process on port 0, over a real gRPC channel."""

from __future__ import annotations

import math
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calispec.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from calispec_core.grpc_server import make_channel
from calispec_core.limits import MAX_SPECULATIVE_TOKENS
from calispec_core.modeling import ModelRunner, ModelSpec
from draft_service.config import DraftConfig
from draft_service.server import SERVICE_NAME, create_server
from tests.conftest import TinyPair
from tests.helpers import reference_greedy, rpc_code

PROMPT = [5, 17, 42, 8, 99]


@pytest.fixture(scope="module")
def channel(tiny_pair: TinyPair, draft_runner: ModelRunner) -> Iterator[grpc.Channel]:
    config = DraftConfig(model=ModelSpec(tiny_pair.draft, dtype="float32"), port=0, max_sessions=4)
    server, port = create_server(config, runner=draft_runner)  # the session's runner: no reload
    server.start()
    with make_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    server.stop(None)


@pytest.fixture
def stub(channel: grpc.Channel) -> draft_pb2_grpc.DraftServiceStub:
    return draft_pb2_grpc.DraftServiceStub(channel)


def prefill(stub, sid: str, tokens=PROMPT, **sampling) -> None:
    stub.Prefill(
        draft_pb2.DraftPrefillRequest(session_id=sid, token_ids=tokens, sampling=common_pb2.SamplingParams(**sampling))
    )


def test_health_and_info(channel: grpc.Channel, draft_runner: ModelRunner) -> None:
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    info = draft_pb2_grpc.DraftServiceStub(channel).GetModelInfo(draft_pb2.DraftModelInfoRequest()).info
    assert info.vocab_size == draft_runner.vocab_size
    assert info.tokenizer_fingerprint == draft_runner.fingerprint


def test_greedy_proposal_is_the_drafts_own_greedy_continuation(stub, draft_runner: ModelRunner) -> None:
    prefill(stub, "greedy")
    first = stub.Propose(draft_pb2.ProposeRequest(session_id="greedy", num_tokens=4))
    second = stub.Propose(draft_pb2.ProposeRequest(session_id="greedy", num_tokens=3))
    assert list(first.token_ids) + list(second.token_ids) == reference_greedy(draft_runner, PROMPT, 7)
    assert first.probs == b"" and list(first.token_probs) == [1.0] * 4
    stub.Close(draft_pb2.DraftCloseRequest(session_id="greedy"))


def test_rollback_then_propose_continues_from_the_kept_prefix(stub, draft_runner: ModelRunner) -> None:
    prefill(stub, "rb")
    proposed = list(stub.Propose(draft_pb2.ProposeRequest(session_id="rb", num_tokens=5)).token_ids)
    # keep two drafts, then the "target" emits token 7 instead of the third
    kept = [*PROMPT, *proposed[:2], 7]
    fused = stub.Propose(
        draft_pb2.ProposeRequest(session_id="rb", num_tokens=3, rollback_to=len(PROMPT) + 2, append_token_ids=[7])
    )
    assert list(fused.token_ids) == reference_greedy(draft_runner, kept, 3)
    # the standalone Rollback RPC does the same
    length = stub.Rollback(draft_pb2.RollbackRequest(session_id="rb", length=len(PROMPT) + 2, append_token_ids=[7]))
    assert length.length == len(kept)
    again = stub.Propose(draft_pb2.ProposeRequest(session_id="rb", num_tokens=3))
    assert list(again.token_ids) == list(fused.token_ids)
    stub.Close(draft_pb2.DraftCloseRequest(session_id="rb"))


def test_sampling_returns_sparse_distributions_and_seeds_reproduce(stub, draft_runner: ModelRunner) -> None:
    results = []
    for sid in ("s1", "s2"):
        prefill(stub, sid, temperature=0.9, top_k=50, seed=1234)
        results.append(stub.Propose(draft_pb2.ProposeRequest(session_id=sid, num_tokens=4)))
        stub.Close(draft_pb2.DraftCloseRequest(session_id=sid))
    a, b = results
    assert list(a.token_ids) == list(b.token_ids)
    assert a.vocab_size == draft_runner.vocab_size and a.probs == b""
    q = a.sparse_probs
    assert len(q.row_sizes) == 4 and all(0 < n <= 50 for n in q.row_sizes)  # q's own top-k support, no more
    starts = np.cumsum([0, *q.row_sizes])
    for i, token in enumerate(a.token_ids):
        ids, probs = list(q.token_ids[starts[i] : starts[i + 1]]), list(q.probs[starts[i] : starts[i + 1]])
        assert len(set(ids)) == len(ids) and all(t < a.vocab_size for t in ids)
        assert sum(probs) == pytest.approx(1.0, abs=1e-5)
        assert probs[ids.index(token)] == pytest.approx(a.token_probs[i], rel=1e-6)


def test_the_handler_reports_its_forward_time_apart(stub) -> None:
    prefill(stub, "fw")
    timing = stub.Propose(draft_pb2.ProposeRequest(session_id="fw", num_tokens=3)).timing
    stub.Close(draft_pb2.DraftCloseRequest(session_id="fw"))
    assert 0 < timing.forward_ns <= timing.total_ns  # three forwards, inside the handler


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (draft_pb2.ProposeRequest(session_id="nope", num_tokens=2), grpc.StatusCode.NOT_FOUND),
        (draft_pb2.ProposeRequest(session_id="bad", num_tokens=0), grpc.StatusCode.INVALID_ARGUMENT),
        (
            draft_pb2.ProposeRequest(session_id="bad", num_tokens=MAX_SPECULATIVE_TOKENS + 1),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            draft_pb2.ProposeRequest(session_id="bad", num_tokens=2, append_token_ids=[10**6]),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (draft_pb2.ProposeRequest(session_id="bad", num_tokens=2, rollback_to=999), grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_bad_propose_is_rejected_and_leaves_the_session_intact(stub, draft_runner, request_, code) -> None:
    prefill(stub, "bad")
    try:
        assert rpc_code(lambda: stub.Propose(request_)) == code
        ok = stub.Propose(draft_pb2.ProposeRequest(session_id="bad", num_tokens=2))
        assert list(ok.token_ids) == reference_greedy(draft_runner, PROMPT, 2)
    finally:
        stub.Close(draft_pb2.DraftCloseRequest(session_id="bad"))


def test_bad_prefill_and_close(stub) -> None:
    assert rpc_code(lambda: prefill(stub, "empty", tokens=[])) == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_code(lambda: prefill(stub, "big", tokens=[1, 10**6])) == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_code(lambda: prefill(stub, "", tokens=[1])) == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_code(lambda: prefill(stub, "t", temperature=-1.0)) == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_code(lambda: stub.Close(draft_pb2.DraftCloseRequest(session_id="never"))) == grpc.StatusCode.NOT_FOUND
    prefill(stub, "dup")
    assert rpc_code(lambda: prefill(stub, "dup")) == grpc.StatusCode.ALREADY_EXISTS
    stub.Close(draft_pb2.DraftCloseRequest(session_id="dup"))


def test_a_close_that_arrives_before_its_prefill_cancels_it(stub) -> None:
    """The Prefill still queued when its client gave up and closed it: the session used to open afterwards and
    hold its slot and KV cache until the idle TTL."""
    before = stub.GetStats(draft_pb2.DraftStatsRequest()).sessions.open_sessions
    assert rpc_code(lambda: stub.Close(draft_pb2.DraftCloseRequest(session_id="late"))) == grpc.StatusCode.NOT_FOUND
    assert rpc_code(lambda: prefill(stub, "late")) == grpc.StatusCode.CANCELLED
    assert stub.GetStats(draft_pb2.DraftStatsRequest()).sessions.open_sessions == before
    prefill(stub, "late")  # one Close cancels one Prefill
    stub.Close(draft_pb2.DraftCloseRequest(session_id="late"))


def test_session_limit_is_resource_exhausted(stub) -> None:
    for i in range(4):
        prefill(stub, f"cap{i}")
    try:
        assert rpc_code(lambda: prefill(stub, "cap4")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        for i in range(4):
            stub.Close(draft_pb2.DraftCloseRequest(session_id=f"cap{i}"))
    prefill(stub, "cap4")  # capacity is back once sessions close
    stub.Close(draft_pb2.DraftCloseRequest(session_id="cap4"))


def test_stats_show_open_sessions_and_the_idle_ttl(stub) -> None:
    before = stub.GetStats(draft_pb2.DraftStatsRequest()).sessions
    assert (before.max_sessions, before.idle_ttl_s) == (4, 120.0)
    prefill(stub, "stats")
    assert stub.GetStats(draft_pb2.DraftStatsRequest()).sessions.open_sessions == before.open_sessions + 1
    stub.Close(draft_pb2.DraftCloseRequest(session_id="stats"))
    assert stub.GetStats(draft_pb2.DraftStatsRequest()).sessions.open_sessions == before.open_sessions


def test_cli_sets_the_session_idle_ttl() -> None:
    from draft_service.__main__ import parse_config

    config, _ = parse_config(["--model", "m", "--session-idle-ttl-s", "0"])
    assert config.session_idle_ttl_s == 0
    assert parse_config(["--model", "m", "--batch-gather-ms", "0"])[0].batch_gather_s == 0


def test_rollback_to_exactly_the_cached_length_still_proposes(stub, draft_runner: ModelRunner) -> None:
    """Found by the RPC fuzz test: the next forward had no input left, and Propose answered INTERNAL."""
    prefill(stub, "cached-edge")  # caches all but the last prompt token
    reply = stub.Propose(draft_pb2.ProposeRequest(session_id="cached-edge", num_tokens=3, rollback_to=len(PROMPT) - 1))
    assert list(reply.token_ids) == reference_greedy(draft_runner, PROMPT[:-1], 3)
    stub.Close(draft_pb2.DraftCloseRequest(session_id="cached-edge"))


def greedy_confidences(runner: ModelRunner, prompt: list[int], n: int) -> list[float]:
    """The draft's softmax probability of each of its own greedy tokens (no cache: the reference)."""
    ids, confidences = list(prompt), []
    for _ in range(n):
        probs = torch.softmax(runner.model(input_ids=torch.tensor([ids])).logits[0, -1].float(), dim=-1)
        token = int(probs.argmax())
        confidences.append(float(probs[token]))
        ids.append(token)
    return confidences


@torch.inference_mode()
def test_proposal_stops_after_the_first_token_below_min_confidence(stub, draft_runner: ModelRunner) -> None:
    confidences = greedy_confidences(draft_runner, PROMPT, 6)
    threshold = sorted(confidences)[3]  # strictly above three of them
    stop_at = next(i for i, c in enumerate(confidences) if c < threshold)  # that token is kept, then stop
    full = reference_greedy(draft_runner, PROMPT, 6)
    for sid, min_confidence, expected in (("conf", threshold, full[: stop_at + 1]), ("off", 0.0, full)):
        prefill(stub, sid)
        proposal = stub.Propose(draft_pb2.ProposeRequest(session_id=sid, num_tokens=6, min_confidence=min_confidence))
        assert list(proposal.token_ids) == expected
        stub.Close(draft_pb2.DraftCloseRequest(session_id=sid))
    assert stop_at < 5  # the early stop really cut the proposal short


@torch.inference_mode()
def test_proposal_stops_once_its_path_probability_is_below_min_path_confidence(stub, draft_runner: ModelRunner) -> None:
    confidences = greedy_confidences(draft_runner, PROMPT, 6)
    paths = [math.prod(confidences[: i + 1]) for i in range(6)]  # falling
    floor = (paths[1] + paths[2]) / 2  # the third token takes the path below it
    assert paths[1] > paths[2]  # the floor really lies between them
    full = reference_greedy(draft_runner, PROMPT, 6)
    prefill(stub, "path")
    proposal = stub.Propose(draft_pb2.ProposeRequest(session_id="path", num_tokens=6, min_path_confidence=floor))
    assert list(proposal.token_ids) == full[:3]
    stub.Close(draft_pb2.DraftCloseRequest(session_id="path"))
    prefill(stub, "path-bad")
    request = draft_pb2.ProposeRequest(session_id="path-bad", num_tokens=2, min_path_confidence=-0.5)
    assert rpc_code(lambda: stub.Propose(request)) == grpc.StatusCode.INVALID_ARGUMENT
    stub.Close(draft_pb2.DraftCloseRequest(session_id="path-bad"))


def test_min_confidence_outside_zero_one_is_invalid(stub) -> None:
    prefill(stub, "conf-bad")
    request = draft_pb2.ProposeRequest(session_id="conf-bad", num_tokens=2, min_confidence=1.5)
    assert rpc_code(lambda: stub.Propose(request)) == grpc.StatusCode.INVALID_ARGUMENT
    stub.Close(draft_pb2.DraftCloseRequest(session_id="conf-bad"))
