"""What the coordinator needs from the model services, as plain types (no gRPC here).

`coordinator.clients` implements these over gRPC; tests may implement them in-process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from calispec_core.errors import Unavailable
from calispec_core.generation import FREE_OUTPUT, Mode, SessionOutput, TokenLogprob
from calispec_core.sampling import SamplingConfig


class SessionLost(Unavailable):
    """The service is up but no longer has the session (it restarted, or closed it as idle): reopen it."""


@dataclass(frozen=True)
class ModelFacts:
    model_id: str
    vocab_size: int
    tokenizer_fingerprint: str
    max_context: int
    eos_token_ids: tuple[int, ...]
    forward_costs: dict[int, float] = field(default_factory=dict)  # ms by new tokens, measured at start-up
    structured_output: bool = False  # a target that applies OutputConstraints (older ones ignore them)
    logit_rules: bool = False  # a target that applies LogitRules (older ones ignore them)


@dataclass(frozen=True)
class Proposal:
    token_ids: list[int]
    probs: bytes  # dense q, float32 [len(token_ids), vocab_size], from a draft sending q dense; else empty
    vocab_size: int
    service_ns: int  # whole Propose handler inside the draft service
    forward_ns: int = 0  # part of service_ns spent in model forwards
    sparse_probs: bytes = b""  # q when sampling, an encoded `SparseDistributions` relayed untouched; else empty
    prefill_ns: int = 0  # part of forward_ns in a step that also computed a riding prompt: not a per-token cost


@dataclass(frozen=True)
class Opened:
    """A target session opened by a prefill."""

    service_ns: int  # whole Prefill handler inside the target service
    prompt_logprobs: list[TokenLogprob] | None = None  # one per prompt token from the second, when asked for


@dataclass(frozen=True)
class Verdict:
    accepted_count: int
    rescued_positions: list[int]
    next_token: int
    next_is_bonus: bool
    rejections: int  # rejection events this round (reported to the correction memory)
    batch_size: int  # sessions in the target forward that verified this round
    service_ns: int  # whole Verify handler inside the target service
    memory_ns: int  # part of service_ns spent on the correction memory
    forward_ns: int = 0  # part of service_ns spent in the model forward
    batch_tokens: int = 0  # new tokens over every session of that forward; 0: not reported
    withheld_rescues: int = 0  # 1: the round ended where the meaning guard refused a rescue
    logprobs: list[TokenLogprob] | None = None  # per emitted token (kept drafts, then next_token), when asked for


class DraftBackend(Protocol):
    logit_rules: bool  # it applies LogitRules (as its info() said; False until read)

    def info(self, timeout: float) -> ModelFacts: ...
    def prefill(
        self,
        session_id: str,
        token_ids: list[int],
        sampling: SamplingConfig,
        timeout: float,
        output: SessionOutput = FREE_OUTPUT,
    ) -> int: ...  # output: as TargetBackend.prefill's
    def propose(
        self,
        session_id: str,
        num_tokens: int,
        rollback_to: int | None,
        append: list[int],
        timeout: float,
        min_confidence: float = 0.0,
        cohort: int = 0,  # Propose calls sent at this moment, this one included (0: no hint)
        min_path_confidence: float = 0.0,
    ) -> Proposal: ...
    def close(self, session_id: str, timeout: float) -> None: ...


class TargetBackend(Protocol):
    address: str
    structured_output: bool  # it applies OutputConstraints (as its info() said; False until read)
    logit_rules: bool  # it applies LogitRules (as its info() said; False until read)

    def info(self, timeout: float) -> ModelFacts: ...
    def prefill(
        self,
        session_id: str,
        token_ids: list[int],
        sampling: SamplingConfig,
        mode: Mode,
        tau: float,
        lambda_: int,
        timeout: float,
        prompt_logprobs: int | None = None,  # None, or k: each prompt token's log-probability and the k likeliest
        output: SessionOutput = FREE_OUTPUT,  # the grammar and logit rules its emitted tokens follow
    ) -> Opened: ...
    def verify(
        self, session_id: str, proposal: Proposal | None, timeout: float, cohort: int = 0, logprobs: int | None = None
    ) -> Verdict: ...  # cohort: Verify calls sent at this moment, this one included (0: no hint); logprobs: None or k
    def close(self, session_id: str, timeout: float) -> None: ...
