"""Scratch (wave 33): ms of one packed bf16 oneDNN product by rows, per the row count the weight was packed for
(`_reorder_linear_weight`'s batch-size hint; calispec_core/onednn_linear.py packs for PACK_ROWS = 16).

`python pack_hints.py`: 2 threads; the 1.5B target's MLP and output shapes, each shape's weights in 8 copies taken
in turn (one for the output layer) so they stream from memory as in a forward; the median of 3 timings of 8 passes
(docs/measurements/wave30-bf16/packed_rows.py's method). Wave 33's stack trace showed a verify forward of 7-11
tokens costing ~1.2x one of 1-6: is the step in the kernel, and does the packing hint move it?"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "wave30-bf16"))
from packed_rows import product_ms

SHAPES = [(1536, 8960), (8960, 1536), (1536, 151936)]  # (in, out): MLP up, MLP down, output
ROWS = (4, 5, 6, 7, 8, 10, 12, 13, 16)
HINTS = (1, 6, 8, 12, 16)


def main() -> None:
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, 2 threads; ms a product by rows")
    print("shape        hint:", " ".join(f"{r:>7d}" for r in ROWS))
    for k, n in SHAPES:
        copies = 8 if n < 100_000 else 1
        plain = [torch.randn(n, k).to(torch.bfloat16) for _ in range(copies)]
        for hint in HINTS:
            packed = [torch.ops.mkldnn._reorder_linear_weight(w, hint) for w in plain]
            print(f"{k}x{n} {hint:5d}:", " ".join(f"{product_ms(packed, r, k):7.3f}" for r in ROWS), flush=True)
            del packed


if __name__ == "__main__":
    main()
