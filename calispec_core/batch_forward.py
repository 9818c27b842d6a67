"""One target forward pass over several sessions, each with its own KV cache (no gRPC here).

Sessions keep separate `DynamicCache`s of different lengths. For a batched pass their caches
are packed into one left-padded cache, the new tokens are right-padded, and an attention mask
plus explicit position ids keep every row exactly its own sequence. Afterwards each session
gets back its own cache: its old entries plus its new tokens, padding dropped.

Packing copies every session's KV once per round: O(context) memory traffic, small next to
the forward it batches. A paged KV cache (continuous batching, a later issue) removes it.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

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
    lengths = [c.get_seq_length() for c in caches]
    past, width = max(lengths), max(len(x) for x in inputs)
    device = runner.device
    input_ids = torch.zeros(len(inputs), width, dtype=torch.long, device=device)  # [B, S] right-padded
    mask = torch.zeros(len(inputs), past + width, dtype=torch.long, device=device)  # [B, P+S]
    positions = torch.zeros(len(inputs), width, dtype=torch.long, device=device)  # [B, S]
    for b, (tokens, length) in enumerate(zip(inputs, lengths, strict=True)):
        input_ids[b, : len(tokens)] = torch.tensor(tokens, device=device)
        mask[b, past - length : past + len(tokens)] = 1  # real cache entries and real new tokens
        positions[b] = torch.arange(length, length + width, device=device)
    packed = _pack(runner, caches, lengths, past)
    logits = runner.forward_batch(input_ids, mask, positions, packed, logits_to_keep=width)  # [B, S, V]
    rows = [logits[b, len(x) - k : len(x)] for b, (x, k) in enumerate(zip(inputs, keep, strict=True))]
    return rows, _unpack(runner, packed, lengths, [len(x) for x in inputs], past)


def _pack(runner: ModelRunner, caches: list[DynamicCache], lengths: list[int], past: int) -> DynamicCache:
    packed = runner.new_cache()
    if past == 0:
        return packed
    longest = caches[lengths.index(past)]  # a session with entries: the template for empty ones
    for layer in range(len(longest.layers)):
        template = longest.layers[layer]
        keys = [_left_pad(c.layers[layer].keys, template.keys, past) for c in caches]
        values = [_left_pad(c.layers[layer].values, template.values, past) for c in caches]
        packed.update(torch.cat(keys), torch.cat(values), layer)  # [B, H, P, D] each
    return packed


def _left_pad(x: torch.Tensor | None, template: torch.Tensor, past: int) -> torch.Tensor:
    """[1, H, n, D] -> [1, H, past, D] with zeros in front; an empty (never filled) layer -> all zeros."""
    if x is None or x.dim() != 4:  # a session of one prompt token has cached nothing yet
        return torch.zeros_like(template[:1])
    pad = past - x.shape[2]
    return torch.nn.functional.pad(x, (0, 0, pad, 0)) if pad else x


def _unpack(
    runner: ModelRunner, packed: DynamicCache, lengths: list[int], added: list[int], past: int
) -> list[DynamicCache]:
    caches = []
    for b, (length, new) in enumerate(zip(lengths, added, strict=True)):
        cache = runner.new_cache()
        for layer, stored in enumerate(packed.layers):
            span = slice(past - length, past + new)  # drop left padding and right-padded inputs
            cache.update(stored.keys[b : b + 1, :, span].clone(), stored.values[b : b + 1, :, span].clone(), layer)
        caches.append(cache)
    return caches
