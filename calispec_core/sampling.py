"""Logit processing shared by the draft (which samples q) and the verifier (which samples p).

Both sides must apply temperature, top-k and top-p identically, or lossless speculative
sampling is no longer lossless; so there is exactly one implementation, here.
All functions are vectorised over a leading batch dimension with per-row parameters.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from calispec_core.errors import require_field
from calispec_core.limits import check_sampling

# A positive temperature below MIN_TEMPERATURE means greedy: softmax(z / T) is one-hot there for any
# logit gap above ~1e-4 anyway, and z / T overflows float32 (inf, then NaN) as T nears 1e-38.
MIN_TEMPERATURE = 1e-5
# A positive top-p below MIN_TOP_P counts as MIN_TOP_P (keep only the most likely token): smaller
# values would round to 0 in float32, which means "top-p off".
MIN_TOP_P = 1e-6

# Names of the services' random streams (see stream_seed): never the same for two services.
DRAFT_STREAM = "draft"
TARGET_STREAM = "target"


@dataclass(frozen=True)
class SamplingConfig:
    """Per-request sampling parameters. temperature == 0 means greedy.

    Tiny positive values are normalised on construction (numerically safe, documented in
    docs/robustness.md): temperature < MIN_TEMPERATURE becomes 0 (greedy), top_p < MIN_TOP_P
    becomes MIN_TOP_P. Other values are kept as given; validate() refuses out-of-range ones.
    """

    temperature: float = 0.0
    top_p: float = 1.0  # 0 or 1 disables
    top_k: int = 0  # 0 disables
    seed: int | None = None

    def __post_init__(self) -> None:  # frozen: normalise through object.__setattr__
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)
        if 0.0 < self.top_p < MIN_TOP_P:
            object.__setattr__(self, "top_p", MIN_TOP_P)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, vocab_size: int | None = None) -> SamplingConfig:
        check_sampling(self.temperature, self.top_p, self.top_k, self.seed)
        if vocab_size is not None:
            reason = f"must be <= the vocabulary size {vocab_size}, got {self.top_k}"
            require_field(self.top_k <= vocab_size, "top_k", reason)
        return self


def stream_seed(seed: int, stream: str) -> int:
    """The 63-bit seed of one service's random stream for a request seed: blake2b-64("seed:stream") >> 1.

    The draft and the target must not seed their generators alike: the draft's token draws would
    then be correlated with the target's acceptance coins, and seeded sampling would no longer
    follow the target distribution (lossless speculative sampling needs independent draws).
    """
    digest = hashlib.blake2b(f"{seed}:{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def make_generator(seed: int | None, stream: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A per-request generator for one service's stream: seeded requests reproduce exactly,
    unseeded ones do not repeat."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(stream_seed(seed, stream))
    return generator


def warp_probs(
    logits: torch.Tensor,  # [B, S, V] raw logits
    temperature: torch.Tensor,  # [B] float; 0 is treated as 1 (callers handle greedy); clamped to >= MIN_TEMPERATURE
    top_k: torch.Tensor,  # [B] int; 0 = disabled
    top_p: torch.Tensor,  # [B] float; 0 or 1 = disabled
) -> torch.Tensor:  # [B, S, V] float32 probabilities
    """Softmax of logits / temperature restricted to the top-k and top-p (nucleus) set."""
    vocab = logits.shape[-1]
    # Clamped: a tiny temperature must not turn logits into inf / NaN (SamplingConfig makes it greedy).
    temp = torch.where(temperature > 0, temperature.clamp(min=MIN_TEMPERATURE), torch.ones_like(temperature))
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
