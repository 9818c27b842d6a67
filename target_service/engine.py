"""Target sessions and their verification rounds (no gRPC here).

A round = one target forward over [pending tokens, draft tokens] for every session in the
batch (`batch_forward`), then the pure verifier (`verifier.verify`) decides what each session
keeps, then each outcome is committed: accepted drafts stay in the KV cache, the rest is
cropped, and the emitted token becomes the session's next pending input. Concurrent `verify`
calls are batched by `BatchScheduler`; a lone call is a batch of one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from calispec_core.batch_forward import forward_rows
from calispec_core.batch_scheduler import DEFAULT_GATHER_S, BatchScheduler
from calispec_core.compute import on_compute_thread
from calispec_core.constraints import ConstraintCompiler, SessionGrammar, apply_masks
from calispec_core.errors import CalispecError, FailedPrecondition, InvalidArgument, InvalidField, require
from calispec_core.generation import FREE_OUTPUT, Mode, SessionOutput, TokenLogprob
from calispec_core.limits import (
    DEFAULT_RIDE_PREFILL_TOKENS,
    MAX_SPECULATIVE_TOKENS,
    check_csd_thresholds,
    check_logprobs,
)
from calispec_core.logit_rules import SessionRules
from calispec_core.modeling import ModelRunner, Session, prefill_session, settle_riders, store_riders, wait_for
from calispec_core.prefix_cache import PrefixCache
from calispec_core.sampling import TARGET_STREAM, SamplingConfig, make_generator
from calispec_core.sessions import DEFAULT_IDLE_TTL_S, SessionRegistry
from calispec_core.sparse_q import SparseQ
from calispec_core.timing import Stopwatch
from target_service.logprobs import PromptLogprobs, emitted_logprobs
from target_service.meaning_guard import meaning_keys
from target_service.pair_table import PairTable
from target_service.verifier import PLACEHOLDER_TOKEN_ID, VerifyInput, VerifyOutput, verify

log = logging.getLogger(__name__)

DEFAULT_TAU = 0.01
DEFAULT_LAMBDA = 6
DRAFT_PROBS_TOLERANCE = 1e-3  # |sum(q) - 1| allowed per row: float32 softmax over 150k tokens is far closer
NON_FINITE_LOGITS = (
    "the target model produced non-finite logits (NaN/inf) at this step: its weights are damaged or its dtype overflows"
)

# Sees every verified round (its inputs, with the raw logits, and the verifier's decision); offline tools use it.
# The inputs' logits are valid during the call only (a buffer the next round writes again).
RoundObserver = Callable[[VerifyInput, VerifyOutput], None]


@dataclass(frozen=True)
class RescueConfig:
    """Per-session CSD parameters (the paper's τ and λ)."""

    mode: Mode = Mode.CSD
    tau: float = DEFAULT_TAU
    lambda_: int = DEFAULT_LAMBDA

    def validate(self) -> RescueConfig:
        check_csd_thresholds(self.tau, self.lambda_)
        return self


@dataclass
class TargetSession:
    session: Session
    sampling: SamplingConfig
    rescue: RescueConfig
    generator: torch.Generator
    grammar: SessionGrammar | None = None  # structured output: the grammar every emitted token follows
    rules: SessionRules | None = None  # the request's logit rules (penalties, bias, ...)
    output_start: int = 0  # where the output begins in session.tokens

    @property
    def output(self) -> list[int]:
        return self.session.tokens[self.output_start :]


@dataclass(frozen=True)
class VerifyResult:
    accepted_count: int
    rescued_positions: list[int]
    next_token: int
    next_is_bonus: bool
    rejections: int
    batch_size: int
    batch_tokens: int  # new tokens over every row of the forward (the count its cost follows)
    withheld_rescues: int = 0  # 0 or 1: the round ended where the meaning guard refused a rescue
    logprobs: list[TokenLogprob] | None = None  # one per emitted token (kept drafts, then next_token), when asked


@dataclass
class _Row:
    """One session's part of a batched round."""

    state: TargetSession
    draft: list[int]
    draft_probs: torch.Tensor | SparseQ | None  # [k, V_draft] or sparse rows, when the session samples
    watch: Stopwatch
    logprobs: int | None = None  # None: no log-probabilities; k: the emitted tokens' and the k most likely


@dataclass(frozen=True)
class _RawLogits:
    """A round's logits before logit rules, of the rows (indices into the batch) that report log-probabilities."""

    rows: list[int]
    logits: torch.Tensor | None  # [len(rows), G+1, V]; None: no such row


def check_draft_count(count: int) -> None:
    """At most MAX_SPECULATIVE_TOKENS drafted tokens a Verify. The servicer checks the repeated field's length (O(1))
    before converting it: a 64 MiB field became tens of millions of Python ints only to be refused."""
    require(count <= MAX_SPECULATIVE_TOKENS, f"at most {MAX_SPECULATIVE_TOKENS} draft tokens, got {count}")


class TargetEngine:
    def __init__(
        self,
        runner: ModelRunner,
        max_sessions: int,
        table: PairTable,
        max_batch: int = 8,
        idle_ttl_s: float = DEFAULT_IDLE_TTL_S,
        observer: RoundObserver | None = None,
        gather_s: float = DEFAULT_GATHER_S,
        prefix_cache: PrefixCache | None = None,  # prompt KV reused by later prompts (None: off)
        meaning_guard: bool = True,  # rescue only pairs of equal numerals, operators, role (meaning_guard.py)
        ride_prefill_tokens: int = DEFAULT_RIDE_PREFILL_TOKENS,  # prompts up to this long prefill in their first round
        structured_output: bool = True,  # False: constrained sessions are refused FAILED_PRECONDITION
    ) -> None:
        self.runner = runner
        self.meaning_keys = (  # [V] int64 on the logits' device
            meaning_keys(runner.tokenizer, runner.vocab_size).to(runner.device) if meaning_guard else None
        )
        self.constraints = ConstraintCompiler(runner) if structured_output else None
        self.prefix_cache = prefix_cache
        self.ride_prefill_tokens = ride_prefill_tokens
        self.table = table  # MemoryLink (if any) ships its local events and refreshes it in the background
        self.observer = observer
        # A session whose lock is held is mid-round: never reaped, however long the round takes.
        self.sessions: SessionRegistry[TargetSession] = SessionRegistry(
            max_sessions, idle_ttl_s, is_busy=lambda state: state.session.lock.locked()
        )
        self.scheduler: BatchScheduler[_Row, VerifyResult] = BatchScheduler(self._round, max_batch, gather_s=gather_s)
        self._padded_buffer: torch.Tensor | None = None  # [N] float32: rounds' padded logits (compute thread only)
        self._non_finite_logged = False  # a damaged model fails every round: its ERROR is logged once

    def prefill(
        self,
        session_id: str,
        token_ids: list[int],
        sampling: SamplingConfig,
        rescue: RescueConfig,
        watch: Stopwatch,
        prompt_logprobs: int | None = None,
        output: SessionOutput = FREE_OUTPUT,
    ) -> list[TokenLogprob] | None:
        """Open the session. `prompt_logprobs`: None, or k to return each prompt token's log-probability from the
        second on (under the tokens before it) and the k most likely tokens at its position. A short prompt without
        `prompt_logprobs` computes nothing yet: it rides in the session's first round (`prefill_session`).
        `output`: the grammar and logit rules every token the session emits follows, and how many of `token_ids`'
        last tokens are output already written (a reopened session replays them)."""
        sampling.validate(self.runner.vocab_size)
        rescue.validate()
        check_logprobs(prompt_logprobs, "prompt_logprobs")
        output.check(token_ids)
        grammar = self._grammar(token_ids, output)
        rules = SessionRules.of(output.rules, output.prompt(token_ids), self.runner.vocab_size, self.runner.device)
        report = PromptLogprobs(token_ids, prompt_logprobs) if prompt_logprobs is not None else None
        with self.sessions.opening(session_id) as open_session:
            with watch.phase("forward"):
                session = prefill_session(
                    self.runner, session_id, token_ids, self.prefix_cache, report, self.ride_prefill_tokens
                )
            generator = make_generator(sampling.seed, TARGET_STREAM, self.runner.device)
            start = len(token_ids) - output.written
            open_session(TargetSession(session, sampling, rescue, generator, grammar, rules, start))
        return report.entries if report is not None else None

    def _grammar(self, token_ids: list[int], output: SessionOutput) -> SessionGrammar | None:
        """The session's grammar state, past the output already written; checked before any session opens."""
        if output.constraint is None:
            return None
        if self.constraints is None:
            raise FailedPrecondition("this target serves no structured output (it runs with --no-structured-output)")
        return self.constraints.open(token_ids, output.constraint, output.written)

    def close(self, session_id: str) -> None:
        self.sessions.remove(session_id)

    def stop(self) -> None:
        self.scheduler.stop()

    def verify(
        self,
        session_id: str,
        draft: list[int],
        draft_probs: torch.Tensor | SparseQ | None,
        watch: Stopwatch,
        cohort: int = 0,
        logprobs: int | None = None,
    ) -> VerifyResult:
        """Verify `draft` (may be empty: one plain decoding step) and commit the outcome. `cohort`: the
        Verify calls sent with this one (BatchScheduler.submit). `logprobs`: None, or k to report each emitted
        token's log-probability and the k most likely tokens at its position."""
        check_logprobs(logprobs)
        state = self.sessions.get(session_id)
        with state.session.lock:  # one round at a time per session
            if state.grammar is not None and state.grammar.broken:  # its last round emitted a token it refused
                raise CalispecError(f"session {session_id!r}: its structured output no longer holds (a bug)")
            self._check_draft(state, draft, draft_probs)
            return self.scheduler.submit(_Row(state, draft, draft_probs, watch, logprobs), cohort)

    @on_compute_thread
    def _round(self, rows: Sequence[_Row]) -> list[VerifyResult]:
        """Runs on the compute thread: one forward and one verify for every row, then the commits.

        All or nothing: no session changes (cache, tokens, generator) until every row is verified,
        so when the round raises the scheduler can rerun its rows one by one and only a faulty
        row fails its own request.
        """
        watch = Stopwatch()
        sessions = [r.state.session for r in rows]
        settle_riders(sessions, self.prefix_cache)  # before the checkpoints: a rerun keeps the attached prefix
        checkpoints = [s.checkpoint() for s in sessions]
        generator_states = [r.state.generator.get_state() for r in rows]
        try:
            with watch.phase("verify"):  # CPU work of the grammar engine, before the forward (a GPU's runs async)
                masks = [(b, r.state.grammar.masks(r.draft)) for b, r in enumerate(rows) if r.state.grammar is not None]
            with watch.phase("forward"):
                inputs = [s.pending() + r.draft for s, r in zip(sessions, rows, strict=True)]
                logits = forward_rows(
                    self.runner, [s.cache for s in sessions], inputs, [len(r.draft) + 1 for r in rows]
                )
                wait_for(self.runner.device)  # on CUDA: the forward's own time, not the verify's
            with watch.phase("verify"):
                batch = self._verify_input(rows, logits)
                apply_masks(batch.target_logits, masks)
                raw = self._raw_logits(rows, batch.target_logits)
                empty = self._apply_rules(rows, batch.target_logits)
                out = verify(batch, self.table.counts, self.meaning_keys)
                outcome = torch.stack(
                    [
                        out.accepted_count,
                        out.next_token,
                        out.next_is_bonus.long(),
                        out.event_mask.sum(dim=-1),
                        out.withheld.sum(dim=-1),
                        self._reached(empty, out.accepted_count),
                        out.finite.long(),
                    ]
                ).tolist()  # the one device sync of the round, after the math
                self._check_finite(rows, outcome.pop())
                self._check_reached(rows, outcome.pop())
                rescued = out.rescued.tolist()  # [B][G]
                self._check_emitted(rows, outcome[1])
                logprobs = self._logprobs(rows, batch.target_logits, raw, outcome[0], outcome[1])
            with watch.phase("memory"):
                self._record_events(*out.events(batch.draft_tokens))
        except BaseException:
            self._undo(rows, checkpoints, generator_states)
            raise
        store_riders(sessions, self.prefix_cache)
        if self.observer is not None:  # a round that made it: observed once, never rerun
            try:
                self.observer(batch, out)
            except Exception:  # an analysis' bug must not leave the round uncommitted (or rerun it)
                log.exception("the round observer failed; the round is committed")
        results, batch_tokens = [], sum(map(len, inputs))
        for b, (row, accepted, next_token, bonus, rejections, withheld) in enumerate(zip(rows, *outcome, strict=True)):
            self._commit(row.state, row.draft, accepted, next_token)
            positions = [i for i, hit in enumerate(rescued[b]) if hit]
            results.append(
                VerifyResult(
                    accepted,
                    positions,
                    next_token,
                    bool(bonus),
                    rejections,
                    len(rows),
                    batch_tokens,
                    withheld,
                    logprobs[b],
                )
            )
        for row in rows:  # every row waited for the whole batched forward: each reports it
            for phase in ("forward", "verify", "memory"):
                row.watch.add(phase, watch.get(phase))
        return results

    @staticmethod
    def _apply_rules(rows: Sequence[_Row], logits: torch.Tensor) -> torch.Tensor | None:
        """Each row's logit rules on its [G+1, V] logits (after its grammar's mask), position i under the output
        and the row's first i drafts. Returns [B, G+1] bool: positions the rules left without a token (None: none
        can be), which fail their request only if the round reaches them (`_check_reached`)."""
        empty: torch.Tensor | None = None
        for b, row in enumerate(rows):
            state = row.state
            if state.rules is not None:
                width = len(row.draft) + 1
                row_empty = state.rules.apply(logits[b, :width], state.output, row.draft, state.sampling.temperature)
                if row_empty is not None:
                    if empty is None:
                        empty = torch.zeros(logits.shape[:2], dtype=torch.bool, device=logits.device)
                    empty[b, :width] = row_empty
        return empty

    @staticmethod
    def _reached(empty: torch.Tensor | None, accepted: torch.Tensor) -> torch.Tensor:
        """[B] int64: 1 where the round reached a position without a token (a kept draft's or the emitted one's)."""
        if empty is None:
            return torch.zeros_like(accepted)
        positions = torch.arange(empty.shape[1], device=empty.device).view(1, -1)  # [1, G+1]
        return (empty & (positions <= accepted.view(-1, 1))).any(dim=-1).long()

    @staticmethod
    def _check_reached(rows: Sequence[_Row], reached: list[int]) -> None:
        """A row that reached a position without a token fails the round, which then reruns its rows one by one: so
        only that row's request fails (its allowed ids or bad words, with its grammar, leave nothing to write)."""
        row = next((row for row, hit in zip(rows, reached, strict=True) if hit), None)
        if row is None:
            return
        rules = row.state.rules.rules if row.state.rules is not None else None
        field = "allowed_token_ids" if rules is None or rules.allowed_token_ids else "bad_words"
        grammar = " with the structured output" if row.state.grammar is not None else ""
        raise InvalidField(field, f"leave no token to write{grammar} at some position")

    @staticmethod
    def _raw_logits(rows: Sequence[_Row], logits: torch.Tensor) -> _RawLogits:
        """The logits before their logit rules of the rows that ask for log-probabilities under rules: those are
        reported from the raw logits (a structured output's mask applied), as vLLM's `raw_logprobs`. One copy (a row
        at γ = 6 and 151,936 tokens: 4 MB)."""
        ruled = [b for b, row in enumerate(rows) if row.logprobs is not None and row.state.rules is not None]
        if not ruled:
            return _RawLogits([], None)
        return _RawLogits(ruled, torch.stack([logits[b] for b in ruled]))  # [R, G+1, V]; no index tensor: no sync

    @staticmethod
    def _logprobs(
        rows: Sequence[_Row],
        logits: torch.Tensor,
        raw: _RawLogits,
        accepted: list[int],
        next_tokens: list[int],
    ) -> list[list[TokenLogprob] | None]:
        """Per row that asks: its emitted tokens' log-probabilities, from the round's [B, G+1, V] logits, or from its
        logits before its rules in `raw` (position i emitted the i-th token: the kept drafts, then the next token);
        None for the others."""

        def report(source: torch.Tensor, places: Sequence[int], asking: list[int]) -> None:
            """Rows `asking`, whose logits are `source`[places]."""
            emitted = [[*rows[b].draft[: accepted[b]], next_tokens[b]] for b in asking]
            tops = [rows[b].logprobs or 0 for b in asking]
            reports.update(zip(asking, emitted_logprobs(source, places, emitted, tops), strict=True))

        reports: dict[int, list[TokenLogprob]] = {}
        if without_rules := [b for b, row in enumerate(rows) if row.logprobs is not None and b not in raw.rows]:
            report(logits, without_rules, without_rules)
        if raw.logits is not None:
            report(raw.logits, range(len(raw.rows)), raw.rows)
        return [reports.get(b) for b in range(len(rows))]

    def _check_finite(self, rows: Sequence[_Row], finite: list[int]) -> None:
        """Never commit tokens drawn from NaN / inf logits (greedy would emit token 0, sampling an id past the
        vocabulary): the model, not the request nor our code, is at fault, so FAILED_PRECONDITION, not INTERNAL."""
        broken = [row.state.session.session_id for row, ok in zip(rows, finite, strict=True) if not ok]
        if not broken:
            return
        if not self._non_finite_logged:  # a batch that fails reruns row by row: once, not once a row or a round
            self._non_finite_logged = True
            log.error("%s (sessions %s; logged once)", NON_FINITE_LOGITS, broken)
        raise FailedPrecondition(f"session {broken[0]!r}: {NON_FINITE_LOGITS}")

    def _check_emitted(self, rows: Sequence[_Row], next_tokens: list[int]) -> None:
        """Never commit a token outside the vocabulary (it would break every later batched forward)."""
        for row, token in zip(rows, next_tokens, strict=True):
            if not 0 <= token < self.runner.vocab_size:
                raise CalispecError(
                    f"session {row.state.session.session_id!r}: verification emitted token {token} "
                    f"outside the vocabulary (size {self.runner.vocab_size})"
                )

    @staticmethod
    def _undo(rows: Sequence[_Row], checkpoints: list[tuple[int, int]], generator_states: list[torch.Tensor]) -> None:
        """Back to the state before a failed round: the forward extends caches in place, possibly only
        some layers of them (when it raised part of the way through)."""
        for row, checkpoint, state in zip(rows, checkpoints, generator_states, strict=True):
            row.state.generator.set_state(state)
            row.state.session.restore(checkpoint)

    def _check_draft(self, state: TargetSession, draft: list[int], draft_probs: torch.Tensor | SparseQ | None) -> None:
        check_draft_count(len(draft))
        self.runner.check_token_ids(draft, "draft_token_ids")
        room = self.runner.max_context - len(state.session.tokens)
        require(len(draft) < room, f"{len(draft)} draft tokens do not fit the remaining context ({room})")
        if draft_probs is None:
            if draft and not state.sampling.greedy:
                raise InvalidArgument("draft_probs are required when the session samples (temperature > 0)")
            return
        # A q sent is checked whatever the temperature (a greedy round ignores it): malformed input is refused alike.
        if isinstance(draft_probs, SparseQ):
            draft_probs.validate(len(draft), self.runner.vocab_size, draft)
        else:
            self._check_draft_probs(draft_probs, draft)

    def _check_draft_probs(self, probs: torch.Tensor, draft: list[int]) -> None:
        """q must be a real distribution per draft token, over exactly the target's vocabulary, giving each drafted
        token q > 0 (the draft sampled it from this q): a faulty q would silently break lossless sampling."""
        vocab, rows = self.runner.vocab_size, len(draft)
        require(
            tuple(probs.shape) == (rows, vocab),
            f"draft_probs must be [{rows}, {vocab}] (one row per draft token over the target's vocabulary), "
            f"got {list(probs.shape)}",
        )
        if not rows:
            return
        drafted = probs.gather(1, torch.tensor(draft, device=probs.device).view(-1, 1)).view(-1)  # [rows] q(x̃)
        # Three reductions, one sync, settle the common case: a NaN or inf anywhere fails the minimum or a row sum
        # (float32 cascade sums: error ~1e-7); the reason is looked up only for the message.
        worst_row = (probs.sum(dim=-1) - 1).abs().max()  # the worst row's error
        lowest, worst, least_drafted = torch.stack([probs.min(), worst_row, drafted.min()]).tolist()
        if lowest >= 0 and worst <= DRAFT_PROBS_TOLERANCE and least_drafted > 0:
            return
        require(bool(torch.isfinite(probs).all()), "draft_probs must be finite")
        require(lowest >= 0, "draft_probs must be >= 0")
        require(worst <= DRAFT_PROBS_TOLERANCE, f"each draft_probs row must sum to 1 (off by {worst:.3g})")
        i = int((drafted <= 0).nonzero()[0])
        raise InvalidArgument(
            f"draft token {i} (id {draft[i]}) has probability 0 in its draft_probs row: "
            "q must be the distribution the draft sampled it from"
        )

    def _verify_input(self, rows: Sequence[_Row], logits: list[torch.Tensor]) -> VerifyInput:
        """Pad the rows to one batch: logits [B, G+1, V], drafts [B, G], q [B, G, V_draft]."""
        device = logits[0].device
        width = max(len(r.draft) for r in rows)
        tokens = torch.full((len(rows), width), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=device)
        for b, row in enumerate(rows):
            tokens[b, : len(row.draft)] = torch.tensor(row.draft, dtype=torch.long, device=device)
        samplings = [r.state.sampling for r in rows]
        rescues = [r.state.rescue for r in rows]
        return VerifyInput(
            target_logits=self._padded_logits(rows, logits, width),  # [B, G+1, V]
            draft_tokens=tokens,  # [B, G]
            num_draft=torch.tensor([len(r.draft) for r in rows], device=device),  # [B]
            draft_probs=self._draft_probs(rows, width, device),  # [B, G, V_draft] or None
            temperature=torch.tensor([s.temperature for s in samplings], dtype=torch.float32, device=device),
            top_k=torch.tensor([s.top_k for s in samplings], dtype=torch.long, device=device),
            top_p=torch.tensor([s.top_p for s in samplings], dtype=torch.float32, device=device),
            mode=torch.tensor([int(r.mode) for r in rescues], dtype=torch.long, device=device),
            log_tau=torch.tensor([math.log(r.tau) for r in rescues], dtype=torch.float32, device=device),
            lambda_=torch.tensor([r.lambda_ for r in rescues], dtype=torch.long, device=device),
            generators=[r.state.generator for r in rows],
            shaped=torch.tensor([r.state.rules is not None for r in rows], device=device),
        )

    def _padded_logits(self, rows: Sequence[_Row], logits: list[torch.Tensor], width: int) -> torch.Tensor:
        """[B, G+1, V] float32 (exact for bf16/fp16 logits; CPU argmax over a bf16 vocabulary is
        several times slower than the conversion plus a float32 one); a lone float32 row is not copied.

        Written into the engine's own buffer, kept from round to round: a fresh tensor of 34 MB (8 rows at
        γ = 6) or more comes from the kernel anew each round, zeroed page by page (on wave 31's VM 210-250 ms
        for 53 MB, docs/performance.md "Pages faulted in every round"). Valid until the next round."""
        if len(rows) == 1:
            return logits[0].float().unsqueeze(0)
        first = logits[0]
        padded = self._logits_buffer((len(rows), width + 1, first.shape[-1]), first.device)  # [B, G+1, V]
        for b, (row, row_logits) in enumerate(zip(rows, logits, strict=True)):
            kept = len(row.draft) + 1
            padded[b, :kept] = row_logits
            padded[b, kept:] = 0  # this row's padding (the verifier masks it; zeros keep it finite)
        return padded

    def _logits_buffer(self, shape: tuple[int, int, int], device: torch.device) -> torch.Tensor:
        """A [B, G+1, V] float32 view of the reused buffer, grown (never shrunk) to the largest round seen."""
        needed = math.prod(shape)
        buffer = self._padded_buffer
        if buffer is None or buffer.numel() < needed or buffer.device != device:
            buffer = self._padded_buffer = torch.empty(needed, dtype=torch.float32, device=device)
        return buffer[:needed].view(shape)

    def _draft_probs(self, rows: Sequence[_Row], width: int, device: torch.device) -> torch.Tensor | None:
        """[B, G, V_draft] q on the device; sparse q is densified there (only its entries travel)."""
        sent = [
            (b, r.draft_probs)
            for b, r in enumerate(rows)
            if r.draft_probs is not None and r.draft and not r.state.sampling.greedy
        ]
        if not sent:
            return None
        vocab = max(self.runner.vocab_size if isinstance(p, SparseQ) else p.shape[1] for _, p in sent)
        probs = torch.zeros(len(rows), width, vocab, dtype=torch.float32, device=device)  # [B, G, V_draft]
        for b, p in sent:
            if isinstance(p, SparseQ):
                p.write_into(probs[b, : len(p.row_sizes)])
            else:
                probs[b, : p.shape[0], : p.shape[1]] = p.to(device=device, dtype=torch.float32)
        return probs

    def _record_events(self, draft_ids: torch.Tensor, target_ids: torch.Tensor) -> None:
        """Count the round's rejection events ([E], [E]) in the local table at once; MemoryLink ships them."""
        if draft_ids.numel():
            self.table.add_local(draft_ids, target_ids)

    @staticmethod
    def _commit(state: TargetSession, draft: list[int], accepted: int, next_token: int) -> None:
        """Keep pending + accepted drafts in the cache; the emitted token is the next pending input."""
        session = state.session
        rejected = len(draft) - accepted
        if rejected:
            session.cache.crop(-rejected)
        session.tokens.extend(draft[:accepted])
        session.tokens.append(next_token)
        if state.grammar is not None and not state.grammar.commit([*draft[:accepted], next_token]):
            log.error("session %r: the grammar refused a token its masks allowed", session.session_id)  # a bug
