"""Greedy verification on hand-built logits: a large value on the wanted token gives exact expectations."""

from __future__ import annotations

import torch

from target_service.verifier import PLACEHOLDER_TOKEN_ID, Mode, VerifyInput, VerifyOutput, verify

VOCAB = 16
NO_COUNTS = torch.zeros(VOCAB, VOCAB, dtype=torch.int64)


def _pair_counts(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return NO_COUNTS[draft, target]


def _greedy_input(wanted: list[list[int]], drafts: list[list[int]], modes: list[Mode] | None = None) -> VerifyInput:
    """wanted[b][i] = argmax of position i (G+1 per row); drafts[b] = the row's draft tokens (<= G)."""
    batch, width = len(wanted), len(wanted[0])
    logits = torch.randn(batch, width, VOCAB, generator=torch.Generator().manual_seed(0))  # [B, G+1, V]
    logits.scatter_(2, torch.tensor(wanted).unsqueeze(-1), 20.0)
    tokens = torch.full((batch, width - 1), PLACEHOLDER_TOKEN_ID)  # [B, G]
    for b, row in enumerate(drafts):
        tokens[b, : len(row)] = torch.tensor(row, dtype=torch.int64)
    modes = modes or [Mode.SD if d else Mode.AR for d in drafts]
    return VerifyInput(
        target_logits=logits,
        draft_tokens=tokens,
        num_draft=torch.tensor([len(d) for d in drafts]),
        draft_probs=None,
        temperature=torch.zeros(batch),
        top_k=torch.zeros(batch, dtype=torch.int64),
        top_p=torch.zeros(batch),
        mode=torch.tensor([int(m) for m in modes]),
        log_tau=torch.full((batch,), -4.6),
        lambda_=torch.full((batch,), 6),
        generators=[torch.Generator().manual_seed(b) for b in range(batch)],
    ).validate()


def _run(inp: VerifyInput) -> VerifyOutput:
    return verify(inp, _pair_counts)


def test_all_accepted_emits_the_bonus() -> None:
    out = _run(_greedy_input([[3, 5, 7, 9]], [[3, 5, 7]]))
    assert out.accepted_count.tolist() == [3]
    assert out.next_token.tolist() == [9]
    assert out.next_is_bonus.tolist() == [True]
    assert not out.event_mask.any() and not out.rescued.any()
    assert out.target_tokens.tolist() == [[3, 5, 7]]


def test_first_mismatch_emits_the_recovered_token_and_ends_the_round() -> None:
    out = _run(_greedy_input([[3, 5, 7, 9]], [[3, 6, 7]]))  # position 2 would match; never reached
    assert out.accepted_count.tolist() == [1]
    assert out.next_token.tolist() == [5]
    assert out.next_is_bonus.tolist() == [False]
    assert out.event_mask.tolist() == [[False, True, False]]
    assert out.target_tokens.tolist() == [[3, 5, 7]]
    draft_ids, target_ids = out.events(torch.tensor([[3, 6, 7]]))
    assert (draft_ids.tolist(), target_ids.tolist()) == ([6], [5])


def test_mismatch_at_the_first_position() -> None:
    out = _run(_greedy_input([[3, 5, 7, 9]], [[4, 5, 7]]))
    assert (out.accepted_count.tolist(), out.next_token.tolist()) == ([0], [3])
    assert out.event_mask.tolist() == [[True, False, False]]


def test_ar_step_without_drafts() -> None:
    out = _run(_greedy_input([[11], [2]], [[], []]))  # G = 0: target_logits [2, 1, V]
    assert out.accepted_count.tolist() == [0, 0]
    assert out.next_token.tolist() == [11, 2]
    assert out.next_is_bonus.tolist() == [True, True]
    assert out.event_mask.shape == (2, 0) and out.target_tokens.shape == (2, 0)


def test_variable_draft_lengths_in_one_batch() -> None:
    wanted = [[3, 5, 7, 9]] * 5
    drafts = [[], [3], [3, 5], [3, 5, 7], [3, 1]]
    out = _run(_greedy_input(wanted, drafts))
    assert out.accepted_count.tolist() == [0, 1, 2, 3, 1]
    assert out.next_token.tolist() == [3, 5, 7, 9, 5]  # bonus comes from position num_draft
    assert out.next_is_bonus.tolist() == [True, True, True, True, False]
    assert out.event_mask.sum().item() == 1 and out.event_mask[4, 1]
    assert out.target_tokens[1].tolist() == [3, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID]


def test_csd_without_counts_behaves_like_sd() -> None:
    out = _run(_greedy_input([[3, 5, 7, 9]], [[3, 6, 7]], modes=[Mode.CSD]))
    assert (out.accepted_count.tolist(), out.next_token.tolist()) == ([1], [5])


def test_bfloat16_logits() -> None:
    inp = _greedy_input([[3, 5, 7, 9]], [[3, 6, 7]], modes=[Mode.SCG_ONLY])
    inp.target_logits = inp.target_logits.bfloat16()
    inp.log_tau = torch.tensor([float("-inf")])  # the gate always passes: token 6 is rescued
    out = _run(inp)
    assert out.accepted_count.tolist() == [3] and out.rescued.tolist() == [[False, True, False]]


def test_greedy_rows_draw_no_randomness() -> None:
    inp = _greedy_input([[3, 5, 7, 9]], [[3, 6, 7]])
    before = inp.generators[0].get_state()
    _run(inp)
    assert torch.equal(inp.generators[0].get_state(), before)
