"""One forward pass over several sessions, each with its own KV cache (no gRPC here).

Sessions keep separate caches of different lengths (calispec_core/kv_cache.py), and feed different
numbers of new tokens (a verify row: pending + its own γ drafts). For a batched pass every row's
new tokens are laid end to end in one sequence of T = Σ n_b tokens with explicit position ids, so
the linear layers (most of the cost) compute exactly T tokens, never rows padded to the longest
proposal: under lockstep at concurrency 8 the proposals in one verify batch ranged from 1 to 10
tokens, and padding them to the longest computed up to ~2x the tokens. In every layer each row's new
keys and values are written into that session's own cache, and attention runs row by row against
it (calispec_core/attention.py): no cache is copied or concatenated, the pass moves O(T) cache
entries whatever the contexts. A lone session's forward (`ModelRunner.forward`: rounds of one row,
prefill chunks) is the same pass with one row.
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from calispec_core.attention import PackedRows, causal_masks
from calispec_core.kv_cache import SessionLayer

if TYPE_CHECKING:
    from calispec_core.modeling import ModelRunner


def forward_rows(
    runner: ModelRunner, caches: list[DynamicCache], inputs: list[list[int]], keep: list[int]
) -> list[torch.Tensor]:
    """Feed inputs[b] after caches[b] for every row in one pass; each cache is extended in place.

    Returns each row's last keep[b] logits ([keep[b], V]). When the forward raises, caches may be
    extended in some layers only: `kv_cache.crop_to` each back to its old length.
    """
    if len(caches) == 1:  # the runner's own one-session forward (the same pass)
        return [runner.forward(inputs[0], caches[0], keep[0])[0]]
    return packed_forward(runner, caches, inputs, keep)


def packed_forward(
    runner: ModelRunner, caches: list[DynamicCache], inputs: list[list[int]], keep: list[int]
) -> list[torch.Tensor]:
    """`forward_rows` for any number of rows (B >= 1): the rows' new tokens end to end, attention per row."""
    device = runner.device
    lengths = [c.get_seq_length() for c in caches]  # L_b
    widths = [len(x) for x in inputs]  # n_b
    input_ids = torch.tensor([t for x in inputs for t in x], dtype=torch.long, device=device)[None]  # [1, T]
    positions = torch.cat(
        [torch.arange(length, length + n, device=device) for length, n in zip(lengths, widths, strict=True)]
    )[None]  # [1, T]
    ends = accumulate(widths)  # where each row's new tokens end in T
    wanted = [i for end, k in zip(ends, keep, strict=True) for i in range(end - k, end)]
    kept = torch.tensor(wanted, dtype=torch.long, device=device)  # [Σ keep] the positions whose logits are returned
    config = runner.model.config
    group = config.num_attention_heads // config.num_key_value_heads  # query heads per key/value head
    masks = causal_masks(lengths, widths, group, device)  # per row [g·n_b, L_b + n_b] or None
    rows = [[c.layers[i] for c in caches] for i in range(len(caches[0].layers))]  # [layer][row]
    first = 0 in lengths  # a row at position 0 (a prompt's first chunk, a riding prompt): int8_outliers.py
    if runner.decoder is not None:  # the same ops without HF's wrappers (calispec_core/lean_decoder.py)
        logits = runner.forward_lean(input_ids, positions, rows, widths, masks, kept, first_tokens=first)  # [Σ keep, V]
    else:
        packed = runner.new_cache()
        packed.layers = [_RowsLayer(layer_rows, widths, masks) for layer_rows in rows]
        logits = runner.forward_batch(input_ids, None, positions, packed, kept, first_tokens=first)[0]  # [Σ keep, V]
    return list(logits.split(keep))  # [keep[b], V] each


class _RowsLayer(DynamicLayer):
    """One layer of the batched pass: writes each row's new tokens into that row's own cache layer and
    hands attention the rows' views (`PackedRows`) instead of one concatenated tensor."""

    def __init__(self, rows: list[SessionLayer], widths: list[int], masks: list[torch.Tensor | None]) -> None:
        super().__init__()
        self.rows = rows
        self.widths = widths  # n_b
        self.masks = masks

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states, value_states: [1, H, T, D], the rows' new tokens end to end."""
        pairs = zip(
            self.rows, key_states.split(self.widths, dim=2), value_states.split(self.widths, dim=2), strict=True
        )
        for row, keys, values in pairs:
            row.append(keys, values)
        packed = PackedRows([r.keys for r in self.rows], [r.values for r in self.rows], self.widths, self.masks)
        return packed, packed

    def get_seq_length(self) -> int:
        return 0  # the mask HF builds for the pass is unused: attention masks row by row

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0
