"""Request-level types of the serving side: parameters with defaults and validation.

Mode, FinishReason and GenerationStats live in the SDK (calispec.types) and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calispec.types import ConstraintKind as ConstraintKind
from calispec.types import FinishReason as FinishReason  # re-exported for the services
from calispec.types import GenerationStats as GenerationStats
from calispec.types import Mode
from calispec.types import OutputConstraint as OutputConstraint
from calispec.types import TokenLogprob as TokenLogprob
from calispec.v1 import common_pb2
from calispec_core.errors import InvalidArgument, require, require_field
from calispec_core.limits import (
    MAX_CONSTRAINT_CHARS,
    MAX_CONSTRAINT_CHOICES,
    check_csd_thresholds,
    check_logprobs,
    check_max_new_tokens,
    check_speculative_tokens,
    check_stop_strings,
    check_stop_token_ids,
    require_unicode,
)
from calispec_core.limits import validate_prompt as validate_prompt
from calispec_core.logit_rules import LogitRules
from calispec_core.sampling import SamplingConfig


def mode_from_wire(value: int, default: Mode) -> Mode:
    """The proto enum value; 0 (unspecified) means `default`."""
    if value == 0:
        return default
    if value not in Mode._value2member_map_:
        raise InvalidArgument(f"unknown mode {value}")
    return Mode(value)


def constraint_from_wire(msg: common_pb2.OutputConstraint, present: bool) -> OutputConstraint | None:
    """The proto message (`present`: the field is set), checked; an unknown kind is INVALID_ARGUMENT."""
    if not present:
        return None
    try:
        constraint = OutputConstraint.from_pb(msg)
    except ValueError as exc:
        raise InvalidArgument(f"structured output: {exc}") from None
    check_constraint(constraint)
    return constraint


def check_constraint(constraint: OutputConstraint | None) -> None:
    """A structured output's size and form; whether its grammar compiles is the target's to say (it alone has
    the grammar engine)."""
    if constraint is None:
        return
    kind = constraint.kind
    for i, text in enumerate((constraint.spec, *constraint.choices)):
        require_unicode(text, f"choice {i - 1}" if i else f"the {kind.name.lower()}")  # else a 500 encoding it
    if kind == ConstraintKind.CHOICE:
        count = len(constraint.choices)
        require(
            0 < count <= MAX_CONSTRAINT_CHOICES, f"a choice needs 1 to {MAX_CONSTRAINT_CHOICES} strings, got {count}"
        )
        size = sum(map(len, constraint.choices))
    else:
        require(not constraint.choices, f"only a choice constraint has choices, not {kind.name.lower()}")
        require(bool(constraint.spec) or kind == ConstraintKind.JSON_OBJECT, f"{kind.name.lower()} must not be empty")
        size = len(constraint.spec)
    require(
        size <= MAX_CONSTRAINT_CHARS, f"a structured output spec may hold {MAX_CONSTRAINT_CHARS} characters, got {size}"
    )


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
    constraint: OutputConstraint | None = None  # structured output: the grammar the new tokens follow (the target's)
    rules: LogitRules | None = None  # penalties, logit bias, min_p, allowed ids, min_tokens (None: none)

    def validate(self, vocab_size: int | None = None) -> GenerationParams:
        """Raise InvalidArgument for a parameter out of range (top_k beyond `vocab_size`, the models', too)."""
        check_lengths(self.max_new_tokens, self.num_speculative_tokens)
        check_logprobs(self.logprobs)
        check_logprobs(self.prompt_logprobs, "prompt_logprobs")
        self.sampling.validate(vocab_size)
        check_csd_thresholds(self.tau, self.lambda_)
        check_stop_strings(self.stop)
        check_stop_token_ids(self.stop_token_ids)
        check_constraint(self.constraint)
        if self.rules is not None:
            self.rules.validate(vocab_size)
            reason = f"must be <= max_tokens ({self.max_new_tokens}), got {self.rules.min_tokens}"
            require_field(self.rules.min_tokens <= self.max_new_tokens, "min_tokens", reason)
        return self


@dataclass(frozen=True)
class SessionOutput:
    """What a model session's output follows, and how much of it the session's tokens already hold."""

    constraint: OutputConstraint | None = None  # structured output: the grammar it follows
    rules: LogitRules | None = None  # the logit rules it follows
    written: int = 0  # the session's last `written` tokens are output already written (a reopened session)

    @classmethod
    def of(cls, constraint: OutputConstraint | None, rules: LogitRules | None, written: int) -> SessionOutput:
        """`written` only where a grammar or rules need it: a model service of wave 59 refuses it without a grammar."""
        return cls(constraint, rules, written if constraint is not None or rules is not None else 0)

    def check(self, token_ids: Sequence[int]) -> None:
        reason = f"{self.written} exceeds the {len(token_ids)} tokens sent"
        require_field(0 <= self.written <= len(token_ids), "output_written", reason)

    def prompt(self, token_ids: Sequence[int]) -> Sequence[int]:
        return token_ids[: len(token_ids) - self.written]


FREE_OUTPUT = SessionOutput()
