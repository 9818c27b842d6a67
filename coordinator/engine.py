"""The propose/verify loop of one request (no gRPC here).

Per round: the draft proposes γ tokens (after rolling back to what the target kept last
round and appending the token the target emitted), the target verifies them in one
forward pass and commits the outcome to its own session, and the new tokens are handed
out. Mode `ar` skips the draft: each round is one plain target step.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from calispec_core.errors import Cancelled, InvalidArgument, require
from calispec_core.generation import FinishReason, GenerationParams, GenerationStats, Mode, validate_prompt
from calispec_core.timing import Deadline, Stopwatch, ns_to_ms
from coordinator.backends import DraftBackend, Proposal, TargetBackend, Verdict
from coordinator.detokenizer import IncrementalDetokenizer
from coordinator.replicas import ReplicaSet

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0


@dataclass
class Chunk:
    """New output of one round; the last chunk of a request carries finish_reason and stats."""

    token_ids: list[int]
    text: str
    request_id: str
    finish_reason: FinishReason | None = None
    stats: GenerationStats | None = None


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    max_new_tokens: int
    deadline: Deadline
    target: TargetBackend
    watch: Stopwatch = field(default_factory=Stopwatch)
    stats: GenerationStats = field(default_factory=GenerationStats)
    generated: list[int] = field(default_factory=list)
    # what the draft must do before its next proposal to match the committed sequence
    draft_rollback_to: int | None = None
    draft_append: list[int] = field(default_factory=list)
    opened: list[DraftBackend | TargetBackend] = field(default_factory=list)  # sessions to close

    @property
    def use_draft(self) -> bool:
        return self.params.mode != Mode.AR


class Orchestrator:
    """Runs requests against one draft and N target replicas (a request sticks to one replica)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        draft: DraftBackend,
        targets: list[TargetBackend] | ReplicaSet,  # a ReplicaSet may change while serving
        eos_token_ids: tuple[int, ...],
        max_context: int,
    ) -> None:
        require(len(targets) > 0, "at least one target replica is required")
        self.tokenizer = tokenizer
        self.draft = draft
        self.replicas = targets if isinstance(targets, ReplicaSet) else ReplicaSet(targets)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_context = max_context

    def generate(
        self,
        prompt: str,
        params: GenerationParams,
        deadline: Deadline,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Iterator[Chunk]:
        """Yield one chunk per round until EOS, a stop string or the token limit."""
        request = self._new_request(prompt, params, deadline)
        try:
            self._prefill(request)
            yield from self._rounds(request, cancelled)
        finally:
            self._close(request)

    def _new_request(self, prompt: str, params: GenerationParams, deadline: Deadline) -> _Request:
        validate_prompt(prompt)
        params.validate()
        prompt_ids = self.tokenizer.encode(prompt)
        require(len(prompt_ids) > 0, "prompt encodes to no tokens")
        room = self.max_context - len(prompt_ids) - 1
        if room < 1:
            raise InvalidArgument(
                f"prompt of {len(prompt_ids)} tokens leaves no room in the context ({self.max_context})"
            )
        target = self.replicas.pick()
        request = _Request(uuid.uuid4().hex, prompt_ids, params, min(params.max_new_tokens, room), deadline, target)
        request.stats.prompt_tokens = len(prompt_ids)
        return request

    def _prefill(self, request: _Request) -> None:
        p = request.params
        ns = request.target.prefill(
            request.request_id, request.prompt_ids, p.sampling, p.mode, p.tau, p.lambda_, request.deadline.remaining()
        )
        request.opened.append(request.target)
        request.stats.target_ms += ns_to_ms(ns)
        if request.use_draft:
            ns = self.draft.prefill(request.request_id, request.prompt_ids, p.sampling, request.deadline.remaining())
            request.opened.append(self.draft)
            request.stats.draft_ms += ns_to_ms(ns)

    def _rounds(self, request: _Request, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        detok = IncrementalDetokenizer(self.tokenizer, request.params.stop)
        while True:
            if cancelled():
                raise Cancelled("request cancelled by the client")
            new_tokens = self._round(request)
            finish = self._clip(request, new_tokens)
            text, stopped = detok.add(new_tokens)
            if stopped:
                finish = FinishReason.STOP
            request.generated += new_tokens
            request.stats.emitted += len(new_tokens)
            if finish is None:
                yield Chunk(new_tokens, text, request.request_id)
                continue
            if not stopped:
                text += detok.finish()
            yield Chunk(new_tokens, text, request.request_id, finish, self._final_stats(request))
            return

    def _round(self, request: _Request) -> list[int]:
        """One propose/verify round; returns the tokens it emits."""
        remaining = request.max_new_tokens - len(request.generated)
        gamma = min(request.params.num_speculative_tokens, remaining - 1) if request.use_draft else 0
        proposal = self._propose(request, gamma) if gamma > 0 else None
        verdict = request.target.verify(request.request_id, proposal, request.deadline.remaining())
        self._account(request, proposal, verdict)
        drafted = proposal.token_ids[: verdict.accepted_count] if proposal else []
        new_tokens = [*drafted, verdict.next_token]
        if request.use_draft:
            self._sync_draft_later(request, proposal, verdict)
        return new_tokens

    def _propose(self, request: _Request, gamma: int) -> Proposal:
        proposal = self.draft.propose(
            request.request_id, gamma, request.draft_rollback_to, request.draft_append, request.deadline.remaining()
        )
        request.draft_rollback_to, request.draft_append = None, []
        return proposal

    @staticmethod
    def _sync_draft_later(request: _Request, proposal: Proposal | None, verdict: Verdict) -> None:
        """The draft learns the round's outcome with its next Propose, saving a round trip."""
        committed = len(request.prompt_ids) + len(request.generated)  # before this round's tokens
        if proposal is not None:
            request.draft_rollback_to = committed + verdict.accepted_count
            request.draft_append = [verdict.next_token]
        else:
            if request.draft_rollback_to is None:
                request.draft_rollback_to = committed
            request.draft_append.append(verdict.next_token)

    @staticmethod
    def _account(request: _Request, proposal: Proposal | None, verdict: Verdict) -> None:
        stats = request.stats
        stats.rounds += 1
        stats.target_ms += ns_to_ms(verdict.service_ns - verdict.memory_ns)
        stats.memory_ms += ns_to_ms(verdict.memory_ns)
        stats.rejections += verdict.rejections
        stats.max_batch_size = max(stats.max_batch_size, verdict.batch_size)
        if proposal is not None:
            stats.drafted += len(proposal.token_ids)
            stats.accepted += verdict.accepted_count
            stats.rescued += len(verdict.rescued_positions)
            stats.draft_ms += ns_to_ms(proposal.service_ns)

    def _clip(self, request: _Request, new_tokens: list[int]) -> FinishReason | None:
        """Cut new_tokens (in place) at EOS or the token limit; returns the finish reason, if any."""
        for i, token in enumerate(new_tokens):
            if token in self.eos_token_ids:
                del new_tokens[i + 1 :]
                return FinishReason.EOS
        room = request.max_new_tokens - len(request.generated)
        if len(new_tokens) >= room:
            del new_tokens[room:]
            return FinishReason.LENGTH
        return None

    @staticmethod
    def _final_stats(request: _Request) -> GenerationStats:
        stats = request.stats
        stats.total_ms = ns_to_ms(request.watch.total_ns)
        stats.coordinator_ms = max(0.0, stats.total_ms - stats.draft_ms - stats.target_ms - stats.memory_ms)
        stats.acceptance_rate = stats.accepted / stats.drafted if stats.drafted else 0.0
        return stats

    def _close(self, request: _Request) -> None:
        """Best effort: a session left behind only costs memory until the service restarts."""
        for backend in request.opened:
            try:
                backend.close(request.request_id, CLOSE_TIMEOUT_S)
            except Exception as exc:  # closing must not mask the request's outcome
                log.warning("closing session %s failed: %s", request.request_id, exc)
