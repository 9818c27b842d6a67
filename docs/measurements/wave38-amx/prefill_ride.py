"""Scratch (wave 38): what a prompt's prefill costs alone, and what it adds riding in a batched round's forward.

`python docs/measurements/wave38-amx/prefill_ride.py MODEL_DIR DTYPE ROW_TOKENS [PROMPT_TOKENS] [REPS]`: 8 sessions of
200-328 cached tokens (as `bench forward --batch 8`), each feeding ROW_TOKENS new tokens (a verify of 4 a row on the
target, a draft step of 1 on the draft), against one fresh session's prefill of PROMPT_TOKENS (default 30) alone, and
both in one packed forward (`forward_rows`, what the services run). Median ms of REPS (default 7), interleaved.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from calispec_core.batch_forward import forward_rows
from calispec_core.forward_costs import context_session
from calispec_core.modeling import ModelRunner, ModelSpec, wait_for


def timed(runner: ModelRunner, caches: list, inputs: list[list[int]], keep: list[int]) -> float:
    start = time.perf_counter()
    forward_rows(runner, caches, inputs, keep)
    wait_for(runner.device)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    model, dtype, row_tokens = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    prompt_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 30
    reps = int(sys.argv[5]) if len(sys.argv) > 5 else 7
    runner = ModelRunner(ModelSpec(model, dtype=dtype, device="cpu"))
    sessions = [context_session(runner, 200 + 16 * b, 32) for b in range(8)]
    rows = [s.pending() + [5] * (row_tokens - 1) for s in sessions]
    prompt = [(2000 + i) % (runner.vocab_size - 1) for i in range(prompt_tokens)]
    caches = [s.cache for s in sessions]
    times: dict[str, list[float]] = {"round": [], "prefill": [], "both": []}
    for rep in range(reps + 1):
        for name in times:
            fresh = runner.new_cache()
            if name == "round":
                ms = timed(runner, caches, rows, [row_tokens] * 8)
            elif name == "prefill":
                ms = timed(runner, [fresh], [prompt], [1])
            else:
                ms = timed(runner, [*caches, fresh], [*rows, prompt], [row_tokens] * 8 + [1])
            if name != "prefill":
                for cache in caches:
                    cache.crop(-row_tokens)
            if rep:
                times[name].append(ms)
    med = {name: statistics.median(ms) for name, ms in times.items()}
    print(f"{model.name} {runner.dtype_name}: 8 rows x {row_tokens} tokens {med['round']:.1f} ms; "
          f"a {prompt_tokens}-token prefill alone {med['prefill']:.1f} ms; both in one forward {med['both']:.1f} ms "
          f"(the prefill adds {med['both'] - med['round']:.1f} ms riding)")  # fmt: skip


if __name__ == "__main__":
    main()
