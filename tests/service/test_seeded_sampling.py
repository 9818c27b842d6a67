"""Seeded speculative sampling through the draft and target servicers follows the target distribution.

Draft and target once seeded their generators with the request's seed itself, so the draft's
token draws were correlated with the target's acceptance coins and seeded requests were not
lossless. Here every request has its own seed and runs one round through the in-process
servicers, exactly as the coordinator drives them: draft Prefill and Propose, the draft's q
shipped as the ProposeResponse bytes (serialised and parsed back, as on the wire) into the
target's VerifyRequest. Constant-logit runners give V = 2, p = [0.02, 0.98] and a uniform q, where
the shared seed moved P(first token = 0) from 0.020 to 0.038 (χ² = 33 over these 2,000 seeds;
0.4 with the per-service streams).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TypeVar

import pytest
import torch
from google.protobuf.message import Message

from calispec.v1 import common_pb2, draft_pb2, target_pb2
from calispec_core.errors import require
from draft_service.proposer import Proposer
from draft_service.server import DraftServicer
from target_service.engine import TargetEngine
from target_service.pair_table import PairTable
from target_service.server import TargetServicer

SEEDS = range(2_000)
TARGET_P = [0.02, 0.98]
CHI2_CRITICAL_1_DOF_0_001 = 10.828  # α = 0.001, one degree of freedom (standard tables)

M = TypeVar("M", bound=Message)


class CountingCache:
    """Stands in for a KV cache: only its length matters to the sessions."""

    def __init__(self) -> None:
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:  # negative, like DynamicCache.crop
        self.length += tokens_to_remove


class ConstantRunner:
    """A model whose next-token logits never change: the distributions under test are exact."""

    def __init__(self, logits: list[float]) -> None:
        self.logits = torch.tensor(logits).view(1, 1, -1)  # [1, 1, V]
        self.vocab_size = len(logits)
        self.device = torch.device("cpu")
        self.max_context = 64

    def new_cache(self) -> CountingCache:
        return CountingCache()

    def forward(self, token_ids: list[int], cache: CountingCache, logits_to_keep: int) -> torch.Tensor:
        cache.length += len(token_ids)
        return self.logits.expand(1, logits_to_keep, -1)  # [1, keep, V]

    def check_token_ids(self, token_ids: list[int], what: str) -> None:
        require(all(0 <= t < self.vocab_size for t in token_ids), f"{what}: token outside the vocabulary")


@pytest.fixture
def servicers() -> Iterator[tuple[DraftServicer, TargetServicer]]:
    draft = ConstantRunner([0.0, 0.0])  # uniform q
    target = ConstantRunner([math.log(p) for p in TARGET_P])
    engine = TargetEngine(target, max_sessions=4, table=PairTable(target.vocab_size))  # type: ignore[arg-type]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a parallel region per op costs ~10 ms on a busy 2-core box
    yield DraftServicer(Proposer(draft, max_sessions=4)), TargetServicer(engine)  # type: ignore[arg-type]
    torch.set_num_threads(threads)
    engine.stop()


def wire(message: M) -> M:
    """The message as the other side parses it."""
    return type(message).FromString(message.SerializeToString())


def first_token(draft: DraftServicer, target: TargetServicer, seed: int) -> int:
    """One request with this seed: prefill both sides, one speculative round of one draft token."""
    sid, sampling = f"seed-{seed}", common_pb2.SamplingParams(temperature=1.0, seed=seed)
    draft.Prefill(wire(draft_pb2.DraftPrefillRequest(session_id=sid, token_ids=[0], sampling=sampling)), None)
    target.Prefill(
        wire(
            target_pb2.TargetPrefillRequest(session_id=sid, token_ids=[0], sampling=sampling, mode=common_pb2.MODE_SD)
        ),
        None,
    )
    proposal = wire(draft.Propose(wire(draft_pb2.ProposeRequest(session_id=sid, num_tokens=1)), None))
    request = target_pb2.VerifyRequest(  # as coordinator/clients.py builds it from the proposal
        session_id=sid,
        draft_token_ids=proposal.token_ids,
        draft_probs=proposal.probs,
        draft_vocab_size=proposal.vocab_size,
    )
    verdict = wire(target.Verify(wire(request), None))
    draft.Close(draft_pb2.DraftCloseRequest(session_id=sid), None)
    target.Close(target_pb2.TargetCloseRequest(session_id=sid), None)
    return proposal.token_ids[0] if verdict.accepted_count else verdict.next_token_id


def test_seeded_requests_follow_the_target_distribution(servicers: tuple[DraftServicer, TargetServicer]) -> None:
    draft, target = servicers
    tokens = [first_token(draft, target, seed) for seed in SEEDS]
    zeros = tokens.count(0)
    expected = [TARGET_P[0] * len(tokens), TARGET_P[1] * len(tokens)]
    observed = [zeros, len(tokens) - zeros]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    assert chi2 < CHI2_CRITICAL_1_DOF_0_001, (observed, expected, chi2)
