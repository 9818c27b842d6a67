"""A draft output layer cut down to the token ids it is likely to need (draft services only).

A byte-level BPE vocabulary numbers its tokens in merge order, roughly by frequency, so the
first K ids cover almost every token of ordinary text. Keeping only their rows (plus every
special/added token: EOS, chat-template markers) makes the draft's output layer — a quarter of
the 0.5B Qwen draft's weights at 151,936 rows — several times smaller.

Exactness is untouched: the draft then proposes from q restricted to the kept ids (zero
elsewhere) and ships exactly that q at full width, and the target's verification (greedy
comparison, or the speculative-sampling coin and residual) is exact for any proposal
distribution. Only acceptance can move, when the target wants a token the draft cannot propose.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from calispec_core.errors import require


@dataclass(frozen=True)
class LogitColumns:
    """Which token id each column of a model's logits stands for.

    A full output layer: column i is token i (`kept` is None). A pruned one: column i is
    `kept[i]`, a sorted tensor of the kept token ids.
    """

    vocab_size: int  # the model's whole vocabulary (rows of the original output layer)
    kept: torch.Tensor | None = None  # [K'] int64 sorted token ids, on the model's device

    @property
    def width(self) -> int:
        return self.vocab_size if self.kept is None else int(self.kept.shape[0])

    def token_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Token ids of logit columns (any shape)."""
        return columns if self.kept is None else self.kept[columns]

    def full_width(self, probs: torch.Tensor) -> torch.Tensor:  # [N, K'] -> [N, V]
        """Distributions over the columns as distributions over the whole vocabulary (zero off the kept ids)."""
        if self.kept is None:
            return probs
        full = probs.new_zeros(probs.shape[0], self.vocab_size)  # [N, V]
        full[:, self.kept.to(probs.device)] = probs
        return full


def kept_token_ids(keep: int, vocab_rows: int, regular_vocab: int, special_ids: Iterable[int]) -> torch.Tensor:
    """Sorted ids [0, keep) ∪ [regular_vocab, vocab_rows) ∪ special_ids (those inside the vocabulary).

    regular_vocab: where the tokenizer's ordinary (merge-ordered) tokens end; ids from there on are
    added/special tokens or padding rows, always kept.
    """
    ids = set(range(min(keep, vocab_rows)))
    ids.update(range(min(regular_vocab, vocab_rows), vocab_rows))
    ids.update(i for i in special_ids if 0 <= i < vocab_rows)
    return torch.tensor(sorted(ids), dtype=torch.long)


def special_token_ids(tokenizer: PreTrainedTokenizerBase, eos_ids: Iterable[int]) -> set[int]:
    """Every id the tokenizer treats specially: added tokens, its special tokens and the model's EOS ids."""
    ids = set(tokenizer.get_added_vocab().values())
    ids.update(tokenizer.all_special_ids)
    ids.update(eos_ids)
    return ids


def check_draft_vocab(keep: int, vocab_rows: int) -> None:
    require(keep >= 0, f"--draft-vocab must be >= 0 (0: the full output layer), got {keep}")
    require(
        keep <= vocab_rows,
        f"--draft-vocab {keep} is larger than the model's vocabulary ({vocab_rows} output rows)",
    )


def pruned_linear(weight: torch.Tensor, bias: torch.Tensor | None, rows: torch.Tensor) -> torch.nn.Linear:
    """A new Linear holding only `rows` of an output layer's [V, H] weight (and bias)."""
    rows = rows.to(weight.device)
    linear = torch.nn.Linear(weight.shape[1], rows.shape[0], bias=bias is not None)
    linear = linear.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight[rows])
        if bias is not None:
            linear.bias.copy_(bias[rows])
    return linear.requires_grad_(False)


def prune_output_layer(model: PreTrainedModel, kept: torch.Tensor) -> None:
    """Replace the model's output layer by one holding only the rows of `kept` (a new, untied Linear)."""
    head = model.get_output_embeddings()
    bias = None if head.bias is None else head.bias.detach()
    model.set_output_embeddings(pruned_linear(head.weight.detach(), bias, kept))


def kept_ids_for(
    tokenizer: PreTrainedTokenizerBase, keep: int, vocab_rows: int, eos_ids: Iterable[int]
) -> torch.Tensor:
    """The ids a layer pruned to `keep` holds for this tokenizer."""
    return kept_token_ids(keep, vocab_rows, tokenizer.vocab_size, special_token_ids(tokenizer, eos_ids))


def pruned_columns(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, keep: int, eos_ids: Iterable[int]
) -> LogitColumns:
    """Prune the model's output layer to the first `keep` ids plus the special ones (keep = 0: leave it whole)."""
    vocab_rows = int(model.get_output_embeddings().weight.shape[0])
    check_draft_vocab(keep, vocab_rows)
    if keep == 0:
        return LogitColumns(vocab_rows)
    kept = kept_ids_for(tokenizer, keep, vocab_rows, eos_ids)
    if kept.shape[0] == vocab_rows:  # nothing to cut
        return LogitColumns(vocab_rows)
    prune_output_layer(model, kept)
    return LogitColumns(vocab_rows, kept.to(model.device))
