"""Wave 46: one int8 Linear call over 512 rows of the 0.5B draft's shapes, three ways, same bits (checked).

fbgemm (torch's dynamic Linear, serving's), the recipe on `torch._int_mm` (oneDNN's gemm API: wave 43's path) and on
oneDNN's matmul primitive (`torch.ops.onednn.qlinear_pointwise`: AMX brgemm where present). Run alone:
    .venv/bin/python docs/measurements/wave46-amx/int8_gemm_paths.py [threads]
Prints the median of 7 calls after 2 warm-ups, in ms (the recipe's paths as `int8_linear` routes them).
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
import warnings

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from calispec_core import int8_gemm
from calispec_core.modeling import quantize_int8

warnings.filterwarnings("ignore")
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
ROWS = 512
SHAPES = {"mlp gate/up": (896, 4864), "mlp down": (4864, 896), "attn o": (896, 896), "head": (896, 151936)}


def median_ms(call, repeats: int = 7) -> float:
    for _ in range(2):
        call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def main() -> None:
    torch.manual_seed(0)
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, rows {ROWS}, gemm_path {int8_gemm.gemm_path()}"
    )
    print(f"{'layer':12} {'K':>5} {'N':>7} {'fbgemm':>9} {'int_mm':>9} {'matmul':>9}  same bits")
    for name, (k, n) in SHAPES.items():
        layer = quantize_int8(torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)))[0]
        x = torch.randn(ROWS, k) * 2  # [R, K]
        x[0] *= 30
        reference = DynamicQuantizedLinear.forward(layer, x)  # [R, N]
        row = {"fbgemm": median_ms(functools.partial(DynamicQuantizedLinear.forward, layer, x))}
        same = []
        for path in int8_gemm.GEMM_PATHS:
            with int8_gemm.many_rows():
                same.append(torch.equal(int8_gemm.int8_linear(layer, x, path), reference))
                row[path] = median_ms(functools.partial(int8_gemm.int8_linear, layer, x, path))
        print(f"{name:12} {k:5} {n:7} {row['fbgemm']:9.1f} {row['int_mm']:9.1f} {row['matmul']:9.1f}  {same}")


if __name__ == "__main__":
    main()
