"""The meaning guard: CSD rescues a draft token only where its form may differ, never its meaning.

The paper's premise is a rejected token "right in meaning, different in form" (`' a'` for `' the'`,
`'\\n'` for `'\\n\\n'`). Some tokens carry meaning in every character: numerals and arithmetic or
comparison operators. The correction memory counts their confusions like any other (the shipped
calibration has `'1'` for `'2'` 42 times, `' -'` for `' +'` 10 times), and a rescue of one changes a
number or an operation: a wrong answer, not a paraphrase. Added tokens (end of text, chat,
tool-call and fill-in-the-middle markers) are decisions, not forms. So each token gets a key, and a
pair is rescuable only when both tokens have the same key:

- key 0: the token has no numeral, operator or special role (most of the vocabulary; such pairs are
  left to the paper's two tests);
- key k > 0: the token's digits (`str.isdigit`: `'²'` too), ASCII operator characters and Unicode math
  symbols (category Sm: `'≤'`, `'×'`), in order (`' 12'` and `'12'` share one; `'1'` and `'2'` do not;
  `' -'` and `'-'` share one; `' -'` and `' '` do not; so do markdown's `'**'` and a comment's `'//'`,
  which the guard therefore keeps in place too); an English number word (the whole token, any case,
  `' Two'`) is keyed by its value's digits, so `' two'` and `'2'` share a key (a form), `' two'` and
  `' a'` do not (the shipped calibration counts `' one'` for `' the'` 10 times, `' two'` for `' a'` 4);
  a multiplier (`' hundred'`, `' dozen'`) has a key of its own, no digits; a bare piece is keyed too
  (`'one'` of `'ph'`+`'one'`), which errs towards withholding;
- a key of its own (< 0) for every added or special token and every id the tokenizer does not know.

Not covered: ordinals (`' first'` is as often a discourse marker), number words split over several
tokens, and operators written as words or commands (`'\\times'`); such pairs are left to the memory and
the gate, as in the paper.

This is Calispec's addition, not the paper's (docs/calibration.md, "The meaning guard"). Only the
rescue is guarded: the memory still counts every rejection event, and a target started with
`--no-meaning-guard` rescues exactly as the paper does.
"""

from __future__ import annotations

import unicodedata

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

OPERATOR_CHARACTERS = frozenset("+-*/%=<>!&|^~")
NO_KEY = 0
_UNITS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen"
)
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety"
_MULTIPLIERS = "hundred thousand million billion dozen"
NUMBER_WORDS = {  # an English number word's value, keyed as its digits are
    **{word: str(n) for n, word in enumerate(_UNITS.split())},
    **{word: str(20 + 10 * n) for n, word in enumerate(_TENS.split())},
    # a multiplier scales the word before it ("three hundred"): a key of its own, no digits ('#' is never kept)
    **{word: f"#{word}" for word in _MULTIPLIERS.split()},
}


def meaning_key(text: str) -> str:
    """What in a decoded token carries meaning in any form: a number word's value, else its digits, operators
    and math symbols."""
    word = NUMBER_WORDS.get(text.strip().lower())
    if word is not None:
        return word
    return "".join(c for c in text if c.isdigit() or c in OPERATOR_CHARACTERS or unicodedata.category(c) == "Sm")


def meaning_keys(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> Tensor:  # [V] int64
    """Every token id's key (module doc) over the model's vocabulary, which may be wider than the tokenizer's."""
    known = min(len(tokenizer), vocab_size)
    texts = tokenizer.batch_decode([[i] for i in range(known)])  # one Rust call: ~1.5 s for 152k tokens
    # every added token, special or not (`<tool_call>` is not, and would share `'<>'` with `' <>'`)
    special = set(tokenizer.added_tokens_decoder) | set(tokenizer.all_special_ids)
    ids_of_key: dict[str, int] = {"": NO_KEY}
    keys = [ids_of_key.setdefault(meaning_key(text), len(ids_of_key)) for text in texts]
    keys += [NO_KEY] * (vocab_size - known)
    out = torch.tensor(keys, dtype=torch.int64)  # [V]
    unknown = torch.arange(known, vocab_size)  # ids the tokenizer cannot decode
    own = torch.tensor(sorted(i for i in special if 0 <= i < vocab_size), dtype=torch.int64)
    for ids in (own, unknown):
        out[ids] = -1 - ids  # a key no other token has
    return out
