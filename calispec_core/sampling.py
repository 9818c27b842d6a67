"""Logit processing shared by the draft (which samples q) and the verifier (which samples p).

Both sides must apply temperature, top-k and top-p identically, or lossless speculative
sampling is no longer lossless; so there is exactly one implementation, here.
All functions are vectorised over a leading batch dimension with per-row parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from calispec_core.errors import require

MAX_TEMPERATURE = 100.0


@dataclass(frozen=True)
class SamplingConfig:
    """Per-request sampling parameters. temperature == 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0  # 0 or 1 disables
    top_k: int = 0  # 0 disables
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, vocab_size: int | None = None) -> SamplingConfig:
        require(
            0.0 <= self.temperature <= MAX_TEMPERATURE,
            f"temperature must be in [0, {MAX_TEMPERATURE}], got {self.temperature}",
        )
        require(0.0 <= self.top_p <= 1.0, f"top_p must be in [0, 1], got {self.top_p}")
        require(self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}")
        if vocab_size is not None:
            require(self.top_k <= vocab_size, f"top_k must be <= vocab size {vocab_size}, got {self.top_k}")
        if self.seed is not None:
            require(0 <= self.seed < 2**63, f"seed must be in [0, 2**63), got {self.seed}")
        return self


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A per-request generator: seeded requests reproduce exactly, unseeded ones do not repeat."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def warp_probs(
    logits: torch.Tensor,  # [B, S, V] raw logits
    temperature: torch.Tensor,  # [B] float; rows with 0 are treated as 1 (callers handle greedy)
    top_k: torch.Tensor,  # [B] int; 0 = disabled
    top_p: torch.Tensor,  # [B] float; 0 or 1 = disabled
) -> torch.Tensor:  # [B, S, V] float32 probabilities
    """Softmax of logits / temperature restricted to the top-k and top-p (nucleus) set."""
    vocab = logits.shape[-1]
    temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    scaled = logits.float() / temp.float().view(-1, 1, 1)  # [B, S, V]
    truncates = ((top_k > 0) & (top_k < vocab)) | ((top_p > 0) & (top_p < 1))  # [B]
    if not bool(truncates.any()):  # one host sync; skips a full-vocabulary sort (same result)
        return scaled.softmax(dim=-1)
    sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True)  # [B, S, V]
    ranks = torch.arange(vocab, device=logits.device).view(1, 1, -1)  # [1, 1, V]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).view(-1, 1, 1)  # [B, 1, 1]
    drop = ranks >= k  # [B, S, V] outside top-k
    sorted_probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)  # [B, S, V]
    use_top_p = ((top_p > 0) & (top_p < 1)).view(-1, 1, 1)  # [B, 1, 1]
    p = top_p.float().view(-1, 1, 1)  # [B, 1, 1]
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [B, S, V] mass of higher ranks
    # Keep the smallest prefix whose mass reaches p (>= 1 token). Rows with top-p off skip the
    # test: float32 cumsum rounding reaches 1.0 before the tail, which would drop tail tokens.
    drop = drop | (use_top_p & (mass_before >= p))
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    warped = torch.empty_like(scaled).scatter_(-1, sorted_idx, sorted_logits)  # [B, S, V]
    return warped.softmax(dim=-1)


def sample_from(
    probs: torch.Tensor,  # [N, V] rows summing to 1
    generators: list[torch.Generator],  # one per row
) -> torch.Tensor:  # [N] int64
    """Draw one token per row, each row from its own generator."""
    rows = [torch.multinomial(row, 1, generator=g) for row, g in zip(probs, generators, strict=True)]
    return torch.cat(rows)
