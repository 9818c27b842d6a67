"""Scratch (wave 31): one layer's attention for 8 one-token rows (H_kv 2, 7 query heads a group, D 64, 200-312
cached tokens): per-row SDPA (the services' path) against one SDPA over a pooled [S, H_kv, C, D] block with a
length mask, with and without a gather; and HF's RMSNorm against torch's rms_norm."""

import time

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

torch.set_num_threads(2)


def t(f, n=200):
    for _ in range(20):
        f()
    s = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - s) / n * 1e6


B, H, g, D = 8, 2, 7, 64
lens = [200 + 16 * b for b in range(B)]
C = 512
caches = [(torch.randn(1, H, C, D), torch.randn(1, H, C, D)) for _ in range(B)]
qs = [torch.randn(1, H, g, D) for _ in range(B)]


def per_row():
    return [sdpa(q, k[:, :, :L], v[:, :, :L]) for q, (k, v), L in zip(qs, caches, lens, strict=True)]


def per_row_math():
    out = []
    for q, (k, v), L in zip(qs, caches, lens, strict=True):
        s = (q @ k[:, :, :L].transpose(-1, -2)) * 0.125
        out.append(torch.softmax(s, -1) @ v[:, :, :L])
    return out


pool_k = torch.randn(16, H, C, D)
pool_v = torch.randn(16, H, C, D)
Lmax = max(lens)
mask = torch.arange(Lmax)[None, None, None, :] < torch.tensor(lens)[:, None, None, None]
Q = torch.randn(B, H, g, D)


def pooled():
    return sdpa(Q, pool_k[:B, :, :Lmax], pool_v[:B, :, :Lmax], attn_mask=mask)


def pooled_math():
    s = (Q @ pool_k[:B, :, :Lmax].transpose(-1, -2)) * 0.125
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ pool_v[:B, :, :Lmax]


idx = torch.tensor([0, 2, 3, 5, 6, 8, 9, 11])


def gathered():
    return sdpa(Q, pool_k[idx, :, :Lmax], pool_v[idx, :, :Lmax], attn_mask=mask)


for name, f in [
    ("per_row sdpa x8", per_row),
    ("per_row math x8", per_row_math),
    ("pooled sdpa", pooled),
    ("pooled math", pooled_math),
    ("gathered sdpa", gathered),
]:
    print(f"{name:20s} {t(f):8.1f} us per layer")
# rms norm
for T in (1, 8):
    x = torch.randn(1, T, 896)
    n = Qwen2RMSNorm(896)
    w = n.weight
    hf = t(lambda n=n, x=x: n(x))
    fused = t(lambda x=x, w=w: torch.nn.functional.rms_norm(x, (896,), w, 1e-6))
    print(T, "hf rmsnorm", hf, "F.rms_norm", fused)
    print("maxdiff", (n(x) - torch.nn.functional.rms_norm(x, (896,), w, 1e-6)).abs().max().item())
