"""The draft's q is checked fully whatever the session: a drafted token it gives probability 0, or a malformed q on a
greedy session, is refused INVALID_ARGUMENT and changes nothing (found by a probe: both were served silently)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from calispec.v1 import common_pb2, target_pb2, target_pb2_grpc
from calispec_core.grpc_server import make_channel
from calispec_core.modeling import ModelRunner, ModelSpec
from target_service.config import TargetConfig
from target_service.server import create_server
from tests.conftest import TinyPair
from tests.helpers import reference_greedy

PROMPT = [5, 17, 42, 8, 99]
DRAFT = [1, 2]


@pytest.fixture(scope="module")
def stub(tiny_pair: TinyPair, target_runner: ModelRunner) -> Iterator[target_pb2_grpc.TargetServiceStub]:
    config = TargetConfig(model=ModelSpec(tiny_pair.target, dtype="float32"), port=0, max_sessions=8)
    server, port, runtime = create_server(config, runner=target_runner)
    server.start()
    with make_channel(f"127.0.0.1:{port}") as channel:
        yield target_pb2_grpc.TargetServiceStub(channel)
    server.stop(None)
    runtime.stop()


def sparse(rows: list[tuple[list[int], list[float]]]) -> common_pb2.SparseDistributions:
    return common_pb2.SparseDistributions(
        row_sizes=[len(ids) for ids, _ in rows],
        token_ids=[t for ids, _ in rows for t in ids],
        probs=[p for _, ps in rows for p in ps],
    )


def verify(stub, sid: str, q: common_pb2.SparseDistributions | np.ndarray | None) -> target_pb2.VerifyResponse:
    request = target_pb2.VerifyRequest(session_id=sid, draft_token_ids=DRAFT)
    if isinstance(q, np.ndarray):
        request.draft_probs, request.draft_vocab_size = q.astype("<f4").tobytes(), q.shape[1]
    elif q is not None:
        request.draft_sparse_probs.CopyFrom(q)
    return stub.Verify(request)


def refusal(fn) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return info.value


def open_twins(stub, *sids: str, **sampling: float) -> None:
    params = common_pb2.SamplingParams(**sampling)
    for sid in sids:
        request = target_pb2.TargetPrefillRequest(session_id=sid, token_ids=PROMPT, sampling=params)
        request.mode = common_pb2.MODE_SD  # no rescue: the twins' rounds depend on their own q alone
        stub.Prefill(request)


def close(stub, *sids: str) -> None:
    for sid in sids:
        stub.Close(target_pb2.TargetCloseRequest(session_id=sid))


def test_a_drafted_token_its_q_gives_probability_0_is_refused_naming_its_position(
    stub, target_runner: ModelRunner
) -> None:
    vocab = target_runner.vocab_size
    dense = np.full((2, vocab), 1.0 / vocab, dtype=np.float32)
    dense[1] = 1.0 / (vocab - 1)
    dense[1, DRAFT[1]] = 0.0  # row 1 lacks draft token 1 and still sums to 1
    faulty = {
        "sparse, absent": sparse([([1, 9], [0.25, 0.75]), ([3], [1.0])]),
        "sparse, listed with 0": sparse([([1, 9], [0.25, 0.75]), ([2, 3], [0.0, 1.0])]),
        "dense": dense,
    }
    open_twins(stub, "zero-q", "zero-q-twin", temperature=1.0, seed=5)
    for what, q in faulty.items():
        error = refusal(lambda q=q: verify(stub, "zero-q", q))
        assert "draft token 1 (id 2) has probability 0" in error.details(), what
    good = sparse([([1, 9], [0.25, 0.75]), ([2], [1.0])])
    outcomes = [verify(stub, sid, good) for sid in ("zero-q", "zero-q-twin")]
    fields = [(r.accepted_count, r.next_token_id, r.next_is_bonus) for r in outcomes]
    assert fields[0] == fields[1]  # the refused calls touched neither the cache nor the random stream
    close(stub, "zero-q", "zero-q-twin")


def test_a_malformed_q_is_refused_on_a_greedy_session_too(stub, target_runner: ModelRunner) -> None:
    vocab = target_runner.vocab_size
    nan_dense = np.full((2, vocab), 1.0 / vocab, dtype=np.float32)
    nan_dense[1, 4] = np.nan
    faulty = {
        "sizes and entries disagree": common_pb2.SparseDistributions(row_sizes=[5, 1], token_ids=[1, 2], probs=[1, 1]),
        "a NaN": sparse([([1, 9], [float("nan"), 0.75]), ([2], [1.0])]),
        "a token outside the vocabulary": sparse([([1, vocab], [0.25, 0.75]), ([2], [1.0])]),
        "a drafted token absent": sparse([([1], [1.0]), ([3], [1.0])]),
        "a dense NaN": nan_dense,
    }
    open_twins(stub, "greedy-q")
    for what, q in faulty.items():
        assert refusal(lambda q=q: verify(stub, "greedy-q", q)).details(), what
    plain = stub.Verify(target_pb2.VerifyRequest(session_id="greedy-q"))  # one decoding step, no draft
    assert plain.next_token_id == reference_greedy(target_runner, PROMPT, 1)[0]  # the refusals changed nothing
    verify(stub, "greedy-q", sparse([([1, 9], [0.25, 0.75]), ([2], [1.0])]))  # a sound q: ignored, as before
    close(stub, "greedy-q")
