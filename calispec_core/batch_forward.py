"""One forward pass over several sessions, each with its own KV cache (no gRPC here).

Sessions keep separate `DynamicCache`s of different lengths, and feed different numbers of new
tokens (a verify row: pending + its own γ drafts). For a batched pass every row's new tokens
are laid end to end in one sequence of T = Σ n_b tokens, after every row's cache laid end to end
(P = Σ L_b entries), and a block mask lets each token see only its own row's cache entries and
its own row's earlier new tokens; explicit position ids keep every row at its own positions.
So the linear layers (most of the cost) compute exactly T tokens, never rows padded to the
longest proposal: under lockstep at concurrency 8 the proposals in one verify batch ranged
from 1 to 10 tokens, and padding them to the longest computed up to ~2x the tokens. Attention
then spans P + T keys per query (masked), which is small next to the linear layers at the
contexts served here; a varlen attention kernel (e.g. FlashAttention's) avoids even that.
Afterwards each session gets back its own cache: its old entries plus its new tokens.

Concatenating copies every session's KV once per batched pass: O(context) memory traffic,
small next to the forward it batches. A paged KV cache removes it.
"""

from __future__ import annotations

from itertools import accumulate

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from calispec_core.modeling import ModelRunner


def forward_rows(
    runner: ModelRunner, caches: list[DynamicCache], inputs: list[list[int]], keep: list[int]
) -> tuple[list[torch.Tensor], list[DynamicCache]]:
    """Feed inputs[b] after caches[b] for every row in one pass.

    Returns each row's last keep[b] logits ([keep[b], V]) and its cache extended by inputs[b]
    (the same object when there is one row, new objects otherwise).
    """
    if len(caches) == 1:
        return [runner.forward(inputs[0], caches[0], keep[0])[0]], caches
    device = runner.device
    lengths = [c.get_seq_length() for c in caches]  # L_b
    widths = [len(x) for x in inputs]  # n_b
    input_ids = torch.tensor([t for x in inputs for t in x], dtype=torch.long, device=device)[None]  # [1, T]
    positions = torch.cat(
        [torch.arange(length, length + n, device=device) for length, n in zip(lengths, widths, strict=True)]
    )[None]  # [1, T]
    ends = accumulate(widths)  # where each row's new tokens end in T
    wanted = [i for end, k in zip(ends, keep, strict=True) for i in range(end - k, end)]
    kept = torch.tensor(wanted, device=device)  # [Σ keep] the positions whose logits are returned
    packed = runner.new_cache()
    packed.layers = [_RowsLayer([c.layers[i] for c in caches], widths) for i in range(len(packed.layers))]
    mask = _block_mask(lengths, widths, device)  # [1, 1, T, P + T]
    logits = runner.forward_batch(input_ids, mask, positions, packed, logits_to_keep=kept)[0]  # [Σ keep, V]
    rows = list(logits.split(keep))  # [keep[b], V] each
    return rows, _split(runner, packed, lengths, widths)


class _RowsLayer(DynamicLayer):
    """One layer of the batched pass: every row's cached entries, each followed by its new tokens'
    ([1, H, L_0 + n_0 + L_1 + n_1 + ..., D]), built in one copy when the forward adds the new
    tokens, so that each row's cache afterwards is a view of it."""

    def __init__(self, rows: list[DynamicLayer], widths: list[int]) -> None:
        super().__init__()
        self.rows = [(r.keys, r.values) if r.get_seq_length() else None for r in rows]
        self.widths = widths  # n_b

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states, value_states: [1, H, T, D], the rows' new tokens end to end."""
        widths = self.widths
        new_keys, new_values = key_states.split(widths, dim=2), value_states.split(widths, dim=2)
        keys, values = [], []
        for old, k, v in zip(self.rows, new_keys, new_values, strict=True):
            if old is not None:
                keys.append(old[0])
                values.append(old[1])
            keys.append(k)
            values.append(v)
        self.keys, self.values = torch.cat(keys, dim=2), torch.cat(values, dim=2)
        self.is_initialized = True
        return self.keys, self.values


def _block_mask(lengths: list[int], widths: list[int], device: torch.device) -> torch.Tensor:
    """[1, 1, T, P + T] bool, True where a new token (query) may attend to a key; keys in the
    layout of `_RowsLayer` (each row's cached entries, then its new tokens). Built with tensor ops,
    not per-key Python lists: P grows with the context."""
    cached = torch.tensor(lengths, device=device)  # [B] L_b
    new = torch.tensor(widths, device=device)  # [B] n_b
    spans = cached + new  # [B] each row's keys
    key_row = torch.repeat_interleave(torch.arange(len(widths), device=device), spans)  # [P + T]
    # offset: a key's place within its own row
    offset = torch.arange(int(spans.sum()), device=device) - (spans.cumsum(0) - spans)[key_row]  # [P + T]
    first_new = (new.cumsum(0) - new)[key_row]  # [P + T] where the key's row starts among the new tokens
    is_new = offset >= cached[key_row]
    key_index = torch.where(is_new, first_new + offset - cached[key_row], -1)  # [P + T] -1: a cached entry
    query_row = torch.repeat_interleave(torch.arange(len(widths), device=device), new)  # [T]
    query_index = torch.arange(int(new.sum()), device=device)  # [T]
    own_row = query_row[:, None] == key_row[None, :]  # [T, P + T]
    visible = key_index[None, :] <= query_index[:, None]  # cached entries (-1) and earlier new tokens
    return (own_row & visible)[None, None]


def _split(runner: ModelRunner, packed: DynamicCache, lengths: list[int], widths: list[int]) -> list[DynamicCache]:
    """Each row's own cache: a view of its span of the batched layers (no copy)."""
    caches = []
    start = 0
    for length, width in zip(lengths, widths, strict=True):
        span = slice(start, start + length + width)
        cache = runner.new_cache()
        for layer, stored in zip(cache.layers, packed.layers, strict=True):
            layer.lazy_initialization(stored.keys, stored.values)
            layer.keys, layer.values = stored.keys[:, :, span], stored.values[:, :, span]
        caches.append(cache)
        start = span.stop
    return caches
