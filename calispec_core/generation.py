"""Request-level types of the public API, shared by the coordinator and the client SDK."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass

from calispec_core.errors import InvalidArgument, require
from calispec_core.limits import (
    MAX_NEW_TOKENS,
    MAX_PROMPT_CHARS,
    MAX_SPECULATIVE_TOKENS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
)
from calispec_core.sampling import SamplingConfig


class Mode(enum.IntEnum):
    """Decoding modes; values equal the proto enum calispec.v1.Mode."""

    AR = 1  # target only
    SD = 2  # standard speculative decoding (lossless)
    CSD = 3  # calibrated speculative decoding (lossy)
    OCM_ONLY = 4  # ablation: memory count test only
    SCG_ONLY = 5  # ablation: logit gate only

    @classmethod
    def from_wire(cls, value: int, default: Mode) -> Mode:
        """The proto enum value; 0 (unspecified) means `default`."""
        if value == 0:
            return default
        if value not in cls._value2member_map_:
            raise InvalidArgument(f"unknown mode {value}")
        return cls(value)

    @classmethod
    def parse(cls, name: str) -> Mode:
        try:
            return cls[name.upper()]
        except KeyError:
            choices = ", ".join(m.name.lower() for m in cls)
            raise ValueError(f"unknown mode {name!r}; choose one of {choices}") from None


class FinishReason(enum.IntEnum):
    """Values equal the proto enum calispec.v1.FinishReason."""

    LENGTH = 1
    EOS = 2
    STOP = 3


@dataclass(frozen=True)
class Defaults:
    """What a request gets for parameters it leaves unset (the paper's settings)."""

    max_new_tokens: int = 128
    num_speculative_tokens: int = 6
    mode: Mode = Mode.CSD
    tau: float = 0.01
    lambda_: int = 6


@dataclass(frozen=True)
class GenerationParams:
    """A request's parameters after defaults are applied; `validate` gives clear errors."""

    max_new_tokens: int
    sampling: SamplingConfig
    stop: tuple[str, ...]
    num_speculative_tokens: int
    mode: Mode
    tau: float
    lambda_: int

    def validate(self) -> GenerationParams:
        require(
            1 <= self.max_new_tokens <= MAX_NEW_TOKENS,
            f"max_new_tokens must be in [1, {MAX_NEW_TOKENS}], got {self.max_new_tokens}",
        )
        self.sampling.validate()
        require(
            1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS,
            f"num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], got {self.num_speculative_tokens}",
        )
        require(0.0 < self.tau <= 1.0, f"tau must be in (0, 1], got {self.tau}")
        require(self.lambda_ >= 0, f"lambda must be >= 0, got {self.lambda_}")
        require(len(self.stop) <= MAX_STOP_STRINGS, f"at most {MAX_STOP_STRINGS} stop strings")
        for s in self.stop:
            require(
                0 < len(s) <= MAX_STOP_STRING_CHARS, f"stop strings must be 1 to {MAX_STOP_STRING_CHARS} characters"
            )
        return self


def validate_prompt(prompt: str) -> None:
    require(len(prompt) > 0, "prompt must not be empty")
    require(len(prompt) <= MAX_PROMPT_CHARS, f"prompt longer than {MAX_PROMPT_CHARS} characters")


@dataclass
class GenerationStats:
    """Where a request's tokens and milliseconds went."""

    prompt_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0  # includes rescued
    rescued: int = 0
    emitted: int = 0
    draft_ms: float = 0.0
    target_ms: float = 0.0
    memory_ms: float = 0.0
    coordinator_ms: float = 0.0
    total_ms: float = 0.0
    acceptance_rate: float = 0.0
    rejections: int = 0  # rejection events recorded in the correction memory (includes rescued)
    max_batch_size: int = 0  # largest target batch any round of the request ran in
    draft_unavailable_rounds: int = 0  # rounds run target-only because the draft was unavailable
    target_failovers: int = 0  # times the request moved to another target replica

    @property
    def degraded(self) -> bool:
        """Served despite a failed service: some rounds without the draft, or moved to another replica."""
        return self.draft_unavailable_rounds > 0 or self.target_failovers > 0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)
