"""The int8 draft's teacher-forced predictions over the corpus text with one scale a call (as shipped) and with row
scales, against serving's one-token steps over the first N windows; and both passes' times, interleaved in one process.

python docs/measurements/wave48-amx/teacher_row_scales.py N REPS   (from the repo root, alone on the machine)
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import torch

from calispec_core import int8_gemm
from calispec_core.argmax import argmax_last
from calispec_core.batch_forward import forward_rows
from calispec_core.compute import compute_thread
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.calibrate.corpus import encode, load_corpus, windows
from calispec_tools.calibrate.heap import keep_freed_memory
from calispec_tools.calibrate.teacher import greedy_predictions

warnings.filterwarnings("ignore")
CORPUS = Path("calispec_tools/data/calibration/corpus")


@torch.inference_mode()
def one_token_steps(runner: ModelRunner, tokens: list[int]) -> list[int]:
    cache = runner.new_cache()
    return [int(argmax_last(forward_rows(runner, [cache], [[t]], [1])[0][-1])) for t in tokens]


def main(checked: int, reps: int) -> None:
    keep_freed_memory()
    runner = ModelRunner(ModelSpec(Path.home() / ".cache/calispec/models/qwen-coder/draft", "int8"))
    compute_thread().run(int8_gemm.prepare, runner.model)
    docs = [d for d in load_corpus(CORPUS) if not d.is_prompt]
    rows = [w for d in docs for w in windows(encode(runner.tokenizer, d.text), 512)]
    paths = f"{int8_gemm.gemm_path()} / {int8_gemm.gemm_path(True)}"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; windows {len(rows)}, "
          f"tokens {sum(map(len, rows))}; gemm paths {paths}")  # fmt: skip
    times: dict[str, list[float]] = {"call": [], "row": []}
    predictions: dict[str, list[list[int]]] = {}
    for _ in range(reps):
        for mode in times:
            start = time.perf_counter()
            predictions[mode] = greedy_predictions(runner, rows, 512, row_scales=mode == "row")
            times[mode].append(time.perf_counter() - start)
    print("pass seconds (interleaved):", {k: [round(x, 1) for x in v] for k, v in times.items()})
    serving = [compute_thread().run(one_token_steps, runner, r) for r in rows[:checked]]
    total = sum(map(len, serving))
    print("windows checked against one-token steps:", [len(r) for r in serving])
    for mode, rows_predicted in predictions.items():
        same = sum(p == q for a, b in zip(rows_predicted, serving, strict=False) for p, q in zip(a, b, strict=True))
        print(f"{mode}: {same} of {total} predictions are the one-token steps' ({same / total:.1%})")
    pairs = zip(predictions["call"], predictions["row"], strict=True)
    differ = sum(p != q for a, b in pairs for p, q in zip(a, b, strict=True))
    print(f"call vs row over every window: {differ} of {sum(map(len, rows))} predictions differ")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4, int(sys.argv[2]) if len(sys.argv) > 2 else 2)
