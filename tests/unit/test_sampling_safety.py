"""Sampling parameters that once broke the numerics: tiny temperature and top-p, shared seeds."""

from __future__ import annotations

import pytest
import torch

from calispec_core.errors import InvalidArgument
from calispec_core.sampling import (
    DRAFT_STREAM,
    MIN_TEMPERATURE,
    MIN_TOP_P,
    TARGET_STREAM,
    SamplingConfig,
    make_generator,
    stream_seed,
    warp_probs,
)
from target_service.verifier import Mode, VerifyInput, verify

VOCAB = 8


@pytest.mark.parametrize("temperature", [1e-45, 1e-30, MIN_TEMPERATURE / 2])
def test_a_tiny_temperature_is_greedy(temperature: float) -> None:
    config = SamplingConfig(temperature=temperature).validate()
    assert config.greedy and config.temperature == 0.0


def test_the_minimum_temperature_still_samples_and_bad_values_are_refused() -> None:
    assert not SamplingConfig(temperature=MIN_TEMPERATURE).greedy
    for bad in (-1e-45, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument):
            SamplingConfig(temperature=bad).validate()


def test_a_tiny_top_p_keeps_the_most_likely_token_instead_of_rounding_to_off() -> None:
    assert SamplingConfig(temperature=1.0, top_p=1e-300).top_p == MIN_TOP_P
    logits = torch.tensor([[[0.0, 3.0, 1.0, 2.0]]])  # [1, 1, V]
    config = SamplingConfig(temperature=1.0, top_p=1e-300)
    probs = warp_probs(logits, torch.tensor([config.temperature]), torch.tensor([0]), torch.tensor([config.top_p]))
    assert probs[0, 0].tolist() == [0.0, 1.0, 0.0, 0.0]


def test_warp_probs_stays_finite_for_a_tiny_temperature_passed_directly() -> None:
    logits = torch.randn(2, 3, VOCAB, generator=torch.Generator().manual_seed(0)) * 30  # [B, S, V]
    probs = warp_probs(logits, torch.tensor([1e-45, 1e-38]), torch.tensor([0, 3]), torch.tensor([1.0, 0.5]))
    assert torch.isfinite(probs).all()
    assert torch.allclose(probs.sum(-1), torch.ones(2, 3))
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))


def test_the_verifier_never_emits_a_token_outside_the_vocabulary_for_a_tiny_temperature() -> None:
    rows = 16
    logits = torch.randn(rows, 1, VOCAB, generator=torch.Generator().manual_seed(1))  # [B, G+1, V], G = 0
    inp = VerifyInput(
        target_logits=logits,
        draft_tokens=torch.zeros(rows, 0, dtype=torch.int64),
        num_draft=torch.zeros(rows, dtype=torch.int64),
        draft_probs=None,
        temperature=torch.full((rows,), 1e-45),
        top_k=torch.zeros(rows, dtype=torch.int64),
        top_p=torch.ones(rows),
        mode=torch.full((rows,), int(Mode.AR)),
        log_tau=torch.zeros(rows),
        lambda_=torch.zeros(rows, dtype=torch.int64),
        generators=[torch.Generator().manual_seed(b) for b in range(rows)],
    ).validate()
    out = verify(inp, lambda d, t: torch.zeros_like(d))
    assert torch.equal(out.next_token, logits[:, 0].argmax(-1))  # one-hot p: the argmax, never index V


def test_each_service_gets_its_own_63_bit_stream_from_the_request_seed() -> None:
    for seed in (0, 1, 2**63 - 1):
        draft, target = stream_seed(seed, DRAFT_STREAM), stream_seed(seed, TARGET_STREAM)
        assert draft != target and 0 <= draft < 2**63 and 0 <= target < 2**63
    # pinned: blake2b-64 of "seed:stream", shifted to 63 bits (docs/robustness.md)
    assert (stream_seed(1234, DRAFT_STREAM), stream_seed(1234, TARGET_STREAM)) == (
        8696349813348534748,
        1769886894143847840,
    )
    draws = [torch.rand(4, generator=make_generator(7, stream)) for stream in (DRAFT_STREAM, TARGET_STREAM)]
    assert not torch.equal(*draws)
    assert torch.equal(draws[0], torch.rand(4, generator=make_generator(7, DRAFT_STREAM)))  # still reproducible
