"""Scratch (wave 30): ms of one packed bf16 oneDNN product by rows, for the 1.5B target's layer shapes.

`python packed_rows.py`: 2 threads, each shape's weights in 8 copies taken in turn (one for the output layer), so
they stream from memory as in a forward; the median of 3 timings of 8 passes. What `PADDED_BF16_ROWS` rests on
(calispec_core/onednn_linear.py).
"""

import time
from collections.abc import Callable

import torch

SHAPES = [(1536, 1536), (1536, 8960), (8960, 1536), (1536, 151936)]  # (in, out): q/o, MLP up, MLP down, output
ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def median_ms(fn: Callable[[], None], passes: int = 8) -> float:
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(passes):
            fn()
        times.append((time.perf_counter() - start) / passes * 1e3)
    return sorted(times)[1]


def product_ms(packed: list[torch.Tensor], rows: int, k: int) -> float:
    x = torch.randn(rows, k).to(torch.bfloat16)

    def run() -> None:
        for weight in packed:
            torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")

    return median_ms(run) / len(packed)


def main() -> None:
    torch.set_num_threads(2)
    print("rows:", " ".join(f"{r:>7d}" for r in ROWS))
    for k, n in SHAPES:
        copies = 8 if n < 100_000 else 1
        packed = [
            torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k).to(torch.bfloat16), 16) for _ in range(copies)
        ]
        print(f"{k}x{n}:", " ".join(f"{product_ms(packed, r, k):7.3f}" for r in ROWS))


if __name__ == "__main__":
    main()
