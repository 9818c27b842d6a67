"""Seeded speculative sampling through the draft and target servicers follows the target distribution.

Draft and target once seeded their generators with the request's seed itself, so the draft's
token draws were correlated with the target's acceptance coins and seeded requests were not
lossless. Here every request has its own seed and runs one round through the in-process
servicers, exactly as the coordinator drives them: draft Prefill and Propose, the draft's q
shipped as the ProposeResponse bytes (serialised and parsed back, as on the wire) into the
target's VerifyRequest. Constant-logit runners give V = 2, p = [0.02, 0.98] and a uniform q, where
the shared seed moved P(first token = 0) from 0.020 to 0.038 (χ² = 33 over these 2,000 seeds;
0.4 with the per-service streams). q travels sparse (the draft's default), dense (a draft with
--proposal-top-k 0), and truncated: V = 3 with the draft keeping its top 2 tokens, so the draft
samples from (and sends) a q that is not its softmax, and the output must still follow p. A pruned
draft (--draft-vocab: an output layer holding only ids {0, 2} of V = 3) can never propose token 1,
which must then come from the target's residual (its dense q: tests/unit/test_draft_vocab.py).
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
from calispec_core.vocab_pruning import LogitColumns
from draft_service.proposer import Proposer
from draft_service.server import DraftServicer
from target_service.engine import TargetEngine
from target_service.pair_table import PairTable
from target_service.server import TargetServicer

SEEDS = range(2_000)
CHI2_CRITICAL_0_001 = {1: 10.828, 2: 13.816}  # α = 0.001 by degrees of freedom (standard tables)

M = TypeVar("M", bound=Message)


class CountingCache:
    """Stands in for a KV cache: only its length matters to the sessions."""

    def __init__(self) -> None:
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:  # negative, like DynamicCache.crop
        self.length += tokens_to_remove

    @property
    def layers(self) -> list[CountingCache]:  # kv_cache.crop_to crops layer by layer: one layer, itself
        return [self]


class ConstantRunner:
    """A model whose next-token logits never change: the distributions under test are exact.

    With `kept` (a pruned output layer, calispec_core/vocab_pruning.py) its logits are over those
    token ids of a vocabulary of `vocab_size`; else over all of them.
    """

    def __init__(self, logits: list[float], kept: list[int] | None = None, vocab_size: int | None = None) -> None:
        self.logits = torch.tensor(logits).view(1, 1, -1)  # [1, 1, C]
        self.vocab_size = vocab_size or len(logits)
        self.logit_columns = LogitColumns(self.vocab_size, None if kept is None else torch.tensor(kept))
        self.device = torch.device("cpu")
        self.dtype_name = "float32"  # no activation scales: its rows draft together
        self.max_context = 64

    def new_cache(self) -> CountingCache:
        return CountingCache()

    def forward(self, token_ids: list[int], cache: CountingCache, logits_to_keep: int) -> torch.Tensor:
        cache.length += len(token_ids)
        return self.logits.expand(1, logits_to_keep, -1)  # [1, keep, V]

    def check_token_ids(self, token_ids: list[int], what: str) -> None:
        require(all(0 <= t < self.vocab_size for t in token_ids), f"{what}: token outside the vocabulary")


CASES = {  # name: (draft logits, target p, the draft's proposal_top_k, the ids a pruned draft keeps)
    "sparse": ([0.0, 0.0], [0.02, 0.98], 256, None),  # uniform q
    "dense": ([0.0, 0.0], [0.02, 0.98], 0, None),
    "truncated": ([0.0, 0.5, 1.0], [0.3, 0.5, 0.2], 2, None),  # q = the draft's top 2 tokens, renormalised
    "pruned-sparse": ([0.0, 0.0], [0.3, 0.5, 0.2], 256, [0, 2]),  # q = [0.5, 0, 0.5]: column 1 is token 2
}


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> Iterator[tuple[DraftServicer, TargetServicer, list[float]]]:
    draft_logits, target_p, top_k, kept = CASES[request.param]
    draft = ConstantRunner(draft_logits, kept, len(target_p))
    target = ConstantRunner([math.log(p) for p in target_p])
    engine = TargetEngine(target, 4, PairTable(target.vocab_size), meaning_guard=False)  # type: ignore[arg-type]  # no tokenizer
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a parallel region per op costs ~10 ms on a busy 2-core box
    proposer = Proposer(draft, max_sessions=4, proposal_top_k=top_k)  # type: ignore[arg-type]
    yield DraftServicer(proposer), TargetServicer(engine), target_p
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
    if proposal.HasField("sparse_probs"):
        request.draft_sparse_probs.MergeFromString(proposal.sparse_probs.SerializeToString())
    verdict = wire(target.Verify(wire(request), None))
    draft.Close(draft_pb2.DraftCloseRequest(session_id=sid), None)
    target.Close(target_pb2.TargetCloseRequest(session_id=sid), None)
    return proposal.token_ids[0] if verdict.accepted_count else verdict.next_token_id


def test_seeded_requests_follow_the_target_distribution(
    case: tuple[DraftServicer, TargetServicer, list[float]],
) -> None:
    draft, target, target_p = case
    tokens = [first_token(draft, target, seed) for seed in SEEDS]
    expected = [p * len(tokens) for p in target_p]
    observed = [tokens.count(token) for token in range(len(target_p))]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    assert chi2 < CHI2_CRITICAL_0_001[len(target_p) - 1], (observed, expected, chi2)


def test_the_draft_sends_q_sparse_by_default_and_dense_without_a_top_k(
    case: tuple[DraftServicer, TargetServicer, list[float]],
) -> None:
    draft, _, target_p = case
    sid, sampling = "wire", common_pb2.SamplingParams(temperature=1.0, seed=1)
    draft.Prefill(draft_pb2.DraftPrefillRequest(session_id=sid, token_ids=[0], sampling=sampling), None)
    proposal = draft.Propose(draft_pb2.ProposeRequest(session_id=sid, num_tokens=3), None)
    columns = draft.proposer.runner.logit_columns
    proposable = set(range(len(target_p)) if columns.kept is None else columns.kept.tolist())
    assert set(proposal.token_ids) <= proposable
    if draft.proposer.proposal_top_k == 0:
        assert len(proposal.probs) == 3 * len(target_p) * 4 and not proposal.HasField("sparse_probs")
        return
    sparse = proposal.sparse_probs
    kept = min(draft.proposer.proposal_top_k, columns.width)
    assert proposal.probs == b"" and list(sparse.row_sizes) == [kept] * 3
    for i, token in enumerate(proposal.token_ids):
        ids = list(sparse.token_ids[i * kept : (i + 1) * kept])
        assert token in ids and set(ids) <= proposable  # drawn from the q that was sent, over token ids
        assert sum(sparse.probs[i * kept : (i + 1) * kept]) == pytest.approx(1.0, abs=1e-6)
