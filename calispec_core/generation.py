"""Request-level types of the serving side: parameters with defaults and validation.

Mode, FinishReason and GenerationStats live in the SDK (calispec.types) and are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from calispec.types import FinishReason as FinishReason  # re-exported for the services
from calispec.types import GenerationStats as GenerationStats
from calispec.types import Mode
from calispec.types import TokenLogprob as TokenLogprob
from calispec_core.errors import InvalidArgument
from calispec_core.limits import (
    check_csd_thresholds,
    check_logprobs,
    check_max_new_tokens,
    check_speculative_tokens,
    check_stop_strings,
    check_stop_token_ids,
)
from calispec_core.limits import validate_prompt as validate_prompt
from calispec_core.sampling import SamplingConfig


def mode_from_wire(value: int, default: Mode) -> Mode:
    """The proto enum value; 0 (unspecified) means `default`."""
    if value == 0:
        return default
    if value not in Mode._value2member_map_:
        raise InvalidArgument(f"unknown mode {value}")
    return Mode(value)


def check_lengths(max_new_tokens: int, num_speculative_tokens: int | None) -> None:
    check_max_new_tokens(max_new_tokens)
    check_speculative_tokens(num_speculative_tokens)


@dataclass(frozen=True)
class Defaults:
    """What a request gets for parameters it leaves unset (the paper's settings)."""

    max_new_tokens: int = 128
    num_speculative_tokens: int | None = None  # None: adaptive γ (coordinator/cost_model.py)
    mode: Mode = Mode.CSD
    tau: float = 0.01
    lambda_: int = 6

    def __post_init__(self) -> None:
        # Every request that leaves one of these unset gets it: a bad default would fail each of them.
        check_lengths(self.max_new_tokens, self.num_speculative_tokens)
        check_csd_thresholds(self.tau, self.lambda_)


@dataclass(frozen=True)
class GenerationParams:
    """A request's parameters after defaults are applied; `validate` gives clear errors."""

    max_new_tokens: int
    sampling: SamplingConfig
    stop: tuple[str, ...]
    num_speculative_tokens: int | None  # fixed γ; None: adaptive, chosen per round by the cost model
    mode: Mode
    tau: float
    lambda_: int
    ignore_eos: bool = False  # go on past EOS to the token limit (vLLM's `ignore_eos`: load tests of a fixed length)
    logprobs: int | None = None  # None: none; k: each new token's log-probability and the k most likely there
    prompt_logprobs: int | None = None  # the same for each prompt token from the second (vLLM's `prompt_logprobs`)
    stop_token_ids: tuple[int, ...] = ()  # vLLM's: a new token among them ends the request (kept, finish STOP)

    def validate(self, vocab_size: int | None = None) -> GenerationParams:
        """Raise InvalidArgument for a parameter out of range (top_k beyond `vocab_size`, the models', too)."""
        check_lengths(self.max_new_tokens, self.num_speculative_tokens)
        check_logprobs(self.logprobs)
        check_logprobs(self.prompt_logprobs, "prompt_logprobs")
        self.sampling.validate(vocab_size)
        check_csd_thresholds(self.tau, self.lambda_)
        check_stop_strings(self.stop)
        check_stop_token_ids(self.stop_token_ids)
        return self
