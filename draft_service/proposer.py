"""Proposing draft tokens for sessions kept on this service (no gRPC here)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from calispec_core.errors import require
from calispec_core.limits import MAX_SPECULATIVE_TOKENS
from calispec_core.modeling import ModelRunner, Session, prefill_session
from calispec_core.sampling import DRAFT_STREAM, SamplingConfig, make_generator, warp_probs
from calispec_core.sessions import DEFAULT_IDLE_TTL_S, SessionRegistry
from calispec_core.timing import Stopwatch


@dataclass
class DraftSession:
    session: Session
    sampling: SamplingConfig
    generator: torch.Generator


@dataclass(frozen=True)
class Proposal:
    token_ids: list[int]
    token_probs: list[float]  # q(token) after warping; 1.0 when greedy
    probs: torch.Tensor | None  # [k, V] float32 full q, only when sampling


def confidence(logits: torch.Tensor, token: torch.Tensor) -> float:
    """The draft's own probability of `token` (softmax of raw [1, 1, V] logits, before any warping)."""
    return float(torch.softmax(logits[0, -1].float(), dim=-1)[token])


class Proposer:
    """Keeps draft sessions and proposes tokens autoregressively, one forward per token."""

    def __init__(self, runner: ModelRunner, max_sessions: int, idle_ttl_s: float = DEFAULT_IDLE_TTL_S) -> None:
        self.runner = runner
        # A session whose lock is held is mid-call: never reaped, however long the call takes.
        self.sessions: SessionRegistry[DraftSession] = SessionRegistry(
            max_sessions, idle_ttl_s, is_busy=lambda state: state.session.lock.locked()
        )

    def prefill(self, session_id: str, token_ids: list[int], sampling: SamplingConfig, watch: Stopwatch) -> None:
        sampling.validate(self.runner.vocab_size)
        self.sessions.check_capacity()
        with watch.phase("forward"):
            session = prefill_session(self.runner, session_id, token_ids)
        generator = make_generator(sampling.seed, DRAFT_STREAM, self.runner.device)
        self.sessions.add(session_id, DraftSession(session, sampling, generator))

    def rollback(self, session_id: str, length: int, append: list[int]) -> int:
        state = self.sessions.get(session_id)
        with state.session.lock:
            self._rollback(state.session, length, append)
            return len(state.session.tokens)

    def propose(
        self,
        session_id: str,
        num_tokens: int,
        rollback_to: int | None,
        append: list[int],
        watch: Stopwatch,
        min_confidence: float = 0.0,
    ) -> Proposal:
        """Up to num_tokens tokens; fewer when a token's draft probability falls below min_confidence."""
        require(
            1 <= num_tokens <= MAX_SPECULATIVE_TOKENS,
            f"num_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], got {num_tokens}",
        )
        require(0.0 <= min_confidence <= 1.0, f"min_confidence must be in [0, 1], got {min_confidence}")
        state = self.sessions.get(session_id)
        session = state.session
        with session.lock:
            length = len(session.tokens) if rollback_to is None else rollback_to
            require(
                length + len(append) + num_tokens <= self.runner.max_context,
                f"session {session_id!r} would exceed the context ({self.runner.max_context})",
            )
            self._rollback(session, length, append)
            with watch.phase("forward"):
                return self._draft(state, num_tokens, min_confidence)

    def close(self, session_id: str) -> None:
        self.sessions.remove(session_id)

    def _rollback(self, session: Session, length: int, append: list[int]) -> None:
        self.runner.check_token_ids(append, "append_token_ids")
        session.truncate(length)
        session.tokens.extend(append)

    def _draft(self, state: DraftSession, num_tokens: int, min_confidence: float) -> Proposal:
        session, sampling = state.session, state.sampling
        tokens: list[torch.Tensor] = []
        dists: list[torch.Tensor] = []
        for _ in range(num_tokens):
            logits = self.runner.forward(session.pending(), session.cache, logits_to_keep=1)  # [1, 1, V]
            token, dist = self._pick(logits, sampling, state.generator)
            tokens.append(token)
            dists.append(dist)
            session.tokens.append(int(token))  # the next forward feeds it
            if min_confidence > 0 and confidence(logits, token) < min_confidence:
                break  # like HF's assistant_confidence_threshold: keep this token, draft no further
        token_ids = [int(t) for t in tokens]
        if sampling.greedy:
            return Proposal(token_ids, [1.0] * len(token_ids), None)
        probs = torch.cat(dists).float().cpu()  # [k, V]
        chosen = probs.gather(1, torch.tensor(token_ids).view(-1, 1)).view(-1)  # [k]
        return Proposal(token_ids, chosen.tolist(), probs)

    @staticmethod
    def _pick(
        logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token from [1, 1, V] logits: argmax when greedy, else a sample from warped q."""
        if sampling.greedy:
            return logits[0, -1].argmax(), logits[0, -1:]
        q = warp_probs(
            logits,
            torch.tensor([sampling.temperature], device=logits.device),
            torch.tensor([sampling.top_k], device=logits.device),
            torch.tensor([sampling.top_p], device=logits.device),
        )[0]  # [1, V]
        return torch.multinomial(q, 1, generator=generator)[0, 0], q
