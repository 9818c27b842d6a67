"""The attention the model services load: SDPA, plus the batched pass's per-row attention (no gRPC here).

A batched pass (calispec_core/batch_forward.py) feeds several sessions' new tokens end to end through
the model's linear layers, but each session's keys and values stay in its own cache
(calispec_core/kv_cache.py): nothing is concatenated. So the cache update of such a pass returns
`PackedRows` instead of one key and one value tensor, and attention runs row by row: row b's queries
against row b's own cache views, causal within its new tokens. Everything else (one session's
forward, teacher forcing, generation) is Hugging Face's SDPA attention unchanged.

Grouped-query attention without copies: the query heads that share a key/value head are folded into
that head's query rows ([1, H_q, n, D] -> [1, H_kv, g·n, D]), so SDPA reads each cached head once
(repeating the keys per query head, as HF's path does under a mask, copies the row's whole cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.functional import scaled_dot_product_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "calispec_sdpa"  # the attn_implementation name models are loaded with


@dataclass(frozen=True)
class PackedRows:
    """One layer of a batched pass, as its attention sees it (the key and the value argument alike)."""

    keys: list[torch.Tensor]  # [1, H_kv, L_b + n_b, D] per row: views of each session's own cache
    values: list[torch.Tensor]  # [1, H_kv, L_b + n_b, D] per row
    widths: list[int]  # n_b: the row's new tokens, its queries, end to end in the pass
    masks: list[torch.Tensor | None]  # [g·n_b, L_b + n_b] bool per row (`causal_masks`); None where n_b = 1


def causal_masks(lengths: list[int], widths: list[int], group: int, device: torch.device) -> list[torch.Tensor | None]:
    """Per row: new token i (at position L_b + i) sees keys 0 .. L_b + i; repeated for the `group` query
    heads folded onto each key/value head (rows (g, i)). Built once per pass, shared by every layer."""
    masks: list[torch.Tensor | None] = []
    for length, width in zip(lengths, widths, strict=True):
        if width == 1:
            masks.append(None)
            continue
        keys = torch.arange(length + width, device=device)  # [L_b + n_b]
        mask = keys[None, :] <= (length + torch.arange(width, device=device))[:, None]  # [n_b, L_b + n_b]
        masks.append(mask.repeat(group, 1))  # [g·n_b, L_b + n_b]
    return masks


def rows_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, H_q, T, D]
    key: torch.Tensor | PackedRows,
    value: torch.Tensor | PackedRows,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Returns [1, T, H_q, D] like HF's attention functions; plain tensors go to HF's SDPA attention."""
    if not isinstance(key, PackedRows):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    heads, dim = query.shape[1], query.shape[-1]
    outputs = [
        grouped_attention(q, k, v, mask, scaling)  # [1, H_q, n_b, D]
        for q, k, v, mask in zip(query.split(key.widths, dim=2), key.keys, key.values, key.masks, strict=True)
    ]
    out = torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]  # [1, H_q, T, D]
    return out.transpose(1, 2).reshape(1, -1, heads, dim), None


def grouped_attention(
    query: torch.Tensor,  # [1, H_q, n, D]
    key: torch.Tensor,  # [1, H_kv, K, D]
    value: torch.Tensor,  # [1, H_kv, K, D]
    mask: torch.Tensor | None,  # [g·n, K] bool, rows (g, i)
    scaling: float | None,
) -> torch.Tensor:  # [1, H_q, n, D]
    _, heads, width, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    folded = query.reshape(1, kv_heads, group * width, dim)  # query head h -> kv head h // group, rows (g, i)
    out = scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)  # [1, H_kv, g·n, D]
    return out.reshape(1, heads, width, dim)


def register() -> str:
    """Make `ATTENTION` loadable (idempotent); returns its name."""
    AttentionInterface.register(ATTENTION, rows_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION
