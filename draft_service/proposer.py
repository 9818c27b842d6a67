"""Proposing draft tokens for sessions kept on this service (no gRPC here)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from calispec_core.argmax import argmax_last
from calispec_core.batch_forward import forward_rows
from calispec_core.batch_scheduler import DEFAULT_GATHER_S, BatchScheduler
from calispec_core.compute import on_compute_thread
from calispec_core.constraints import ConstraintCompiler, SessionGrammar
from calispec_core.errors import FailedPrecondition, require
from calispec_core.generation import FREE_OUTPUT, SessionOutput
from calispec_core.limits import DEFAULT_RIDE_PREFILL_TOKENS, INT8, check_speculative_tokens
from calispec_core.logit_rules import SessionRules
from calispec_core.modeling import ModelRunner, Session, prefill_session, settle_riders, store_riders, wait_for
from calispec_core.prefix_cache import PrefixCache
from calispec_core.sampling import DRAFT_STREAM, SamplingConfig, make_generator, warp_probs
from calispec_core.sessions import DEFAULT_IDLE_TTL_S, SessionRegistry
from calispec_core.sparse_q import SparseQ, truncate
from calispec_core.timing import Stopwatch, now_ns
from calispec_core.vocab_pruning import LogitColumns

log = logging.getLogger(__name__)


@dataclass
class DraftSession:
    session: Session
    sampling: SamplingConfig
    generator: torch.Generator
    # structured output: the grammar the proposals follow (None: free, or given up: see Proposer._follow)
    grammar: SessionGrammar | None = None
    output_start: int = 0  # where the output begins in session.tokens (the grammar follows tokens from there)
    rules: SessionRules | None = None  # the request's logit rules (penalties, bias, ...), followed while drafting

    @property
    def output(self) -> list[int]:
        return self.session.tokens[self.output_start :]


@dataclass(frozen=True)
class Proposal:
    token_ids: list[int]
    token_probs: list[float]  # q(token) after warping (and truncation); 1.0 when greedy
    probs: (
        torch.Tensor | None
    )  # [k, V] float32 full q over the whole vocabulary, only when sampling with proposal_top_k 0
    sparse: SparseQ | None = None  # q as sampled from, only when sampling with a proposal_top_k
    forward_ns: int = 0  # the batched forwards this proposal took part in (the rest is overhead)
    prefill_ns: int = 0  # part of forward_ns in a step that also computed riding prompts (not a per-token cost)


DEFAULT_MAX_BATCH = 8  # sessions drafting in one forward
NON_FINITE_DRAFT = (
    "the draft model produced non-finite logits (NaN/inf): its weights are damaged or its dtype overflows"
)

# [1, 1, C] logits (C: the logit columns, the whole vocabulary unless the output layer is pruned) ->
# (picked column, its q) with q a dense [1, C] row or sparse (columns [n], probs [n])
Dist = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
Picker = Callable[[torch.Tensor, SamplingConfig, torch.Generator], tuple[torch.Tensor, Dist]]


def confidence(logits: torch.Tensor, column: torch.Tensor) -> float:
    """The draft's own probability of the token in `column` (softmax of raw [1, 1, C] float32 logits, before
    any warping; over the kept ids when the output layer is pruned: the draft actually served)."""
    return float(torch.softmax(logits[0, -1], dim=-1)[column])


@dataclass
class _Job:
    """One Propose call while it drafts: its session drafts one token per batched step."""

    state: DraftSession
    num_tokens: int
    min_confidence: float
    columns: LogitColumns  # the token id of each logit column
    min_path_confidence: float = 0.0
    tokens: list[int] = field(default_factory=list)
    dists: list[Dist] = field(default_factory=list)  # q over the logit columns per token, when sampling
    forward_ns: int = 0
    prefill_ns: int = 0
    done: bool = False
    path: float = 1.0  # the product of the proposed tokens' draft probabilities (while an early stop needs it)

    def step(self, logits: torch.Tensor, pick: Picker) -> None:
        """Take one token from this step's [1, 1, C] logits."""
        logits = logits.float()  # once: CPU reductions over a bf16 vocabulary are several times slower
        state = self.state
        if state.grammar is not None:
            logits = self._constrain(logits, state.grammar)
        if state.rules is not None:
            logits = self._follow_rules(logits, state)
        column, dist = pick(logits, state.sampling, state.generator)
        token = int(self.columns.token_ids(column))
        self.tokens.append(token)
        self.dists.append(dist)
        state.session.tokens.append(token)  # the next forward feeds it
        complete = self._follows_to_the_end(token)  # every token, the last one too: the grammar tracks the session
        full = len(self.tokens) == self.num_tokens  # then no confidence is needed (a softmax over the vocabulary)
        self.done = full or complete or self._unsure(logits, column)

    def _constrain(self, logits: torch.Tensor, grammar: SessionGrammar) -> torch.Tensor:
        """[1, 1, C] logits with refused tokens' at -inf; a pruned layer without one allowed column is left as it is
        (its token is then refused, and the grammar given up: `_follows_to_the_end`)."""
        allowed = grammar.allowed(logits.device)  # [V] over token ids
        if self.columns.kept is not None:
            allowed = allowed[self.columns.kept]  # [C] (kept lives on the model's device, as the logits)
        if not bool(allowed.any()):
            return logits
        return logits.masked_fill(~allowed, float("-inf"))  # a new tensor: the forward's is read-only

    def _follow_rules(self, logits: torch.Tensor, state: DraftSession) -> torch.Tensor:
        """[1, 1, C] logits under the session's logit rules; where they leave no token (rules at odds with the
        grammar), the logits as they were: the target decides, drafting only moves acceptance."""
        assert state.rules is not None
        ruled = logits.clone()  # the forward's is read-only
        empty = state.rules.apply(ruled[0, -1:], state.output, [], state.sampling.temperature, self.columns)
        return logits if empty is not None and bool(empty.any()) else ruled  # empty: the target's to report

    def _follows_to_the_end(self, token: int) -> bool:
        """The grammar takes the token; True when it is complete, so that drafting on is pointless (only the
        end-of-sequence token may follow). A token it refuses gives the grammar up: the session drafts freely."""
        grammar = self.state.grammar
        if grammar is None:
            return False
        if not grammar.commit([token]):
            log.warning(
                "session %r: drafted a token its grammar refuses; drafting freely", self.state.session.session_id
            )
            self.state.grammar = None
            return False
        return grammar.stopped

    def _unsure(self, logits: torch.Tensor, column: torch.Tensor) -> bool:
        """Whether drafting stops after this token. Like HF's assistant_confidence_threshold, an unsure token is
        kept and drafting stops after it: when its own probability is below min_confidence, or when the
        proposal's path probability (the draft's estimate that every token so far passes) is below
        min_path_confidence (docs/performance.md, "Where a proposal stops")."""
        if self.min_confidence <= 0 and self.min_path_confidence <= 0:
            return False
        token_confidence = confidence(logits, column)
        self.path *= token_confidence
        return token_confidence < self.min_confidence or self.path < self.min_path_confidence

    def reset(self) -> None:
        self.tokens.clear()
        self.dists.clear()
        self.forward_ns = 0
        self.prefill_ns = 0
        self.done = False
        self.path = 1.0

    def proposal(self) -> Proposal:
        return replace(self._drafted(), forward_ns=self.forward_ns, prefill_ns=self.prefill_ns)

    def _drafted(self) -> Proposal:
        """The proposed tokens, their q(token) and, when sampling, q itself."""
        if self.state.sampling.greedy:
            return Proposal(self.tokens, [1.0] * len(self.tokens), None)
        if isinstance(self.dists[0], tuple):
            rows = [(self.columns.token_ids(c), p) for c, p in self.dists]  # type: ignore[misc]  # token ids
            chosen = [float(p[ids == t][0]) for t, (ids, p) in zip(self.tokens, rows, strict=True)]
            return Proposal(self.tokens, chosen, None, SparseQ.of_rows(rows))
        probs = self.columns.full_width(torch.cat(self.dists).float()).cpu()  # type: ignore[arg-type]  # [k, V]
        dense = probs.gather(1, torch.tensor(self.tokens).view(-1, 1)).view(-1)  # [k]
        return Proposal(self.tokens, dense.tolist(), probs)


class Proposer:
    """Keeps draft sessions and proposes tokens autoregressively. Concurrent Propose calls draft
    together: one batched forward per step for every session still drafting (`BatchScheduler`)."""

    def __init__(
        self,
        runner: ModelRunner,
        max_sessions: int,
        idle_ttl_s: float = DEFAULT_IDLE_TTL_S,
        max_batch: int = DEFAULT_MAX_BATCH,
        proposal_top_k: int = 256,  # tokens of q a sampling proposal keeps (0: the full q, sent dense)
        gather_s: float = DEFAULT_GATHER_S,  # an idle batcher waits this long for the last batch's sessions
        prefix_cache: PrefixCache | None = None,  # prompt KV reused by later prompts (None: off)
        ride_prefill_tokens: int = DEFAULT_RIDE_PREFILL_TOKENS,  # prompts up to this long prefill in a Propose step
        structured_output: bool = True,  # False: constraints are ignored (sessions draft freely)
    ) -> None:
        require(proposal_top_k >= 0, f"proposal_top_k must be >= 0 (0: full q), got {proposal_top_k}")
        self.runner = runner
        self.constraints = ConstraintCompiler(runner) if structured_output else None
        self.prefix_cache = prefix_cache
        self.ride_prefill_tokens = ride_prefill_tokens
        self.proposal_top_k = proposal_top_k
        self.scheduler: BatchScheduler[_Job, Proposal] = BatchScheduler(
            self._draft_batch, max_batch, "draft-batcher", gather_s
        )
        # A session whose lock is held is mid-call: never reaped, however long the call takes.
        self.sessions: SessionRegistry[DraftSession] = SessionRegistry(
            max_sessions, idle_ttl_s, is_busy=lambda state: state.session.lock.locked()
        )

    def prefill(
        self,
        session_id: str,
        token_ids: list[int],
        sampling: SamplingConfig,
        watch: Stopwatch,
        output: SessionOutput = FREE_OUTPUT,
    ) -> None:
        """Open the session; a short prompt computes nothing yet: it rides in the first step of the session's first
        Propose (`prefill_session`). `output`: the grammar (structured output; ignored without structured output
        here) and logit rules its proposals follow, the last `output.written` of `token_ids` already written."""
        sampling.validate(self.runner.vocab_size)
        output.check(token_ids)
        grammar = self._grammar(token_ids, output)
        rules = SessionRules.of(output.rules, output.prompt(token_ids), self.runner.vocab_size, self.runner.device)
        with self.sessions.opening(session_id) as open_session:
            with watch.phase("forward"):
                cache = None if self._isolated(sampling) else self.prefix_cache  # its KV: its own calls' only
                session = prefill_session(
                    self.runner, session_id, token_ids, cache, ride_tokens=self.ride_prefill_tokens
                )
            generator = make_generator(sampling.seed, DRAFT_STREAM, self.runner.device)
            start = len(token_ids) - output.written
            open_session(DraftSession(session, sampling, generator, grammar, start, rules))

    def _grammar(self, token_ids: list[int], output: SessionOutput) -> SessionGrammar | None:
        """Without structured output here the session drafts freely (the target still masks what it emits)."""
        if output.constraint is None or self.constraints is None:
            return None
        return self.constraints.open(token_ids, output.constraint, output.written)

    def rollback(self, session_id: str, length: int, append: list[int]) -> int:
        state = self.sessions.get(session_id)
        with state.session.lock:
            require(
                length + len(append) < self.runner.max_context,  # as Propose: room for at least one token
                f"session {session_id!r} would exceed the context ({self.runner.max_context})",
            )
            self._rollback(state, length, append)
            return len(state.session.tokens)

    def propose(
        self,
        session_id: str,
        num_tokens: int,
        rollback_to: int | None,
        append: list[int],
        watch: Stopwatch,
        min_confidence: float = 0.0,
        cohort: int = 0,
        min_path_confidence: float = 0.0,
    ) -> Proposal:
        """Up to num_tokens tokens; fewer when a token's draft probability falls below min_confidence, or the
        product of the proposal's falls below min_path_confidence. `cohort`: the Propose calls sent with this
        one (BatchScheduler.submit)."""
        check_speculative_tokens(num_tokens, "num_tokens")  # one round's γ: the range every fixed γ keeps
        require(0.0 <= min_confidence <= 1.0, f"min_confidence must be in [0, 1], got {min_confidence}")
        require(0.0 <= min_path_confidence <= 1.0, f"min_path_confidence must be in [0, 1], got {min_path_confidence}")
        state = self.sessions.get(session_id)
        session = state.session
        with session.lock:
            length = len(session.tokens) if rollback_to is None else rollback_to
            require(
                length + len(append) + num_tokens <= self.runner.max_context,
                f"session {session_id!r} would exceed the context ({self.runner.max_context})",
            )
            self._rollback(state, length, append)
            job = _Job(state, num_tokens, min_confidence, self.runner.logit_columns, min_path_confidence)
            proposal = self.scheduler.submit(job, cohort)
            watch.add("forward", proposal.forward_ns)
            watch.add("prefill", proposal.prefill_ns)
            return proposal

    def close(self, session_id: str) -> None:
        self.sessions.remove(session_id)

    def stop(self) -> None:
        self.scheduler.stop()

    def _rollback(self, state: DraftSession, length: int, append: list[int]) -> None:
        self.runner.check_token_ids(append, "append_token_ids")
        state.session.truncate(length)
        state.session.tokens.extend(append)
        self._follow(state, length, append)

    @staticmethod
    def _follow(state: DraftSession, length: int, append: list[int]) -> None:
        """The grammar follows the session back to `length` tokens and on through `append` (the target's tokens), at
        every call: so it also drops what a failed drafting batch took. One it cannot follow (truncated into the
        prompt, or an appended token it refuses) is given up: the session drafts freely from then on, which moves
        acceptance only."""
        grammar = state.grammar
        if grammar is None:
            return
        output = length - state.output_start
        if output >= 0:
            grammar.rollback_to(output)
            if grammar.commit(append):
                return
        log.warning("session %r: its grammar cannot follow the output; drafting freely", state.session.session_id)
        state.grammar = None

    @on_compute_thread
    def _draft_batch(self, jobs: Sequence[_Job]) -> list[Proposal]:
        """Runs on the scheduler thread. A failed batch changes nothing (the scheduler reruns its rows alone)."""
        sessions = [job.state.session for job in jobs]
        shared = [job.state.session for job in jobs if not self._isolated(job.state.sampling)]
        settle_riders(shared, self.prefix_cache)  # before the checkpoints: a rerun keeps the attached prefix
        starts = [session.checkpoint() for session in sessions]
        draws = [job.state.generator.get_state() for job in jobs]  # a seeded rerun must draw the same
        try:
            proposals = self._draft_steps(jobs)
        except BaseException:
            for job, start, drawn in zip(jobs, starts, draws, strict=True):
                job.state.session.restore(start)  # drop this batch's drafted tokens and their cache entries
                job.state.generator.set_state(drawn)  # (its grammar follows the restored tokens at the next call)
                job.reset()
            raise
        store_riders(sessions, self.prefix_cache)
        return proposals

    def _draft_steps(self, jobs: Sequence[_Job]) -> list[Proposal]:
        """One step at a time for every session still drafting: one batched forward, plus one of its own for each
        isolated row (`_isolated`)."""
        active = list(jobs)
        riding = any(job.state.session.riding_prefix is not None for job in jobs)  # their prompts: the first step
        while active:
            alone = [[job] for job in active if self._isolated(job.state.sampling)]
            together = [job for job in active if not self._isolated(job.state.sampling)]
            step_ns = sum(self._forward(group) for group in [*alone, *([together] if together else [])])
            for job in active:
                job.forward_ns += step_ns  # every row waited for the whole step, its forwards one after another
                job.prefill_ns += step_ns if riding else 0  # ... and for the prompts riding in it
            active = [job for job in active if not job.done]
            riding = False
        return [job.proposal() for job in jobs]

    def _forward(self, jobs: list[_Job]) -> int:
        """One batched forward of `jobs`' sessions and each one's next token; returns the forward's ns."""
        sessions = [job.state.session for job in jobs]
        start = now_ns()
        logits = forward_rows(
            self.runner, [s.cache for s in sessions], [s.pending() for s in sessions], [1] * len(jobs)
        )  # logits[b]: [1, C]
        wait_for(self.runner.device)  # on CUDA: the forward's own time, which the cost model learns from
        forward_ns = now_ns() - start
        for job, row in zip(jobs, logits, strict=True):
            job.step(row[None], self._pick)  # [1, 1, C]
        return forward_ns

    def _isolated(self, sampling: SamplingConfig) -> bool:
        """A seeded sampling session of an int8 draft: its layers quantise a call's activations on one scale, so its
        q, and the tokens drawn from it, hung on the rows batched with it and on the calls that computed a cached
        prompt prefix (a seeded `sd` request's output changed under load; float32 and bf16 rows come out the same in
        any batch). It drafts in forwards of its own and takes no cached prefix, at the cost of those forwards."""
        return self.runner.dtype_name == INT8 and sampling.seed is not None and not sampling.greedy

    def _pick(
        self, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator
    ) -> tuple[torch.Tensor, Dist]:
        """One column of [1, 1, C] logits: argmax when greedy, else a sample from the warped q over the
        columns, truncated to its proposal_top_k most likely entries (the q that is sent)."""
        if sampling.greedy:
            return argmax_last(logits[0, -1]), logits[0, -1:]
        q = warp_probs(
            logits,
            torch.tensor([sampling.temperature], device=logits.device),
            torch.tensor([sampling.top_k], device=logits.device),
            torch.tensor([sampling.top_p], device=logits.device),
        )[0]  # [1, C]
        try:
            return self._draw(q, generator)
        except RuntimeError as exc:  # torch.multinomial refused q: INTERNAL, a bug's code (found by review)
            if bool(torch.isfinite(q).all()):  # checked only after a failure: no cost per step
                raise
            raise FailedPrecondition(NON_FINITE_DRAFT) from exc  # the model's fault: the request goes target-only

    def _draw(self, q: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, Dist]:
        """A token from q ([1, C]), or from its proposal_top_k most likely entries (the q that is sent)."""
        if not self.proposal_top_k:
            return torch.multinomial(q, 1, generator=generator)[0, 0], q
        ids, probs = truncate(q[0], self.proposal_top_k)  # [n], [n]
        return ids[torch.multinomial(probs, 1, generator=generator)[0]], (ids, probs)
