"""CSD rescue rules on hand-built greedy logits: count > λ (strict) and z(x̃) - z(t*) >= log τ (inclusive).

Every position i has the target token t*_i at logit 10 and the draft token x̃_i at 10 + gap_i
(gap < 0); other tokens sit at 0. Powers of two keep every difference exact in float32.
"""

from __future__ import annotations

import pytest
import torch

from target_service.pair_table import PairTable
from target_service.verifier import PLACEHOLDER_TOKEN_ID, Mode, VerifyInput, VerifyOutput, verify

VOCAB = 16
LOG_TAU = -2.0
LAMBDA = 6
BONUS = 15


class Counts:
    """A dense pair-count matrix as the correction memory."""

    def __init__(self, pairs: dict[tuple[int, int], int] | None = None) -> None:
        self.matrix = torch.zeros(VOCAB, VOCAB, dtype=torch.int64)
        for (d, t), c in (pairs or {}).items():
            self.matrix[d, t] = c

    def __call__(self, draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.matrix[draft, target]


def _row_logits(targets: list[int], drafts: list[int], gaps: list[float]) -> torch.Tensor:  # [G+1, V]
    logits = torch.zeros(len(targets) + 1, VOCAB)
    for i, (t, d, gap) in enumerate(zip(targets, drafts, gaps, strict=True)):
        logits[i, t] = 10.0
        if d != t:
            logits[i, d] = 10.0 + gap
    logits[len(targets), BONUS] = 10.0
    return logits


def _input(
    rows: list[tuple[list[int], list[int], list[float]]],  # per row: targets, drafts, gaps (same length G)
    modes: list[Mode],
    lambdas: list[int] | None = None,
    log_taus: list[float] | None = None,
) -> VerifyInput:
    batch = len(rows)
    drafts = [d for _, d, _ in rows]
    num_draft = [0 if m == Mode.AR else len(d) for m, d in zip(modes, drafts, strict=True)]
    tokens = torch.tensor(drafts)  # [B, G]
    tokens[torch.arange(tokens.shape[1]).view(1, -1) >= torch.tensor(num_draft).view(-1, 1)] = PLACEHOLDER_TOKEN_ID
    return VerifyInput(
        target_logits=torch.stack([_row_logits(*row) for row in rows]),  # [B, G+1, V]
        draft_tokens=tokens,
        num_draft=torch.tensor(num_draft),
        draft_probs=None,
        temperature=torch.zeros(batch),
        top_k=torch.zeros(batch, dtype=torch.int64),
        top_p=torch.zeros(batch),
        mode=torch.tensor([int(m) for m in modes]),
        log_tau=torch.tensor(log_taus or [LOG_TAU] * batch),
        lambda_=torch.tensor(lambdas or [LAMBDA] * batch),
        generators=[torch.Generator() for _ in range(batch)],
    ).validate()


def _one(
    targets: list[int], drafts: list[int], gaps: list[float], counts: Counts, mode: Mode = Mode.CSD
) -> VerifyOutput:
    return verify(_input([(targets, drafts, gaps)], [mode]), counts)


@pytest.mark.parametrize(("count", "rescued"), [(LAMBDA - 1, False), (LAMBDA, False), (LAMBDA + 1, True)])
def test_count_must_exceed_lambda_strictly(count: int, rescued: bool) -> None:
    out = _one([1, 2], [3, 2], [-1.0, 0.0], Counts({(3, 1): count}))
    assert out.rescued[0, 0].item() is rescued
    assert out.accepted_count.tolist() == ([2] if rescued else [0])
    assert out.next_token.tolist() == ([BONUS] if rescued else [1])


@pytest.mark.parametrize(("gap", "rescued"), [(LOG_TAU, True), (LOG_TAU - 2.0**-18, False), (-0.5, True)])
def test_gate_is_inclusive_at_log_tau(gap: float, rescued: bool) -> None:
    out = _one([1], [3], [gap], Counts({(3, 1): LAMBDA + 1}))
    assert out.rescued.tolist() == [[rescued]]
    assert out.next_is_bonus.tolist() == [rescued]


def test_rescue_lets_later_draft_tokens_be_accepted() -> None:
    out = _one([1, 2, 4], [3, 2, 4], [-1.0, 0.0, 0.0], Counts({(3, 1): 7}))
    assert out.accepted_count.tolist() == [3]
    assert out.rescued.tolist() == [[True, False, False]]
    assert out.next_token.tolist() == [BONUS] and out.next_is_bonus.tolist() == [True]
    assert out.event_mask.tolist() == [[True, False, False]]


def test_rescue_at_first_and_last_position() -> None:
    counts = Counts({(3, 1): 7, (6, 5): 9})
    out = _one([1, 2, 5], [3, 2, 6], [-1.0, 0.0, -1.5], counts)
    assert out.accepted_count.tolist() == [3]
    assert out.rescued.tolist() == [[True, False, True]]
    assert out.next_is_bonus.tolist() == [True]
    draft_ids, target_ids = out.events(torch.tensor([[3, 2, 6]]))
    assert list(zip(draft_ids.tolist(), target_ids.tolist(), strict=True)) == [(3, 1), (6, 5)]


def test_several_rescues_then_a_final_rejection() -> None:
    # position 3 fails the gate, position 4 would be rescuable but is never reached
    counts = Counts({(3, 1): 7, (8, 7): 7, (9, 4): 100, (12, 11): 100})
    targets, drafts = [1, 2, 7, 4, 11], [3, 2, 8, 9, 12]
    out = _one(targets, drafts, [-1.0, 0.0, -2.0, -3.0, -1.0], counts)
    assert out.accepted_count.tolist() == [3]
    assert out.rescued.tolist() == [[True, False, True, False, False]]
    assert out.next_token.tolist() == [4] and out.next_is_bonus.tolist() == [False]
    assert out.event_mask.tolist() == [[True, False, True, True, False]]
    draft_ids, target_ids = out.events(torch.tensor([drafts]))
    assert list(zip(draft_ids.tolist(), target_ids.tolist(), strict=True)) == [(3, 1), (8, 7), (9, 4)]


def test_ocm_only_ignores_the_gate() -> None:
    frequent = Counts({(3, 1): 7})
    assert _one([1], [3], [-9.0], frequent, Mode.OCM_ONLY).rescued.tolist() == [[True]]
    assert _one([1], [3], [-0.5], Counts(), Mode.OCM_ONLY).rescued.tolist() == [[False]]


def test_scg_only_ignores_the_counts() -> None:
    assert _one([1], [3], [-0.5], Counts(), Mode.SCG_ONLY).rescued.tolist() == [[True]]
    assert _one([1], [3], [-9.0], Counts({(3, 1): 99}), Mode.SCG_ONLY).rescued.tolist() == [[False]]


def test_sd_never_rescues() -> None:
    out = _one([1, 2], [3, 2], [-0.5, 0.0], Counts({(3, 1): 99}), Mode.SD)
    assert out.accepted_count.tolist() == [0] and not out.rescued.any()
    assert out.event_mask.tolist() == [[True, False]]


def test_rows_with_different_modes_in_one_batch() -> None:
    counts = Counts({(3, 1): 7})  # frequent; position 0 passes the gate, position 1 (pair (6, 2)) only the gate
    row = ([1, 2, 4], [3, 6, 4], [-1.0, -1.0, 0.0])
    modes = [Mode.AR, Mode.SD, Mode.CSD, Mode.OCM_ONLY, Mode.SCG_ONLY]
    out = verify(_input([row] * 5, modes), counts)
    assert out.accepted_count.tolist() == [0, 0, 1, 1, 3]
    assert out.rescued.tolist() == [
        [False, False, False],
        [False, False, False],
        [True, False, False],
        [True, False, False],
        [True, True, False],
    ]
    assert out.next_token.tolist() == [1, 1, 2, 2, BONUS]
    assert out.next_is_bonus.tolist() == [True, False, False, False, True]  # AR: the "bonus" is its one token
    assert out.event_mask.sum(dim=1).tolist() == [0, 1, 2, 2, 2]


def test_per_row_lambda_and_tau() -> None:
    row = ([1], [3], [-1.0])
    counts = Counts({(3, 1): 5})
    out = verify(_input([row] * 4, [Mode.CSD] * 4, lambdas=[4, 5, 4, 4], log_taus=[-2.0, -2.0, -1.0, -0.5]), counts)
    assert out.rescued.view(-1).tolist() == [True, False, True, False]


def test_pair_table_as_the_memory() -> None:
    table = PairTable(VOCAB)
    table.replace_snapshot([(3, 1, LAMBDA)], version=1)
    inp = _input([([1], [3], [-1.0])], [Mode.CSD])
    assert verify(inp, table.counts).rescued.tolist() == [[False]]
    table.add_local(torch.tensor([3]), torch.tensor([1]))  # this verifier's own event counts at once
    assert verify(inp, table.counts).rescued.tolist() == [[True]]


def test_modes_match_the_proto_enum() -> None:
    from calispec.v1 import common_pb2

    assert {m.name: m.value for m in Mode} == {
        name.removeprefix("MODE_"): value for name, value in common_pb2.Mode.items() if name != "MODE_UNSPECIFIED"
    }


@pytest.mark.parametrize("mode", [Mode.CSD, Mode.OCM_ONLY, Mode.SCG_ONLY, Mode.SD])
def test_a_draft_token_a_grammar_refused_is_never_rescued_nor_recorded(mode: Mode) -> None:
    """A structured output masks the logits (calispec_core/constraints.py): a refused draft's logit is -inf. OCM_ONLY
    rescued it on its count alone (writing a token the grammar forbids), and every mode recorded its pair, a
    grammar's refusal, in the shared memory as the draft's confusion."""
    out = _one([1, 2], [3, 2], [-float("inf"), 0.0], Counts({(3, 1): LAMBDA + 100}), mode)
    assert out.accepted_count.tolist() == [0] and out.next_token.tolist() == [1]
    assert not out.rescued.any() and not out.event_mask.any()
