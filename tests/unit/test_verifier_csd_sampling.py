"""CSD in sampling rows gates and records against the target's most likely token, as greedy does.

The recovered sample (a draw from the residual max(0, p − q)) is often a low-probability token:
gating against it passed far more easily than in greedy decoding, and its pairs went into the
memory greedy requests read. Each row here has its own seed; the logits make the residual hold
only tail tokens, so the rule that is used shows in every rejected row.
"""

from __future__ import annotations

import torch

from target_service.verifier import Mode, VerifyInput, VerifyOutput, verify

ROWS = 64
LOG_TAU = -2.0
# Position 0: argmax t* = 0; the draft token 1 is 3 below it (the gate against t* fails) but
# 1 above the tail tokens 2 and 3 (a gate against a tail sample would pass). Position 1: the bonus.
LOGITS = torch.tensor([[10.0, 7.0, 8.0, 8.0], [0.0, 0.0, 0.0, 0.0]])  # [G+1, V]
EVERY_PAIR_FREQUENT = torch.full((4, 4), 100, dtype=torch.int64)


def _input(q: torch.Tensor, draft_token: int, mode: Mode) -> VerifyInput:
    return VerifyInput(
        target_logits=LOGITS.expand(ROWS, -1, -1).clone(),  # [B, 2, V]
        draft_tokens=torch.full((ROWS, 1), draft_token),
        num_draft=torch.ones(ROWS, dtype=torch.int64),
        draft_probs=q.view(1, 1, -1).expand(ROWS, -1, -1).clone(),  # [B, 1, V]
        temperature=torch.ones(ROWS),
        top_k=torch.zeros(ROWS, dtype=torch.int64),
        top_p=torch.ones(ROWS),
        mode=torch.full((ROWS,), int(mode)),
        log_tau=torch.full((ROWS,), LOG_TAU),
        lambda_=torch.zeros(ROWS, dtype=torch.int64),
        generators=[torch.Generator().manual_seed(b) for b in range(ROWS)],
    ).validate()


def _run(inp: VerifyInput) -> tuple[VerifyOutput, torch.Tensor]:
    out = verify(inp, lambda d, t: EVERY_PAIR_FREQUENT[d, t])
    return out, out.accepted_count == 0  # [B] rows whose draft token was not kept


def test_the_gate_compares_with_the_most_likely_token_not_the_recovered_sample() -> None:
    p = LOGITS[0].softmax(-1)
    q = torch.tensor([float(p[0]) + 0.01, 0.99 - float(p[0]), 0.0, 0.0])  # covers t*: residual only on 2, 3
    out, rejected = _run(_input(q, draft_token=1, mode=Mode.CSD))
    assert rejected.sum() > ROWS // 2  # p(1) / q(1) ≈ 0.16: most coins fail
    assert not out.rescued.any()  # z(1) − z(t*) = −3 < log τ, although z(1) − z(2 or 3) = −1 passes
    assert set(out.next_token[rejected].tolist()) <= {2, 3}  # still emits the recovered sample
    assert out.event_mask[:, 0].tolist() == rejected.tolist()
    draft_ids, target_ids = out.events(torch.full((ROWS, 1), 1))
    assert set(zip(draft_ids.tolist(), target_ids.tolist(), strict=True)) == {(1, 0)}  # recorded against t*


def test_a_coin_rejected_draft_that_is_the_most_likely_token_is_no_confusion_pair() -> None:
    q = torch.tensor([1.0, 0.0, 0.0, 0.0])  # q(0) = 1 > p(0) ≈ 0.76: the coin often fails on t* itself
    out, rejected = _run(_input(q, draft_token=0, mode=Mode.SCG_ONLY))  # the gate alone would pass (0 >= log τ)
    assert rejected.any()
    assert not out.rescued.any() and not out.event_mask.any()
    assert (out.next_token[rejected] != 0).all()  # the residual's sample, as in SD
