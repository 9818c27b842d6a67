"""Target sessions and their verification rounds (no gRPC here).

One `verify` call = one target forward over [pending tokens, draft tokens], then the pure
verifier (`target_service.verifier`) decides what is kept, then the outcome is committed to
the session: accepted drafts stay in the KV cache, the rest is cropped, and the emitted
token becomes the next round's pending input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from calispec.errors import InvalidArgument, require
from calispec.generation import Mode
from calispec.limits import MAX_SPECULATIVE_TOKENS
from calispec.modeling import ModelRunner, Session, SessionRegistry, prefill_session
from calispec.sampling import SamplingConfig, make_generator
from calispec.timing import Stopwatch
from target_service.pair_table import PairTable
from target_service.verifier import PLACEHOLDER_TOKEN_ID, VerifyInput, verify

DEFAULT_TAU = 0.01
DEFAULT_LAMBDA = 6


@dataclass(frozen=True)
class RescueConfig:
    """Per-session CSD parameters (the paper's τ and λ)."""

    mode: Mode = Mode.CSD
    tau: float = DEFAULT_TAU
    lambda_: int = DEFAULT_LAMBDA

    def validate(self) -> RescueConfig:
        require(0.0 < self.tau <= 1.0, f"tau must be in (0, 1], got {self.tau}")
        require(0 <= self.lambda_ < 2**31, f"lambda must be >= 0, got {self.lambda_}")
        return self


@dataclass
class TargetSession:
    session: Session
    sampling: SamplingConfig
    rescue: RescueConfig
    generator: torch.Generator


@dataclass(frozen=True)
class VerifyResult:
    accepted_count: int
    rescued_positions: list[int]
    next_token: int
    next_is_bonus: bool
    rejections: int


class TargetEngine:
    def __init__(self, runner: ModelRunner, max_sessions: int, table: PairTable) -> None:
        self.runner = runner
        self.table = table  # MemoryLink (if any) ships its local events and refreshes it in the background
        self.sessions: SessionRegistry[TargetSession] = SessionRegistry(max_sessions)

    def prefill(
        self, session_id: str, token_ids: list[int], sampling: SamplingConfig, rescue: RescueConfig, watch: Stopwatch
    ) -> None:
        sampling.validate(self.runner.vocab_size)
        rescue.validate()
        self.sessions.check_capacity()
        with watch.phase("forward"):
            session = prefill_session(self.runner, session_id, token_ids)
        generator = make_generator(sampling.seed, self.runner.device)
        self.sessions.add(session_id, TargetSession(session, sampling, rescue, generator))

    def close(self, session_id: str) -> None:
        self.sessions.remove(session_id)

    def verify(
        self, session_id: str, draft: list[int], draft_probs: torch.Tensor | None, watch: Stopwatch
    ) -> VerifyResult:
        """Verify `draft` (may be empty: one plain decoding step) and commit the outcome."""
        state = self.sessions.get(session_id)
        session = state.session
        with session.lock:
            self._check_draft(state, draft, draft_probs)
            with watch.phase("forward"):
                logits = self.runner.forward(session.pending() + draft, session.cache, len(draft) + 1)
            with watch.phase("verify"):
                out = verify(self._verify_input(state, draft, draft_probs, logits), self.table.counts)
                accepted = int(out.accepted_count[0])  # one device sync per round, after the math
                next_token = int(out.next_token[0])
            with watch.phase("memory"):
                rejections = self._record_events(draft, out.event_mask[0], out.target_tokens[0])
            self._commit(session, draft, accepted, next_token)
            rescued = out.rescued[0].nonzero().view(-1).tolist()
            return VerifyResult(accepted, rescued, next_token, bool(out.next_is_bonus[0]), rejections)

    def _check_draft(self, state: TargetSession, draft: list[int], draft_probs: torch.Tensor | None) -> None:
        require(
            len(draft) <= MAX_SPECULATIVE_TOKENS, f"at most {MAX_SPECULATIVE_TOKENS} draft tokens, got {len(draft)}"
        )
        self.runner.check_token_ids(draft, "draft_token_ids")
        room = self.runner.max_context - len(state.session.tokens)
        require(len(draft) < room, f"{len(draft)} draft tokens do not fit the remaining context ({room})")
        if state.sampling.greedy or not draft:
            return
        if draft_probs is None:
            raise InvalidArgument("draft_probs are required when the session samples (temperature > 0)")
        require(
            draft_probs.shape[0] == len(draft) and draft_probs.shape[1] <= self.runner.vocab_size,
            f"draft_probs shape {tuple(draft_probs.shape)} does not match {len(draft)} tokens "
            f"and a vocabulary of at most {self.runner.vocab_size}",
        )
        require(bool(torch.isfinite(draft_probs).all()), "draft_probs must be finite")

    def _verify_input(
        self, state: TargetSession, draft: list[int], draft_probs: torch.Tensor | None, logits: torch.Tensor
    ) -> VerifyInput:
        """A batch of one row; the verifier is batch-shaped so batching sessions changes only this."""
        device = logits.device
        sampling, rescue = state.sampling, state.rescue
        gamma = len(draft)
        tokens = torch.tensor([draft or [PLACEHOLDER_TOKEN_ID]], dtype=torch.long, device=device)[:, :gamma]
        probs = None
        if draft_probs is not None and not sampling.greedy and gamma:
            probs = draft_probs.to(device=device, dtype=torch.float32).unsqueeze(0)  # [1, G, Vd]
        return VerifyInput(
            target_logits=logits,  # [1, G+1, V]
            draft_tokens=tokens,  # [1, G]
            num_draft=torch.tensor([gamma], device=device),  # [1]
            draft_probs=probs,
            temperature=torch.tensor([sampling.temperature], dtype=torch.float32, device=device),
            top_k=torch.tensor([sampling.top_k], dtype=torch.long, device=device),
            top_p=torch.tensor([sampling.top_p], dtype=torch.float32, device=device),
            mode=torch.tensor([int(rescue.mode)], dtype=torch.long, device=device),
            log_tau=torch.tensor([math.log(rescue.tau)], dtype=torch.float32, device=device),
            lambda_=torch.tensor([rescue.lambda_], dtype=torch.long, device=device),
            generators=[state.generator],
        )

    def _record_events(self, draft: list[int], event_mask: torch.Tensor, target_tokens: torch.Tensor) -> int:
        """Count this round's rejections in the local table at once; MemoryLink ships them later."""
        if not draft:
            return 0
        draft_ids = torch.tensor(draft, dtype=torch.long, device=event_mask.device)[event_mask]  # [E]
        target_ids = target_tokens[event_mask]  # [E]
        if draft_ids.numel() == 0:
            return 0
        self.table.add_local(draft_ids, target_ids)
        return int(draft_ids.numel())

    @staticmethod
    def _commit(session: Session, draft: list[int], accepted: int, next_token: int) -> None:
        """Keep pending + accepted drafts in the cache; the emitted token is the next pending input."""
        rejected = len(draft) - accepted
        if rejected:
            session.cache.crop(-rejected)
        session.tokens.extend(draft[:accepted])
        session.tokens.append(next_token)
