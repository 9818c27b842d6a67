"""Scratch (wave 30): one Linear layer of the 0.5B draft's shapes, ms per call at 1 and 8 rows, 2 threads:
fbgemm int8 dynamic quantisation (the draft's path) against torch's weight-only int8 and int4 CPU kernels
(bf16 activations). Timing only: the int4 scales are not a faithful quantisation of the weights."""

import time
from collections.abc import Callable

import torch

GROUP = 64  # int4 group size
SHAPES = [(896, 4864), (4864, 896), (896, 151936)]  # (in, out): MLP up/gate, MLP down, output layer


def ms_per_call(fn: Callable[[], object], calls: int = 30) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def row_times(k: int, rows: int, dynamic: torch.nn.Module, int8: tuple, int4: tuple) -> dict[str, float]:
    x = torch.randn(rows, k)
    xb = x.to(torch.bfloat16)
    return {
        "int8 dynamic": ms_per_call(lambda: dynamic(x)),
        "int8 weight-only": ms_per_call(lambda: torch.ops.aten._weight_int8pack_mm(xb, *int8)),
        "int4 weight-only": ms_per_call(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, *int4)),
    }


def main() -> None:
    torch.set_num_threads(2)
    torch.backends.quantized.engine = "fbgemm"
    for k, n in SHAPES:
        weight = torch.randn(n, k)
        layer = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False))
        dynamic = torch.ao.quantization.quantize_dynamic(layer, {torch.nn.Linear}, dtype=torch.qint8)
        scale = weight.reshape(n, k // GROUP, GROUP).abs().amax(-1, keepdim=True).clamp(min=1e-6) / 7.5
        nibbles = (weight.reshape(n, k // GROUP, GROUP) / scale + 8).round().clamp(0, 15).to(torch.int32)
        int4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles.reshape(n, k), 1)
        int4_scales = (
            torch.stack([scale.squeeze(-1).t(), torch.zeros(k // GROUP, n)], -1).to(torch.bfloat16).contiguous()
        )
        int8_scale = weight.abs().amax(1) / 127
        int8 = (weight / int8_scale[:, None]).round().to(torch.int8)
        for rows in (1, 8):
            times = row_times(k, rows, dynamic, (int8, int8_scale.to(torch.bfloat16)), (int4, GROUP, int4_scales))
            print(f"{k}x{n} rows={rows}: " + ", ".join(f"{name} {ms:.3f} ms" for name, ms in times.items()))


if __name__ == "__main__":
    main()
