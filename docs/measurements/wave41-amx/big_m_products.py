"""bf16 products of many rows (teacher forcing) on this CPU: torch's F.linear, oneDNN on the plain weight,
on the weight packed for 16 rows (what the served target uses), and packed for the product's own rows."""

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F


def timed(fn: Callable[[], torch.Tensor], reps: int = 3) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def onednn(x: torch.Tensor, weight: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def main() -> None:
    torch.manual_seed(0)
    print("threads", torch.get_num_threads(), torch.__version__)
    for out_f, in_f, label in [(8960, 1536, "mlp up"), (1536, 8960, "mlp down"), (1536, 1536, "q/o")]:
        w = (torch.randn(out_f, in_f) * 0.02).bfloat16()
        p16 = torch.ops.mkldnn._reorder_linear_weight(w, 16)
        for m in (512, 4096):
            x = torch.randn(m, in_f).bfloat16()
            pm = torch.ops.mkldnn._reorder_linear_weight(w, m)
            flops = 2 * m * in_f * out_f
            res = {
                "F.linear": timed(lambda x=x, w=w: F.linear(x, w)),
                "onednn plain": timed(onednn(x, w)),
                "packed16": timed(onednn(x, p16)),
                "packedM": timed(onednn(x, pm)),
            }
            cells = " ".join(f"{k}={v * 1e3:.1f}ms/{flops / v / 1e9:.0f}GF" for k, v in res.items())
            print(label, m, cells, flush=True)


if __name__ == "__main__":
    main()
