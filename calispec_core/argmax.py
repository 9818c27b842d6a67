"""Argmax over a large vocabulary, fast on CPU (no gRPC here).

On CPU, torch's index-returning reductions (`argmax`, `max(dim)`) are scalar loops: ~0.13 ms per
151,936-wide float32 row on the 2-core AVX512 dev machine (~0.55 ms in bf16), and each call is an
OpenMP parallel region. Greedy decoding takes one argmax per drafted token and γ + 1 per verified
row, so this was a visible part of the per-round overhead (docs/performance.md, "Per-round
overhead"). Two exact replacements, both returning `torch.argmax`'s answer (the first index of the
maximum; the first NaN when there is one):

- float32 / float64: NumPy's argmax on the same memory (SIMD, one thread, no OpenMP team to wake):
  ~0.02 ms a row;
- other dtypes (bf16 logits of a teacher-forced batch): the maximum of each block of `BLOCK` logits
  (`amax` is vectorised), the first block holding the row's maximum, the first maximum inside it.

On other devices `torch.argmax` is already fast and is used as is.
"""

from __future__ import annotations

import torch

BLOCK = 128  # logits per block: 151,936 = 1,187 x 128
MIN_WIDTH = 8 * BLOCK  # narrower rows take torch.argmax directly
NUMPY_DTYPES = (torch.float32, torch.float64)


def argmax_last(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) for x of shape [..., V]; returns int64 [...]."""
    width = x.shape[-1]
    if x.device.type != "cpu" or width < MIN_WIDTH or x.numel() == 0 or x.requires_grad:
        return x.argmax(dim=-1)
    if x.dtype in NUMPY_DTYPES:
        return torch.as_tensor(x.numpy().argmax(axis=-1), dtype=torch.int64)
    return _blocked_argmax(x.reshape(-1, width)).view(x.shape[:-1])


def _blocked_argmax(rows: torch.Tensor) -> torch.Tensor:  # [R, V] -> [R]
    width = rows.shape[-1]
    body = width - width % BLOCK
    block_max = rows[:, :body].unflatten(-1, (body // BLOCK, BLOCK)).amax(dim=-1)  # [R, V // BLOCK]
    if body < width:  # the tail is one more (shorter) block
        block_max = torch.cat([block_max, rows[:, body:].amax(dim=-1, keepdim=True)], dim=-1)  # [R, nb]
    first_block = block_max.argmax(dim=-1)  # [R] the first block holding the row's maximum (or NaN)
    # [R, BLOCK] the ids of that block; a short tail repeats id V-1, which never precedes the real one
    ids = (first_block * BLOCK).unsqueeze(-1) + torch.arange(BLOCK, device=rows.device)
    ids = ids.clamp_(max=width - 1)
    inner = rows.gather(1, ids).argmax(dim=-1, keepdim=True)  # [R, 1]
    return ids.gather(1, inner).view(-1)  # [R]
