"""vLLM's logits processors that change the output: presence, frequency and repetition penalties, logit bias, min_p,
allowed token ids, bad words and min_tokens, as one request's `LogitRules`, applied to its session's logits by
`SessionRules`.

The target applies them to every position of a round (position i under the output so far plus the round's first i
drafts), after a structured output's mask and before temperature, top-k and top-p, so that greedy `sd` under them
equals target-only decoding under them and sampling stays lossless; the draft applies them while drafting (acceptance
only). The order and the formulas are vLLM's (v1 sampler): allowed token ids and bad words, min_tokens, logit bias,
then the repetition penalty (a token of the prompt or the output: its logit divided by the penalty when positive,
multiplied when negative), the frequency penalty (times the token's count in the output) and the presence penalty
(once it is there); min_p last (it keeps tokens whose probability after temperature is at least min_p times the top
one's: z >= max z + T log min_p, so it only matters when sampling).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from calispec.v1 import common_pb2
from calispec_core.errors import require_field
from calispec_core.limits import check_logit_rules, require_unicode
from calispec_core.vocab_pruning import LogitColumns

MAX_LOGIT_BIAS = 100.0  # a bias lies in [-100, 100] (OpenAI's range)
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_ALLOWED_TOKEN_IDS = 1 << 18  # more than any vocabulary served here
MAX_END_TOKEN_IDS = 64  # EOS ids and stop token ids (at most 16)
TOKEN_ID_BOUND = 2**32  # the wire's uint32, for ids checked before the vocabulary is known
MAX_BAD_WORDS = 64
MAX_BAD_WORD_CHARS = 256
MAX_BAD_WORD_TOKENS = 1024  # a tokenized bad word's length (256 characters of 4 bytes: byte-level tokens)


@dataclass(frozen=True)
class LogitRules:
    """One request's logit rules; the defaults are off (`active` is False)."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), by id
    allowed_token_ids: tuple[int, ...] = ()  # empty: every token
    min_tokens: int = 0
    end_token_ids: tuple[int, ...] = ()  # what min_tokens holds back: the ids that would end the output
    bad_words: tuple[str, ...] = ()  # vLLM's: words the output never writes (the coordinator tokenizes them)
    bad_word_ids: tuple[tuple[int, ...], ...] = ()  # token sequences the output never ends with (from bad_words)

    @property
    def active(self) -> bool:
        """Whether the rules change any logit."""
        fixed = bool(self.logit_bias or self.allowed_token_ids or self.bad_words or self.bad_word_ids)
        return self.penalises or fixed or self.min_p != 0 or self.min_tokens != 0

    @property
    def penalises(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @classmethod
    def of(
        cls,
        *,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        min_p: float = 0.0,
        logit_bias: dict[int, float] | None = None,
        allowed_token_ids: Sequence[int] | None = None,
        min_tokens: int = 0,
        bad_words: Sequence[str] | None = None,
    ) -> LogitRules:
        """vLLM's SamplingParams names; `logit_bias` maps token ids to biases."""
        bias = tuple(sorted((int(k), float(v)) for k, v in (logit_bias or {}).items()))
        allowed = tuple(sorted({int(i) for i in allowed_token_ids or ()}))
        words = tuple(bad_words or ())
        return cls(presence_penalty, frequency_penalty, repetition_penalty, min_p, bias, allowed, min_tokens, (), words)

    def validate(self, vocab_size: int | None = None) -> LogitRules:
        """InvalidField (naming vLLM's field) for a value out of range; ids must lie in `vocab_size` when given."""
        check_logit_rules(
            self.presence_penalty, self.frequency_penalty, self.repetition_penalty, self.min_p, self.min_tokens
        )
        count = len(self.logit_bias)
        require_field(
            count <= MAX_LOGIT_BIAS_ENTRIES, "logit_bias", f"at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {count}"
        )
        for token, bias in self.logit_bias:
            reason = f"token {token}'s bias must be in [-100, 100], got {bias}"
            require_field(-MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS, "logit_bias", reason)
        count = len(self.allowed_token_ids)
        reason = f"at most {MAX_ALLOWED_TOKEN_IDS} ids, got {count}"
        require_field(count <= MAX_ALLOWED_TOKEN_IDS, "allowed_token_ids", reason)
        count = len(self.end_token_ids)
        require_field(count <= MAX_END_TOKEN_IDS, "end_token_ids", f"at most {MAX_END_TOKEN_IDS} ids, got {count}")
        self._check_bad_words()
        self._check_ids(vocab_size if vocab_size is not None else TOKEN_ID_BOUND)
        return self

    def _check_ids(self, vocab_size: int) -> None:
        for name, ids in (
            ("logit_bias", [t for t, _ in self.logit_bias]),
            ("allowed_token_ids", self.allowed_token_ids),
            ("bad_word_ids", [t for seq in self.bad_word_ids for t in seq]),
        ):
            outside = [i for i in ids if not 0 <= i < vocab_size]
            reason = f"token ids must be in [0, {vocab_size}), got {outside[:3]}"
            require_field(not outside, name, reason)

    def _check_bad_words(self) -> None:
        count = len(self.bad_words)
        require_field(count <= MAX_BAD_WORDS, "bad_words", f"at most {MAX_BAD_WORDS} words, got {count}")
        for i, word in enumerate(self.bad_words):
            reason = f"must be 1 to {MAX_BAD_WORD_CHARS} characters, word {i} has {len(word)}"
            require_field(0 < len(word) <= MAX_BAD_WORD_CHARS, "bad_words", reason)
            require_field(bool(word.strip()), "bad_words", f"word {i} is only whitespace (it bans nothing)")
            require_unicode(word, f"bad word {i}")
        count = len(self.bad_word_ids)
        require_field(count <= 2 * MAX_BAD_WORDS, "bad_word_ids", f"at most {2 * MAX_BAD_WORDS} sequences, got {count}")
        for ids in self.bad_word_ids:
            reason = f"a sequence holds 1 to {MAX_BAD_WORD_TOKENS} ids, got {len(ids)}"
            require_field(0 < len(ids) <= MAX_BAD_WORD_TOKENS, "bad_word_ids", reason)

    def with_bad_word_ids(self, sequences: Sequence[Sequence[int]]) -> LogitRules:
        """These rules with their bad words' token sequences (the coordinator tokenizes the words)."""
        return replace(self, bad_word_ids=tuple(tuple(ids) for ids in sequences if ids))

    def ending(self, end_token_ids: Sequence[int]) -> LogitRules:
        """These rules with the ids that would end the output: what min_tokens holds back, and where a round's
        positions past a kept one are never reached (`SessionRules.apply`)."""
        return replace(self, end_token_ids=tuple(sorted(set(end_token_ids))))

    @classmethod
    def from_pb(cls, msg: common_pb2.LogitRules) -> LogitRules:
        return cls(
            msg.presence_penalty,
            msg.frequency_penalty,
            msg.repetition_penalty or 1.0,  # 0: unset
            msg.min_p,
            tuple(sorted(msg.logit_bias.items())),
            tuple(msg.allowed_token_ids),
            msg.min_tokens,
            tuple(msg.end_token_ids),
            tuple(msg.bad_words),
            tuple(tuple(seq.ids) for seq in msg.bad_word_ids),
        )

    def to_pb(self) -> common_pb2.LogitRules:
        return common_pb2.LogitRules(
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            min_p=self.min_p,
            logit_bias=dict(self.logit_bias),
            allowed_token_ids=self.allowed_token_ids,
            min_tokens=self.min_tokens,
            end_token_ids=self.end_token_ids,
            bad_words=self.bad_words,
            bad_word_ids=[common_pb2.TokenIds(ids=ids) for ids in self.bad_word_ids],
        )


def tokenize_bad_words(tokenizer: Any, words: Sequence[str]) -> list[list[int]]:
    """vLLM's tokenization of bad words: each as written (leading spaces stripped) and, where that makes other tokens
    of the same count, after a space (a word inside the text, not at its start)."""
    sequences = []
    for word in words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        sequences.append(plain)
        if plain and spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences.append(spaced)
    return [ids for ids in sequences if ids]


def rules_from_wire(msg: common_pb2.LogitRules, present: bool, from_client: bool = False) -> LogitRules | None:
    """The proto message (`present`: the field is set), checked; rules that change nothing are None. A client's
    end_token_ids and bad_word_ids are dropped: the coordinator knows what ends its output and tokenizes the words."""
    if not present:
        return None
    rules = LogitRules.from_pb(msg)
    if from_client:
        rules = replace(rules, end_token_ids=(), bad_word_ids=())
    rules.validate()  # inactive rules too: a min_p of -0.1 is a refusal, not "off"
    return rules if rules.active else None


class SessionRules:
    """A session's rules on its model's device: the fixed part (bias, allowed ids, one-token bad words) as one [V]
    additive row, the prompt's distinct ids (and a [V] mask of them) for the repetition penalty."""

    def __init__(self, rules: LogitRules, prompt: Sequence[int], vocab_size: int, device: torch.device) -> None:
        rules.validate(vocab_size)
        self.rules = rules
        self.device = device
        self.fixed = _fixed_row(rules, vocab_size, device)  # [V] float32 or None
        # bad words of several tokens: (the tokens before the last, the last), refused where the output ends with those
        self.sequences = [(ids[:-1], ids[-1]) for ids in rules.bad_word_ids if len(ids) > 1]
        self.banned_tail = max((len(prefix) for prefix, _ in self.sequences), default=0)
        self.end_ids = torch.tensor(rules.end_token_ids, dtype=torch.long, device=device)  # [E]
        self.end_ids = self.end_ids[self.end_ids < vocab_size]
        self.end_set = frozenset(rules.end_token_ids)
        repeats = rules.repetition_penalty != 1
        # ids outside the vocabulary are left out here: the prompt's own check refuses them (an index, not a 500)
        distinct = sorted({t for t in prompt if 0 <= t < vocab_size}) if repeats else []
        self.prompt_ids = torch.tensor(distinct, dtype=torch.long, device=device)  # [P]
        self.in_prompt = torch.zeros(vocab_size if repeats else 0, dtype=torch.bool, device=device)  # [V]
        self.in_prompt[self.prompt_ids] = True
        self._pruned: LogitColumns | None = None  # the pruned layer the next two were computed for
        self._pruned_fixed: torch.Tensor | None = None  # [C] the fixed row over its columns
        self._pruned_prompt: torch.Tensor | None = None  # [P'] the prompt ids' columns

    @classmethod
    def of(
        cls, rules: LogitRules | None, prompt: Sequence[int], vocab_size: int, device: torch.device
    ) -> SessionRules | None:
        """A session's rules, or None when it has none that change a logit."""
        return cls(rules, prompt, vocab_size, device) if rules is not None and rules.active else None

    @torch.inference_mode()
    def apply(
        self,
        logits: torch.Tensor,  # [S, C] float32, in place; row i: the next token after `output` + drafts[:i]
        output: Sequence[int],  # the output so far (S - 1 == len(drafts))
        drafts: Sequence[int],
        temperature: float,
        columns: LogitColumns | None = None,  # a pruned layer's columns (None: column i is token i)
    ) -> torch.Tensor | None:  # [S] bool: positions left without a token (their logits zeroed); None: none can be
        """Apply the rules in place. Allowed ids and bad words (with a structured output's grammar) can leave a position
        no token: past a rejected draft, or past a kept one that ends the output, that is a state the output never
        takes, so such a position is zeroed (finite, for the verifier) and reported only where the round can reach it:
        the caller fails the request if it does."""
        pruned = columns if columns is not None and columns.kept is not None else None
        if pruned is not None and pruned is not self._pruned:  # once: a session's model never changes its columns
            self._prune(pruned)
        if self.fixed is not None:
            logits += self.fixed if pruned is None else self._pruned_fixed
        if self.sequences:
            self._ban_sequences(logits, output, drafts, pruned)
        self._hold_back_end(logits, len(output), pruned)
        if self.rules.penalises:
            self._penalise(logits, output, drafts, pruned)
        if self.rules.min_p > 0 and temperature > 0:
            top = logits.max(dim=-1, keepdim=True).values  # [S, 1]
            logits.masked_fill_(logits < top + temperature * math.log(self.rules.min_p), float("-inf"))
        if not self.rules.allowed_token_ids and not self.rules.bad_word_ids:
            return None
        empty = ~torch.isfinite(logits).any(dim=-1)  # [S]
        logits.masked_fill_(empty.unsqueeze(-1), 0.0)
        ended = next((i for i, token in enumerate(drafts) if token in self.end_set), None)
        if ended is not None:  # past a draft that ends the output, no position is ever reached (nor written)
            empty[ended + 1 :] = False
        return empty

    def _prune(self, pruned: LogitColumns) -> None:
        self._pruned = pruned
        self._pruned_fixed = self.fixed[pruned.kept] if self.fixed is not None else None
        self._pruned_prompt = _columns_of(self.prompt_ids, pruned)

    def _ban_sequences(
        self, logits: torch.Tensor, output: Sequence[int], drafts: Sequence[int], pruned: LogitColumns | None
    ) -> None:
        """vLLM's bad words of several tokens: at a position whose context ends with a word's first tokens, its last."""
        recent = [*output[max(0, len(output) - self.banned_tail) :], *drafts]  # every position's context ends so
        before = min(len(output), self.banned_tail)  # tokens of `recent` that precede position 0
        rows, banned = [], []
        for i in range(logits.shape[0]):
            context = recent[: before + i]
            for prefix, last in self.sequences:
                if len(context) >= len(prefix) and tuple(context[len(context) - len(prefix) :]) == prefix:
                    rows.append(i)
                    banned.append(last)
        if not rows:
            return
        ids = torch.tensor(banned, dtype=torch.long, device=logits.device)  # [N]
        at = torch.tensor(rows, dtype=torch.long, device=logits.device)  # [N]
        kept, columns = _kept_columns(ids, pruned)  # [N] or None, [N']
        logits[at if kept is None else at[kept], columns] = float("-inf")

    def _hold_back_end(self, logits: torch.Tensor, written: int, pruned: LogitColumns | None) -> None:
        """The end ids' logits to -inf at positions whose token would be among the output's first min_tokens."""
        held = self.rules.min_tokens - written  # positions [0, held) may not end the output
        if held <= 0 or not self.end_ids.numel():
            return
        columns = _columns_of(self.end_ids, pruned)
        held_logits = logits[:held]  # [H, C]
        ends = held_logits[:, columns].clone()  # [H, E']
        held_logits[:, columns] = float("-inf")
        # a position whose only tokens were end ids (a structured output done, allowed ids) keeps them
        empty = ~torch.isfinite(held_logits).any(dim=-1)  # [H]
        held_logits[:, columns] = torch.where(empty.unsqueeze(-1), ends, held_logits[:, columns])

    def _penalise(
        self, logits: torch.Tensor, output: Sequence[int], drafts: Sequence[int], pruned: LogitColumns | None
    ) -> None:
        """vLLM's repetition, frequency and presence penalties, position i counting the output and drafts[:i]. The
        prompt's tokens take the repetition penalty at every position (their columns are the session's); the written
        ones are counted each round (a sort of the output, not of the prompt: long prompts cost no more)."""
        rules, width = self.rules, logits.shape[0]
        written = torch.tensor([*output, *drafts], dtype=torch.long, device=self.device)  # [L + D]
        ids, inverse = torch.unique(written, return_inverse=True)  # [U], [L + D] each token's place in ids
        counts = torch.zeros(width, ids.numel(), device=self.device)  # [S, U] the output's counts at each position
        counts += torch.bincount(inverse[: len(output)], minlength=ids.numel())
        if width > 1:  # position i also counts drafts[:i]
            steps = torch.nn.functional.one_hot(inverse[len(output) :][: width - 1], ids.numel()).cumsum(dim=0)
            counts[1:] += steps  # [S - 1, U]
        repeats = rules.repetition_penalty != 1
        fresh = torch.ones(ids.numel(), dtype=torch.bool, device=self.device)  # [U]
        if repeats:
            prompt = self.prompt_ids if pruned is None else self._pruned_prompt  # [P'] columns
            logits[:, prompt] = _repetition(logits[:, prompt], rules.repetition_penalty)
            fresh = ~self.in_prompt[ids]  # [U] written tokens the prompt does not hold (those took it above)
        kept, columns = _kept_columns(ids, pruned)  # [U] or None, [U'] the ids' columns
        if kept is not None:
            counts, fresh = counts[:, kept], fresh[kept]
        z = logits[:, columns]  # [S, U']
        if repeats:
            z = torch.where((counts > 0) & fresh, _repetition(z, rules.repetition_penalty), z)
        z = z - rules.frequency_penalty * counts - rules.presence_penalty * (counts > 0).float()
        logits[:, columns] = z


def _repetition(z: torch.Tensor, penalty: float) -> torch.Tensor:
    """vLLM's repetition penalty: a positive logit divided by it, a negative one multiplied."""
    return torch.where(z > 0, z / penalty, z * penalty)


def _fixed_row(rules: LogitRules, vocab_size: int, device: torch.device) -> torch.Tensor | None:
    """[V] float32: -inf off the allowed ids and at one-token bad words, plus each token's bias; None without any."""
    single = [ids[0] for ids in rules.bad_word_ids if len(ids) == 1]  # bad words of one token: refused everywhere
    if not rules.logit_bias and not rules.allowed_token_ids and not single:
        return None
    row = torch.zeros(vocab_size, dtype=torch.float32, device=device)
    if rules.allowed_token_ids:
        row.fill_(float("-inf"))
        row[torch.tensor(rules.allowed_token_ids, dtype=torch.long, device=device)] = 0.0
    if rules.logit_bias:
        ids, biases = zip(*rules.logit_bias, strict=True)
        row[torch.tensor(ids, dtype=torch.long, device=device)] += torch.tensor(biases, device=device)
    if single:
        row[torch.tensor(single, dtype=torch.long, device=device)] = float("-inf")
    return row


def _kept(ids: torch.Tensor, pruned: LogitColumns) -> torch.Tensor:
    """[U] bool: which of the token ids a pruned output layer has."""
    kept = pruned.kept
    assert kept is not None
    place = torch.searchsorted(kept, ids).clamp(max=kept.numel() - 1)
    return kept[place] == ids


def _kept_columns(ids: torch.Tensor, pruned: LogitColumns | None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(which of the token ids [U] a pruned layer has, None for a whole one; the logit columns [U'] of those)."""
    if pruned is None:
        return None, ids
    kept = _kept(ids, pruned)
    assert pruned.kept is not None
    return kept, torch.searchsorted(pruned.kept, ids[kept])


def _columns_of(ids: torch.Tensor, pruned: LogitColumns | None) -> torch.Tensor:
    """The logit columns of token ids ([U] -> [U']): the ids themselves, or a pruned layer's columns of those it has."""
    return _kept_columns(ids, pruned)[1]
