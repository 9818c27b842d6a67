"""The vectorised verifier against a slow, obviously correct per-row, per-token reference.

Random batches mix modes, greedy and sampling rows, top-k / top-p and draft lengths. Both sides
start from identical generator states and consume randomness the documented way (per sampling
row with n drafts, per round: u = rand(2n + 1); u[i] is the coin at position i, u[n + j] the
inverse-CDF uniform at position j), so the outputs must be identical, not just close.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from calispec_core.sampling import warp_probs
from target_service.verifier import PLACEHOLDER_TOKEN_ID, Mode, PairCountFn, VerifyInput, VerifyOutput, verify

VOCAB = 20
DRAFT_VOCAB = 18  # the draft lacks the last two tokens: q is zero-padded
BATCH = 12
WIDTH = 4  # G


@dataclass
class RowResult:
    accepted_count: int
    rescued: list[bool]
    next_token: int
    next_is_bonus: bool
    events: list[bool]
    target_tokens: list[int]


def _sample(weights: torch.Tensor, u: torch.Tensor) -> int:
    """Inverse CDF: the first k with cdf[k] > u * total; never a token of weight 0."""
    cdf = weights.cumsum(dim=0)
    x = u * cdf[-1]
    for k in range(len(weights)):
        if cdf[k] > x:
            return k
    return max(k for k in range(len(weights)) if weights[k] > 0)  # u * total rounded up to total


def _rescue(mode: int, frequent: bool, gate: bool) -> bool:
    return {Mode.CSD: frequent and gate, Mode.OCM_ONLY: frequent, Mode.SCG_ONLY: gate}.get(Mode(mode), False)


def _reference_row(inp: VerifyInput, b: int, p: torch.Tensor, counts: torch.Tensor) -> RowResult:
    """One row, one position at a time, exactly as the paper describes the round."""
    z, n = inp.target_logits[b], int(inp.num_draft[b])
    greedy = float(inp.temperature[b]) == 0.0
    u = None if greedy else torch.rand(2 * n + 1, generator=inp.generators[b])
    q = torch.zeros(WIDTH, VOCAB)
    if inp.draft_probs is not None:
        q[:, :DRAFT_VOCAB] = inp.draft_probs[b]

    def emitted(i: int) -> int:  # what standard SD emits if it rejects at i (or the bonus at n)
        if greedy:
            return int(z[i].argmax())
        assert u is not None
        if i == n:
            return _sample(p[i], u[n + i])
        residual = (p[i] - q[i]).clamp(min=0)
        return _sample(residual if residual.sum() > 0 else p[i], u[n + i])

    targets = [int(z[i].argmax()) for i in range(n)]  # t*_i of CSD, greedy or sampling
    padded = [*targets, *[PLACEHOLDER_TOKEN_ID] * (WIDTH - n)]
    recovered = [emitted(i) for i in range(n)]  # every row draws its uniforms, used or not
    rescued, events = [False] * WIDTH, [False] * WIDTH
    for i in range(n):
        x, t = int(inp.draft_tokens[b, i]), targets[i]
        if greedy:
            accepted = x == t
        else:
            assert u is not None
            accepted = bool(q[i, x] > 0) and bool(u[i] * q[i, x] < p[i, x])
        if accepted:
            continue
        if x == t:  # sampling only: the coin rejected the target's own top token, no confusion pair
            return RowResult(i, rescued, recovered[i], False, events, padded)
        events[i] = True
        frequent = int(counts[x, t]) > int(inp.lambda_[b])
        gate = bool(z[i, x].float() - z[i, t].float() >= inp.log_tau[b])
        if _rescue(int(inp.mode[b]), frequent, gate):
            rescued[i] = True
            continue
        return RowResult(i, rescued, recovered[i], False, events, padded)
    return RowResult(n, rescued, emitted(n), True, events, padded)


def _random_input(seed: int) -> tuple[VerifyInput, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def pick(options: list, size: int = BATCH) -> list:
        return [options[i] for i in torch.randint(len(options), (size,), generator=g).tolist()]

    logits = torch.randn(BATCH, WIDTH + 1, VOCAB, generator=g) * 2.0  # [B, G+1, V]
    temperature = torch.tensor(pick([0.0, 0.0, 0.7, 1.0, 1.3]))
    top_k = torch.tensor(pick([0, 0, 5]))
    top_p = torch.tensor(pick([0.0, 1.0, 0.9]))
    modes = pick([Mode.AR, Mode.SD, Mode.CSD, Mode.CSD, Mode.OCM_ONLY, Mode.SCG_ONLY])
    num_draft = torch.tensor(
        [0 if m == Mode.AR else int(k) for m, k in zip(modes, pick(range(WIDTH + 1)), strict=True)]
    )
    draft_logits = logits[:, :WIDTH, :DRAFT_VOCAB] + torch.randn(BATCH, WIDTH, DRAFT_VOCAB, generator=g)
    q = warp_probs(draft_logits, temperature, top_k, top_p)  # [B, G, V_draft]
    sampled = torch.multinomial(q.view(-1, DRAFT_VOCAB), 1, generator=g).view(BATCH, WIDTH)
    greedy_draft = torch.where(  # greedy drafts often match the target, sometimes not
        torch.rand(BATCH, WIDTH, generator=g) < 0.5,
        logits[:, :WIDTH].argmax(-1),
        torch.randint(VOCAB, (BATCH, WIDTH), generator=g),
    )
    tokens = torch.where((temperature > 0).view(-1, 1), sampled, greedy_draft)
    tokens[torch.arange(WIDTH).view(1, -1) >= num_draft.view(-1, 1)] = PLACEHOLDER_TOKEN_ID
    counts = torch.randint(0, 10, (VOCAB, VOCAB), generator=g)
    inp = VerifyInput(
        target_logits=logits,
        draft_tokens=tokens,
        num_draft=num_draft,
        draft_probs=q,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        mode=torch.tensor([int(m) for m in modes]),
        log_tau=torch.tensor(pick([-4.6, -1.0, -0.25, float("-inf")])),
        lambda_=torch.tensor(pick([0, 4, 6])),
        generators=[torch.Generator().manual_seed(seed * 100 + b) for b in range(BATCH)],
    )
    return inp.validate(), counts


def _as_rows(out: VerifyOutput) -> list[RowResult]:
    return [
        RowResult(
            int(out.accepted_count[b]),
            out.rescued[b].tolist(),
            int(out.next_token[b]),
            bool(out.next_is_bonus[b]),
            out.event_mask[b].tolist(),
            out.target_tokens[b].tolist(),
        )
        for b in range(out.accepted_count.shape[0])
    ]


def _memory(counts: torch.Tensor) -> PairCountFn:  # a dense [V, V] count matrix as the memory
    return lambda draft, target: counts[draft, target]


def _clone_generators(inp: VerifyInput) -> list[torch.Generator]:
    clones = []
    for g in inp.generators:
        clone = torch.Generator()
        clone.set_state(g.get_state())
        clones.append(clone)
    return clones


@pytest.mark.parametrize("seed", range(25))
def test_verify_matches_the_reference(seed: int) -> None:
    inp, counts = _random_input(seed)
    reference_generators = _clone_generators(inp)
    out = verify(inp, _memory(counts))
    verify_generators, inp.generators = inp.generators, reference_generators
    p = warp_probs(inp.target_logits, inp.temperature, inp.top_k, inp.top_p)  # [B, G+1, V]
    expected = [_reference_row(inp, b, p[b], counts) for b in range(BATCH)]
    assert _as_rows(out) == expected
    for a, b in zip(verify_generators, reference_generators, strict=True):  # same randomness consumed
        assert torch.equal(a.get_state(), b.get_state())


def test_random_batches_exercise_every_branch() -> None:
    """The random cases above reach rescues, bonuses and recoveries in greedy and sampling rows."""
    seen: set[tuple[bool, str]] = set()
    for seed in range(25):
        inp, counts = _random_input(seed)
        out = verify(inp, _memory(counts))
        for b, row in enumerate(_as_rows(out)):
            sampling = bool(inp.temperature[b] > 0)
            if any(row.rescued):
                seen.add((sampling, "rescue"))
            seen.add((sampling, "bonus" if row.next_is_bonus else "recovered"))
    assert seen == {(s, kind) for s in (False, True) for kind in ("rescue", "bonus", "recovered")}


def test_a_seeded_row_gives_the_same_result_alone_and_in_any_batch() -> None:
    """Randomness depends only on the row, so batching never changes a seeded request's output."""
    inp, counts = _random_input(3)
    sampling = [b for b in range(BATCH) if float(inp.temperature[b]) > 0 and 0 < int(inp.num_draft[b]) < WIDTH]
    assert sampling, "the random batch has a sampling row narrower than the batch"
    b = sampling[0]
    n = int(inp.num_draft[b])
    alone = VerifyInput(
        target_logits=inp.target_logits[b : b + 1, : n + 1],
        draft_tokens=inp.draft_tokens[b : b + 1, :n],
        num_draft=inp.num_draft[b : b + 1],
        draft_probs=None if inp.draft_probs is None else inp.draft_probs[b : b + 1, :n],
        temperature=inp.temperature[b : b + 1],
        top_k=inp.top_k[b : b + 1],
        top_p=inp.top_p[b : b + 1],
        mode=inp.mode[b : b + 1],
        log_tau=inp.log_tau[b : b + 1],
        lambda_=inp.lambda_[b : b + 1],
        generators=[_clone(inp.generators[b])],
    )
    batched = verify(inp, lambda d, t: counts[d, t])
    single = verify(alone, lambda d, t: counts[d, t])
    assert int(single.accepted_count[0]) == int(batched.accepted_count[b])
    assert int(single.next_token[0]) == int(batched.next_token[b])
    assert single.rescued[0].tolist() == batched.rescued[b, :n].tolist()


def _clone(g: torch.Generator) -> torch.Generator:
    copy = torch.Generator(device=g.device)
    copy.set_state(g.get_state())
    return copy
