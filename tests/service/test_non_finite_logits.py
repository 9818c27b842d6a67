"""A target whose weights give NaN logits fails its rounds clearly (FAILED_PRECONDITION), never silently; a draft
whose weights do says so when it samples (FAILED_PRECONDITION, not a bug's INTERNAL).

Found by a probe: greedy sessions returned an empty completion ending in token 0, sampling and logprobs ones failed
INTERNAL ("verification emitted token 384 outside the vocabulary"). The tiny target is copied with a NaN weight.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from calispec.v1 import common_pb2, target_pb2, target_pb2_grpc
from calispec_core.errors import FailedPrecondition
from calispec_core.grpc_server import make_channel
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Stopwatch
from draft_service.proposer import Proposer
from target_service.config import TargetConfig
from target_service.engine import RescueConfig, TargetEngine
from target_service.pair_table import PairTable
from target_service.server import create_server
from tests.conftest import TinyPair

PROMPT = [5, 17, 42, 8, 99]
NON_FINITE = (
    "the target model produced non-finite logits (NaN/inf) at this step: its weights are damaged or its dtype overflows"
)


@pytest.fixture(scope="module")
def nan_target(tiny_pair: TinyPair, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target with its final norm's weights damaged (NaN): every logit is NaN."""
    path = tmp_path_factory.mktemp("nan-target") / "target"
    shutil.copytree(tiny_pair.target, path)
    weights = load_file(path / "model.safetensors")
    weights["model.norm.weight"].fill_(float("nan"))
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def nan_runner(nan_target: Path) -> ModelRunner:
    return ModelRunner(ModelSpec(nan_target, dtype="float32", device="cpu"))


@pytest.fixture(scope="module")
def stub(nan_target: Path, nan_runner: ModelRunner) -> Iterator[target_pb2_grpc.TargetServiceStub]:
    server, port, runtime = create_server(TargetConfig(ModelSpec(nan_target), port=0), runner=nan_runner)
    server.start()
    with make_channel(f"127.0.0.1:{port}") as channel:
        yield target_pb2_grpc.TargetServiceStub(channel)
    server.stop(None)
    runtime.stop()


def failed(fn) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value


@pytest.mark.parametrize(
    ("temperature", "logprobs"),
    [(0.0, None), (1.0, None), (0.0, 2), (1.0, 2)],
    ids=["greedy", "sampling", "lp", "lp-s"],
)
def test_every_round_of_a_nan_target_fails_precondition_and_keeps_its_session(
    stub, nan_runner: ModelRunner, temperature: float, logprobs: int | None
) -> None:
    sid = f"nan-{temperature}-{logprobs}"
    sampling = common_pb2.SamplingParams(temperature=temperature, seed=3)
    stub.Prefill(target_pb2.TargetPrefillRequest(session_id=sid, token_ids=PROMPT, sampling=sampling))
    q = np.full((2, nan_runner.vocab_size), 1.0 / nan_runner.vocab_size, dtype="<f4").tobytes()
    rounds = [  # a plain step, then a draft (with its q when sampling)
        target_pb2.VerifyRequest(session_id=sid, logprobs=logprobs),
        target_pb2.VerifyRequest(session_id=sid, draft_token_ids=[1, 2], logprobs=logprobs),
    ]
    if temperature:
        rounds[1].draft_probs, rounds[1].draft_vocab_size = q, nan_runner.vocab_size
    for request in rounds * 2:  # again: the session is still there, as it was
        error = failed(lambda r=request: stub.Verify(r))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
        assert error.details() == f"session {sid!r}: {NON_FINITE}"
    stub.Close(target_pb2.TargetCloseRequest(session_id=sid))


@pytest.fixture
def engine(nan_runner: ModelRunner) -> Iterator[TargetEngine]:
    table = PairTable(nan_runner.vocab_size, "cpu")
    engine = TargetEngine(nan_runner, max_sessions=4, table=table, ride_prefill_tokens=0)  # prompts fill the cache
    yield engine
    engine.stop()


def test_the_failure_is_logged_once_at_error_and_changes_no_session(
    engine: TargetEngine, caplog: pytest.LogCaptureFixture
) -> None:
    for sid, temperature in (("g", 0.0), ("s", 1.0)):
        engine.prefill(sid, PROMPT, SamplingConfig(temperature=temperature, seed=1), RescueConfig(), Stopwatch())
    state = engine.sessions.get("s")
    before = (list(state.session.tokens), state.session.cached_len, state.generator.get_state())
    assert before[1] == len(PROMPT) - 1
    q = torch.full((1, engine.runner.vocab_size), 1.0 / engine.runner.vocab_size)
    with caplog.at_level(logging.ERROR, logger="target_service.engine"):
        for _ in range(3):
            for sid, probs in (("g", None), ("s", q)):
                with pytest.raises(FailedPrecondition, match="non-finite logits"):
                    engine.verify(sid, [1], probs, Stopwatch())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "non-finite" in r.getMessage()]
    assert len(errors) == 1
    after = (list(state.session.tokens), state.session.cached_len, state.generator.get_state())
    assert before[:2] == after[:2] and torch.equal(before[2], after[2])


@pytest.mark.parametrize("top_k", [0, 64])  # the whole q sampled, or its truncation (the sparse form)
def test_a_draft_whose_logits_are_nan_says_so_when_it_samples(tiny_pair: TinyPair, tmp_path: Path, top_k: int) -> None:
    """torch.multinomial refused the NaN q with a RuntimeError: INTERNAL, a bug's code and traceback (found by the
    review). The coordinator runs a request whose draft refuses it target-only."""
    path = tmp_path / "draft"
    shutil.copytree(tiny_pair.draft, path)
    weights = load_file(path / "model.safetensors")
    weights["model.norm.weight"].fill_(float("nan"))
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    proposer = Proposer(
        ModelRunner(ModelSpec(path, dtype="float32", device="cpu")), max_sessions=2, proposal_top_k=top_k
    )
    try:
        proposer.prefill("s", PROMPT, SamplingConfig(temperature=0.8, seed=1), Stopwatch())
        with pytest.raises(FailedPrecondition, match="the draft model produced non-finite logits"):
            proposer.propose("s", 3, None, [], Stopwatch())
    finally:
        proposer.stop()
