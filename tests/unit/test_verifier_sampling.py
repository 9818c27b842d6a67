"""Speculative sampling is lossless: emitted tokens follow the warped target distribution.

Statistical test: a batch of 20,000 independent rows shares one fixed target and one fixed,
deliberately different draft (vocabulary 8, γ = 2); draft tokens are sampled from q. The
first emitted token must follow p_0, the second (rows that kept x̃_0) p_1 and the bonus (rows
that kept both) p_2. Pearson's chi-square against the warped target is compared with the
critical value at significance α = 0.001 (hard-coded table), and the same statistic against
q must exceed it by far, which shows the test has the power to see a lossy verifier.
"""

from __future__ import annotations

import pytest
import torch

from calispec_core.sampling import warp_probs
from target_service.verifier import PLACEHOLDER_TOKEN_ID, Mode, VerifyInput, VerifyOutput, verify

VOCAB = 8
ROWS = 20_000
GAMMA = 2
# Chi-square critical values at α = 0.001 by degrees of freedom (standard tables).
CHI2_CRITICAL_0_001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}

TARGET_LOGITS = torch.tensor(  # [G+1, V]
    [
        [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 0.2],
        [0.0, 0.3, 1.8, -0.4, 1.2, 0.9, -1.5, 0.1],
        [-1.0, 0.0, 0.5, 1.0, 1.5, 2.0, 0.7, -0.3],
    ]
)
DRAFT_LOGITS = torch.tensor(  # [G, V]: the draft favours other tokens
    [
        [0.0, 1.0, 2.0, 1.5, -0.5, 0.5, 0.8, -1.0],
        [1.5, 0.3, 0.0, 1.0, -1.0, 0.9, 0.5, 0.6],
    ]
)


def _no_counts(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(draft)


def _params(rows: int, temperature: float, top_k: int, top_p: float) -> tuple[torch.Tensor, ...]:
    return (
        torch.full((rows,), temperature),
        torch.full((rows,), top_k, dtype=torch.int64),
        torch.full((rows,), top_p),
    )


def _sampling_input(temperature: float, top_k: int, top_p: float, seed: int, rows: int = ROWS) -> VerifyInput:
    temp, k, p = _params(rows, temperature, top_k, top_p)
    q = warp_probs(DRAFT_LOGITS.expand(rows, -1, -1), temp, k, p)  # [B, G, V]
    draft_rng = torch.Generator().manual_seed(10_000 + seed)
    tokens = torch.multinomial(q.reshape(-1, VOCAB), 1, generator=draft_rng).view(rows, GAMMA)  # [B, G]
    return VerifyInput(
        target_logits=TARGET_LOGITS.expand(rows, -1, -1).clone(),  # [B, G+1, V]
        draft_tokens=tokens,
        num_draft=torch.full((rows,), GAMMA),
        draft_probs=q,
        temperature=temp,
        top_k=k,
        top_p=p,
        mode=torch.full((rows,), int(Mode.SD)),
        log_tau=torch.zeros(rows),
        lambda_=torch.zeros(rows, dtype=torch.int64),
        generators=[torch.Generator().manual_seed(seed * ROWS + b) for b in range(rows)],
    )


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """(statistic, degrees of freedom) of observed tokens against probs; mass-0 tokens must not occur."""
    observed = torch.bincount(tokens, minlength=VOCAB).double()  # [V]
    support = probs > 0
    assert observed[~support].sum() == 0, "a token of target probability 0 was emitted"
    expected = probs[support].double() * tokens.numel()
    assert expected.min() >= 5, "the chi-square approximation needs >= 5 expected per cell"
    return float(((observed[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1


def _emitted(inp: VerifyInput, out: VerifyOutput) -> list[tuple[torch.Tensor, int]]:
    """(emitted tokens, position) for the 1st token (all rows), the 2nd and the bonus (rows reaching them)."""
    count, draft = out.accepted_count, inp.draft_tokens
    first = torch.where(count >= 1, draft[:, 0], out.next_token)
    second = torch.where(count >= 2, draft[:, 1], out.next_token)[count >= 1]
    bonus = out.next_token[count == 2]
    return [(first, 0), (second, 1), (bonus, 2)]


SETTINGS = [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8)]  # (temperature, top_k, top_p)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SETTINGS)
def test_emitted_tokens_follow_the_target_distribution(temperature: float, top_k: int, top_p: float) -> None:
    inp = _sampling_input(temperature, top_k, top_p, seed=1)
    out = verify(inp, _no_counts)
    temp, k, p = _params(1, temperature, top_k, top_p)
    target = warp_probs(TARGET_LOGITS.unsqueeze(0), temp, k, p)[0]  # [G+1, V]
    draft = warp_probs(DRAFT_LOGITS.unsqueeze(0), temp, k, p)[0]  # [G, V]
    assert 0.1 < out.accepted_count.float().mean() / GAMMA < 0.9  # the draft really differs
    for tokens, position in _emitted(inp, out):
        statistic, dof = _chi_square(tokens, target[position])
        assert statistic < CHI2_CRITICAL_0_001[dof], (position, statistic, dof)
        if position < GAMMA:  # power: the draft's own distribution is clearly rejected
            observed = torch.bincount(tokens, minlength=VOCAB).double()
            expected = draft[position].double() * tokens.numel() + 1e-9
            assert float(((observed - expected) ** 2 / expected).sum()) > 10 * CHI2_CRITICAL_0_001[7]


def _outputs(out: VerifyOutput) -> list[torch.Tensor]:
    return [out.accepted_count, out.next_token, out.target_tokens]


def test_seeded_runs_reproduce_and_different_seeds_differ() -> None:
    runs = [verify(_sampling_input(1.0, 0, 1.0, seed=s, rows=256), _no_counts) for s in (3, 3, 4)]
    assert all(torch.equal(a, b) for a, b in zip(_outputs(runs[0]), _outputs(runs[1]), strict=True))
    assert not torch.equal(runs[0].next_token, runs[2].next_token)


def test_each_sampling_row_draws_exactly_2n_plus_1_uniforms() -> None:
    """n is the row's own draft length, not the batch's padded width."""
    inp = _sampling_input(1.0, 0, 1.0, seed=5, rows=3)
    inp.temperature[1] = 0.0  # greedy row: draws nothing
    inp.num_draft[2] = 1  # a shorter row in the same batch
    inp.draft_tokens[2, 1:] = PLACEHOLDER_TOKEN_ID
    states = [g.get_state() for g in inp.generators]
    verify(inp, _no_counts)
    for b, (g, state) in enumerate(zip(inp.generators, states, strict=True)):
        replay = torch.Generator()
        replay.set_state(state)
        if b != 1:
            torch.rand(2 * int(inp.num_draft[b]) + 1, generator=replay)
        assert torch.equal(g.get_state(), replay.get_state())


def test_zero_draft_probability_is_a_rejection() -> None:
    inp = _sampling_input(1.0, 0, 1.0, seed=6, rows=64)
    q = inp.draft_probs
    assert q is not None
    q.scatter_(2, inp.draft_tokens.unsqueeze(-1), 0.0)  # q(x̃) = 0 at every position
    out = verify(inp, _no_counts)
    assert out.accepted_count.tolist() == [0] * 64
    assert bool(((out.next_token >= 0) & (out.next_token < VOCAB)).all())


def test_all_zero_residual_falls_back_to_p() -> None:
    # q == p, and x̃ lies outside the top-k set (p = q = 0 there): rejected, residual all zero.
    inp = _sampling_input(1.0, 2, 1.0, seed=7, rows=64)
    inp.draft_probs = warp_probs(TARGET_LOGITS[:GAMMA].expand(64, -1, -1), inp.temperature, inp.top_k, inp.top_p)
    inp.draft_tokens.fill_(6)  # the least likely token at position 0
    out = verify(inp, _no_counts)
    assert out.accepted_count.tolist() == [0] * 64
    assert set(out.next_token.tolist()) <= {0, 1}  # the top-2 of position 0


def test_a_smaller_draft_vocabulary_is_padded_with_zeros() -> None:
    inp = _sampling_input(1.0, 0, 1.0, seed=8, rows=128)
    assert inp.draft_probs is not None
    small = inp.draft_probs[..., : VOCAB - 2]  # the draft has no tokens 6 and 7
    inp.draft_probs = small / small.sum(dim=-1, keepdim=True)
    inp.draft_tokens.clamp_(max=VOCAB - 3)
    out = verify(inp, _no_counts)
    assert out.accepted_count.sum() > 0
    assert not torch.isnan(out.next_token.float()).any()


def test_top_p_off_keeps_every_token() -> None:
    # Regression: with top-p disabled, float32 cumsum rounding used to drop tail tokens.
    logits = torch.randn(2, 3, 151_936, generator=torch.Generator().manual_seed(0)) * 3
    for off in (0.0, 1.0):
        probs = warp_probs(logits, torch.ones(2), torch.zeros(2, dtype=torch.int64), torch.full((2,), off))
        assert bool((probs > 0).all())


def test_a_sum_that_rose_across_weight_0_tokens_never_picks_them() -> None:
    """A GPU's scan may leave a weight-0 token's running sum ulps above its predecessor (a CUDA audit): flattened,
    the inverse CDF cannot land on it; on a CPU's sums, which add in double, flattening changes nothing."""
    from target_service.verifier import _inverse_cdf, flat_at_zero_weights

    weights = torch.tensor([[0.0, 0.5, 0.0, 0.0, 0.25, 0.0, 0.25, 0.0]])
    drifted = torch.tensor([[1e-7, 0.5, 0.5000001, 0.5000002, 0.75, 0.7500001, 1.0, 1.0000001]])
    flat = flat_at_zero_weights(drifted, weights)
    assert flat.tolist() == [[0.0, 0.5, 0.5, 0.5, 0.75, 0.75, 1.0, 1.0]]
    for u in (5e-8, 0.5, 0.50000005, 0.75, 0.7500001, 0.99999994):  # the slivers a drifted sum would open
        picked = torch.searchsorted(flat, torch.tensor([[u]]), right=True).item()
        assert weights[0, picked] > 0, u
    rows = torch.rand(64, 1000, generator=torch.Generator().manual_seed(0))
    rows[rows < 0.9] = 0.0  # top-k-like rows: mostly weight 0
    assert torch.equal(flat_at_zero_weights(rows.cumsum(-1), rows), rows.cumsum(-1))  # CPU sums: unchanged
    samples, _ = _inverse_cdf(rows, torch.rand(64, generator=torch.Generator().manual_seed(1)))
    assert bool((rows.gather(-1, samples.unsqueeze(-1)) > 0).all())
