"""Scratch (wave 37): a whole draft's worth of Linear weights (Qwen2.5-0.5B shapes: 24 layers of fused q/k/v,
o, fused gate/up and down, then the output layer), so each pass reads them from memory as a forward does. ms a
pass at M rows (`python weight_only_int4.py 1 7 8 56`), 2 threads: fbgemm dynamic int8 (the draft's path) against
torch's weight-only int8 and int4 CPU kernels (bf16 activations; int4 groupwise, groups of 32 and 128). Random
weights: timing only, plus the int4 product's relative error on one layer as a check of the packing."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 896, 4864, 24, 151936
SHAPES = [(HIDDEN, 1152), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTERMEDIATE), (INTERMEDIATE, HIDDEN)] * LAYERS
SHAPES.append((HIDDEN, VOCAB))  # (in, out)
Pass = Callable[[list[torch.Tensor]], list[torch.Tensor]]


def int4_pack(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed int4 weight, [K/group, N, 2] bf16 scales and zeros, the dequantised weight) of a [N, K] weight."""
    n, k = weight.shape
    grouped = weight.float().reshape(n, k // group, group)
    high, low = grouped.amax(-1), grouped.amin(-1)
    scales = (high - low).clamp(min=1e-6) / 15
    zeros = low + scales * 8
    q = ((grouped - low[..., None]) / scales[..., None]).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_zeros = torch.stack([scales, zeros], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    dequantised = (q.reshape(n, k // group, group).float() - 8) * scales[..., None] + zeros[..., None]
    return packed, scales_zeros, dequantised.reshape(n, k)


def passes(weights: list[torch.Tensor]) -> tuple[dict[str, tuple[Pass, bool]], list[tuple]]:
    """name -> (one pass over every layer, whether it takes bf16 activations); and the int4 packs (groups of 32)."""
    linears = []
    for w in weights:
        linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        linear.weight.data = w
        linears.append(linear)
    fbgemm = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(*linears), {torch.nn.Linear}, torch.qint8)
    int8 = []
    for w in weights:
        scale = w.abs().amax(1) / 127
        int8.append(((w / scale[:, None]).round().to(torch.int8), scale.to(torch.bfloat16)))
    int4 = {g: [int4_pack(w, g) for w in weights] for g in (32, 128)}

    def int4_pass(group: int) -> Pass:
        return lambda xs: [
            torch.ops.aten._weight_int4pack_mm_for_cpu(x, p, group, sz)
            for (p, sz, _), x in zip(int4[group], xs, strict=True)
        ]

    def int8_pass(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.ops.aten._weight_int8pack_mm(x, w, s) for (w, s), x in zip(int8, xs, strict=True)]

    table: dict[str, tuple[Pass, bool]] = {
        "fbgemm int8": (lambda xs: [m(x) for m, x in zip(fbgemm, xs, strict=True)], False),
        "int8 w-only": (int8_pass, True),
        "int4 g32": (int4_pass(32), True),
        "int4 g128": (int4_pass(128), True),
    }
    return table, int4[32]


def median_ms(fn: Pass, xs: list[torch.Tensor]) -> float:
    fn(xs)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        fn(xs)
        times.append(time.perf_counter() - start)
    return sorted(times)[2] * 1e3


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    weights = [torch.randn(out, k) * 0.02 for k, out in SHAPES]
    table, packs = passes(weights)
    packed, scales_zeros, dequantised = packs[2]  # the fused gate/up layer of the first decoder layer
    for rows in [int(a) for a in sys.argv[1:]] or [1, 7, 8, 16, 56]:
        xs = [torch.randn(rows, k) for k, _ in SHAPES]
        xb = [x.to(torch.bfloat16) for x in xs]
        reference = xs[2] @ dequantised.t()
        got = torch.ops.aten._weight_int4pack_mm_for_cpu(xb[2], packed, 32, scales_zeros).float()
        error = (got - reference).abs().max().item() / reference.abs().max().item()
        timings = {name: median_ms(fn, xb if bf16 else xs) for name, (fn, bf16) in table.items()}
        line = "  ".join(f"{name} {ms:6.1f} ms" for name, ms in timings.items())
        print(f"M={rows:3d} {line}  (int4 rel err {error:.3f})", flush=True)


if __name__ == "__main__":
    main()
