"""Scratch (wave 37): where teacher-forced calibration's time goes. Each model's `greedy_predictions` (what
`calispec calibrate` runs) over the same 32 rows (11,416 random tokens, packed 512 long), 2 threads, one model
loaded at a time: the int8 draft (served on CPU), the same draft in bf16, the bf16 target."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.calibrate.teacher import greedy_predictions

MODELS = Path.home() / ".cache/calispec/models/qwen-coder"


def main() -> None:
    torch.manual_seed(0)
    rows = [torch.randint(0, 30000, (n,)).tolist() for n in [512, 480, 300, 200, 512, 100, 400, 350] * 4]
    tokens = sum(map(len, rows))
    print("tokens", tokens)
    for name, dtype in [("draft", "int8"), ("draft", "bfloat16"), ("target", "bfloat16")]:
        runner = ModelRunner(ModelSpec(path=MODELS / name, dtype=dtype, threads=2))
        greedy_predictions(runner, rows[:2], 512)  # warm-up
        start = time.perf_counter()
        greedy_predictions(runner, rows, 512)
        seconds = time.perf_counter() - start
        print(f"{name} {dtype}: {seconds:.1f} s, {tokens / seconds:.0f} positions/s", flush=True)
        del runner


if __name__ == "__main__":
    main()
