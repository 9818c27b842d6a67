"""Structured output: each constrained session's grammar, and the masks it puts on its logits (no gRPC here).

llguidance (the engine behind vLLM's `guidance` structured-output backend) compiles a request's JSON schema, regex,
choice or Lark grammar against the target's tokenizer and says, state by state, which tokens may come next. A token
the grammar refuses gets the logit -inf before verification, so it has no probability: greedy rows take the best
allowed token, sampling rows sample among allowed ones, and a drafted token the grammar refuses is rejected (never
rescued: its gate fails, and the verifier records no correction event for it).

A round verifies drafts x̃_0..x̃_{n-1} from one forward whose position i predicts x̃_i (position n: the bonus). Position
i's mask is the grammar's state after the committed output and x̃_0..x̃_{i-1}: the matcher walks the draft's allowed
prefix, a mask at each step, and rolls back (nothing is committed before the round is verified). Positions after the
first refused draft stay unmasked: that draft has no probability, so the round ends there at the latest. Once the
grammar is complete (or stopped) it allows the end-of-sequence token only, as vLLM's.

The draft follows the same grammar where it can (draft_service/proposer.py): each drafted token is picked from logits
masked by the grammar's state, so the draft proposes what the target may accept. That moves acceptance only: the
target's masks alone decide what is emitted.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

import llguidance
import llguidance.hf
import llguidance.torch
import torch
from llguidance.gbnf_to_lark import is_lark_syntax

from calispec_core.errors import InvalidArgument, require
from calispec_core.generation import ConstraintKind, OutputConstraint, check_constraint

BITS = 32  # tokens per word of llguidance's bitmask (int32)
MAX_GBNF_CHARS = 8192  # converted to Lark in ~0.1 s (1,000 rules, 27 KB: 0.9 s; 8,000 rules, 237 KB: 65 s)


def grammar_text(constraint: OutputConstraint) -> str:
    """llguidance's grammar for `constraint`; InvalidArgument when its text is not of its kind (no JSON, ...)."""
    # JSON allows whitespace between tokens, as vLLM's default (`disable_any_whitespace` off: a small model may fill a
    # reply with it); without it, compact JSON
    options = {"whitespace_flexible": not constraint.disable_any_whitespace}
    try:
        if constraint.kind == ConstraintKind.JSON:
            return llguidance.LLMatcher.grammar_from_json_schema(constraint.spec, defaults=options)  # type: ignore[arg-type]
        if constraint.kind == ConstraintKind.JSON_OBJECT:
            return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=options)  # type: ignore[arg-type]
        if constraint.kind == ConstraintKind.REGEX:
            return llguidance.grammar_from("regex", constraint.spec)
        if constraint.kind == ConstraintKind.CHOICE:
            return llguidance.grammar_from("choice", list(constraint.choices))  # type: ignore[arg-type]
        check_gbnf_size(constraint.spec)
        return llguidance.grammar_from("grammar", constraint.spec)  # Lark, or GBNF converted (as vLLM's)
    except ValueError as exc:
        raise InvalidArgument(f"the structured output's {_name(constraint)} is not valid: {exc}") from None


def check_gbnf_size(grammar: str) -> None:
    """llguidance converts a GBNF grammar to Lark in Python, in time quadratic in its size, holding the GIL (a
    237 KB grammar: 65 s, every session's rounds slowed): GBNF is taken up to MAX_GBNF_CHARS, Lark at any size."""
    if len(grammar) > MAX_GBNF_CHARS and not is_lark_syntax(grammar):
        raise InvalidArgument(
            f"a GBNF grammar may hold {MAX_GBNF_CHARS} characters, got {len(grammar)}: send a larger one as Lark "
            "(its converter is slow past that)"
        )


def _name(constraint: OutputConstraint) -> str:
    return constraint.kind.name.lower()


class Tokenized(Protocol):
    """What a compiler needs of a model runner."""

    tokenizer: Any  # a fast Hugging Face tokenizer
    vocab_size: int


class ConstraintCompiler:
    """Compiles constraints against a model's tokenizer. Its llguidance view of the tokenizer costs ~2 s and ~160 MB
    for a 150k vocabulary: built once, when first needed (the model services build it before they serve)."""

    def __init__(self, runner: Tokenized) -> None:
        self.runner = runner  # its tokenizer is read when first needed
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        """The logits' width: tokens past the tokenizer's are never allowed."""
        return self.runner.vocab_size

    def tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                hf_tokenizer = self.runner.tokenizer  # a tokenizer larger than the logits (a misfit pair) still loads
                n_vocab = max(self.vocab_size, len(hf_tokenizer))
                self._tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=n_vocab)
            return self._tokenizer

    def open(self, token_ids: Sequence[int], constraint: OutputConstraint, written: int) -> SessionGrammar:
        """A session's grammar, past the last `written` of `token_ids` (output already written under it: a session
        reopened mid-request replays it; `SessionOutput.check` bounds it); InvalidArgument when it does not compile or
        the output does not follow."""
        check_constraint(constraint)
        output = token_ids[len(token_ids) - written :]
        require(all(0 <= t < self.vocab_size for t in output), f"token ids must be in [0, {self.vocab_size})")
        grammar = self.compile(constraint)
        grammar.replay(output)
        return grammar

    def compile(self, constraint: OutputConstraint) -> SessionGrammar:
        """A fresh grammar state for one session; InvalidArgument naming the error when it does not compile."""
        grammar = grammar_text(constraint)
        tokenizer = self.tokenizer()
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)  # compiles; errors are read, not printed
        if matcher.is_error():
            raise InvalidArgument(
                f"the structured output's {_name(constraint)} does not compile: {matcher.get_error()}"
            )
        return SessionGrammar(matcher, tokenizer.vocab_size, self.vocab_size)


class SessionGrammar:
    """One session's grammar state: the output it has committed. Used under the session's lock only."""

    def __init__(self, matcher: llguidance.LLMatcher, tokens: int, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size  # the logits' width
        self.words = (tokens + BITS - 1) // BITS  # the bitmask's, over the grammar's tokenizer (at least as wide)
        self.consumed = 0  # output tokens the grammar has taken (none after it stopped: those it never sees)
        self.broken = False  # it refused a committed token: it no longer describes the output

    def replay(self, tokens: Sequence[int]) -> None:
        """Output written before this session opened (a session reopened mid-request): it must follow the grammar."""
        if not self.commit(tokens):
            raise InvalidArgument(
                f"the output already written does not follow the structured output: token {self.consumed} "
                f"(id {tokens[self.consumed]}) is not allowed there"
            )

    def masks(self, draft: Sequence[int]) -> torch.Tensor:
        """[len(draft) + 1, words] int32 bitmask (bit t of a row: token t allowed): row i for the position that
        predicts draft[i] (row len(draft): the bonus). Rows after the first refused draft allow everything."""
        bitmask = torch.full((len(draft) + 1, self.words), -1, dtype=torch.int32)  # [n+1, W] all allowed
        if self.matcher.is_stopped():  # complete: the end-of-sequence token only, at every position
            llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask, 0)
            bitmask[1:] = bitmask[0]
            return bitmask
        allowed = self.matcher.validate_tokens(list(draft)) if draft else 0
        walked = 0  # tokens the matcher took: none once it stopped (an end-of-sequence draft after a complete grammar
        try:  # counts as allowed, yet a stopped matcher records nothing, so rolling back `allowed` undid a commit)
            for i in range(allowed + 1):
                llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask, i)
                if i < allowed and not self.matcher.is_stopped():
                    self.matcher.consume_token(draft[i])
                    walked += 1
        finally:  # the round commits nothing yet, and a failed one is rerun: back where it was, always
            if walked:
                self.matcher.rollback(walked)
        return bitmask

    def commit(self, tokens: Sequence[int]) -> bool:
        """The tokens a round emitted (each allowed by its mask); False if the grammar refused one: it is `broken`
        then (in its error state for good, allowing the end-of-sequence token only). After the end-of-sequence token
        the grammar is stopped and allows only that token again (a request that ignores EOS): nothing more is taken."""
        for token in tokens:
            if self.matcher.is_stopped():
                return True
            if not self.matcher.consume_token(token):
                self.broken = True
                return False
            self.consumed += 1
        return True

    @property
    def stopped(self) -> bool:
        """Complete (or in its error state): only the end-of-sequence token may follow."""
        return self.matcher.is_stopped()

    def allowed(self, device: torch.device) -> torch.Tensor:
        """[V] bool on `device`: the tokens the grammar allows next (the bitmask crosses to it, not the V bools)."""
        bitmask = torch.empty((1, self.words), dtype=torch.int32)
        llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask, 0)
        return unpack(bitmask.to(device), self.vocab_size)[0]

    def rollback_to(self, consumed: int) -> None:
        """Back to the state after the output's first `consumed` tokens (a draft session truncated)."""
        if self.consumed > consumed:
            self.matcher.rollback(self.consumed - consumed)
            self.consumed = consumed


def unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[k, W] int32 bitmask -> [k, vocab] bool (bit t % 32 of word t // 32: token t allowed)."""
    shifts = torch.arange(BITS, dtype=torch.int32, device=bitmask.device)  # [32]
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).view(bitmask.shape[0], -1)[:, :vocab].bool()


@torch.inference_mode()  # a lone row's logits are the forward's own (inference) tensor
def apply_masks(logits: torch.Tensor, masks: Sequence[tuple[int, torch.Tensor]]) -> None:
    """Refused tokens' logits to -inf, in place. logits: [B, G+1, V]; masks: (row b, bitmask [k, W]) for the
    constrained rows, mask i for position i (k <= G + 1)."""
    for b, bitmask in masks:
        allowed = unpack(bitmask.to(logits.device), logits.shape[-1])  # [k, V], unpacked where the logits are
        logits[b, : bitmask.shape[0]].masked_fill_(~allowed, float("-inf"))
