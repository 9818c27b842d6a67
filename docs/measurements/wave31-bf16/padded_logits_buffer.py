"""Scratch (wave 31): a verify-like round of the bf16 target (the packed forward, the padded logits, their argmax)
with the logits padded into a fresh zeroed tensor each round (before) or into the engine's kept buffer (now),
interleaved per repetition in one process; rows x new tokens, median of 7 after one warm-up, ms.
"""

import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from calispec_core.batch_forward import forward_rows
from calispec_core.compute import compute_thread
from calispec_core.forward_costs import context_session
from calispec_core.modeling import ModelRunner, ModelSpec
from target_service.engine import TargetEngine
from target_service.pair_table import PairTable

TARGET = Path.home() / ".cache/calispec/models/qwen-coder/target"
SHAPES = ([2] * 8, [4] * 8, [7] * 8, [1, 2, 3, 4, 2, 2, 1, 11], [11] * 4)


def fresh(rows, logits, width):  # the engine's padding before wave 31
    padded = torch.zeros(len(rows), width + 1, logits[0].shape[-1], dtype=torch.float32)
    for b, (row, row_logits) in enumerate(zip(rows, logits, strict=True)):
        padded[b, : len(row.draft) + 1] = row_logits
    return padded


def main(runner: ModelRunner) -> None:
    engine = TargetEngine(runner, 8, PairTable(runner.vocab_size))
    sessions = [context_session(runner, 100 + 10 * b, 17) for b in range(8)]
    for widths in SHAPES:
        rows, ss = [SimpleNamespace(draft=[5] * (n - 1)) for n in widths], sessions[: len(widths)]
        times = {"fresh": [], "kept": []}
        for rep in range(8):
            for name, pad in (("fresh", fresh), ("kept", engine._padded_logits)):
                start = time.perf_counter()
                inputs = [s.pending() + r.draft for s, r in zip(ss, rows, strict=True)]
                logits = forward_rows(runner, [s.cache for s in ss], inputs, widths)
                pad(rows, logits, max(widths) - 1).argmax(-1)
                elapsed = time.perf_counter() - start
                for s, n in zip(ss, widths, strict=True):
                    s.cache.crop(-n)
                if rep:
                    times[name].append(elapsed * 1000)
        before, now = statistics.median(times["fresh"]), statistics.median(times["kept"])
        label = "x".join(map(str, widths)) if len(set(widths)) > 1 else f"{len(widths)}x{widths[0]}"
        print(f"{label:18s} fresh {before:6.0f} ms   kept {now:6.0f} ms   kept/fresh {now / before:.2f}", flush=True)


if __name__ == "__main__":
    print(f"torch {torch.__version__}, bf16 target, 2 threads")
    runner = ModelRunner(ModelSpec(TARGET, dtype="bfloat16", device="cpu", threads=2))
    compute_thread().run(main, runner)
