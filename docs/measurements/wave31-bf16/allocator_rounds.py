"""Scratch (wave 31): one process per glibc malloc setting, a verify-like round (the packed forward, the verifier's
padded logits, their argmax) by rows x new tokens, median of 5 after one warm-up, ms.

`python allocator_rounds.py SETTING target|draft`: SETTING base (glibc's defaults), keep (one arena, 256 MB
mmap threshold, 512 MB trim threshold: freed blocks stay in the process), thr (the two thresholds only), arena1
(one arena only). Run as `for m in base keep thr arena1 base keep thr arena1`. Not shipped: glibc's reuse of
freed blocks under these settings proved erratic for aligned allocations (torch's) in small processes; the
target engine keeps its padded-logits buffer itself instead (docs/performance.md, "Pages faulted in every round").
It ran on b27716f's `TargetEngine._padded_logits` (then a staticmethod allocating a fresh tensor per round).
"""

import ctypes
import statistics
import sys
import time

libc = ctypes.CDLL("libc.so.6")
if sys.argv[1] in ("keep", "arena1"):
    libc.mallopt(-8, 1)
if sys.argv[1] in ("keep", "thr"):
    libc.mallopt(-3, 256 << 20)
    libc.mallopt(-1, 512 << 20)
from pathlib import Path  # noqa: E402  (after the mallopt calls)

from calispec_core.batch_forward import forward_rows  # noqa: E402  (after the mallopt calls)
from calispec_core.compute import compute_thread  # noqa: E402  (after the mallopt calls)
from calispec_core.forward_costs import context_session  # noqa: E402  (after the mallopt calls)
from calispec_core.modeling import ModelRunner, ModelSpec  # noqa: E402  (after the mallopt calls)
from target_service.engine import TargetEngine  # noqa: E402  (after the mallopt calls)

PATH = Path.home() / f".cache/calispec/models/qwen-coder/{sys.argv[2]}"


class R:
    def __init__(self, n):
        self.draft = [0] * (n - 1)


def main(runner):
    sessions = [context_session(runner, 100 + 10 * b, 17) for b in range(8)]
    out = []
    for widths in ([1], [5], [1] * 8, [2] * 8, [4] * 8, [7] * 8, [1, 2, 3, 4, 2, 2, 1, 11]):
        ss = sessions[: len(widths)]
        rows = [R(n) for n in widths]
        ts = []
        for _rep in range(6):
            s = time.perf_counter()
            logits = forward_rows(
                runner,
                [x.cache for x in ss],
                [x.pending() + [5] * (n - 1) for x, n in zip(ss, widths, strict=True)],
                widths,
            )
            TargetEngine._padded_logits(rows, logits, max(widths) - 1).argmax(-1)
            ts.append(time.perf_counter() - s)
            for x, n in zip(ss, widths, strict=True):
                x.cache.crop(-n)
        label = "x".join(map(str, widths)) if len(set(widths)) > 1 else f"{len(widths)}x{widths[0]}"
        out.append(f"{label}: {statistics.median(ts[1:]) * 1e3:.0f}")
    print(sys.argv[1].ljust(5), " | ".join(out), flush=True)


dtype = "int8" if sys.argv[2] == "draft" else "bfloat16"
runner = ModelRunner(ModelSpec(PATH, dtype=dtype, device="cpu", threads=2))
compute_thread().run(main, runner)
