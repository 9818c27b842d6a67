"""Wave 50 scratch: a model's forward at 1 and 2 torch threads, interleaved per repetition in one process.

Usage: python threads_draft.py MODEL_DIR DTYPE REPS (the draft: DTYPE int8). Threads set on the compute thread.
"""

import statistics
import sys

import torch

from calispec_core.compute import compute_thread
from calispec_core.forward_costs import context_session, forward_ms
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.bench.forward import SWITCH

path, dtype, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
runner = ModelRunner(ModelSpec(path, dtype=dtype, device="cpu", threads=2, fp32_linear="default"))
if dtype == "bfloat16":
    SWITCH["packed"](runner.model)
sessions = [context_session(runner, 200, 11)]
times: dict[tuple[int, int], list[float]] = {(t, n): [] for t in (1, 2) for n in (1, 7)}
for rep in range(reps + 1):
    for n in (1, 7):
        for threads in (1, 2):
            compute_thread().run(torch.set_num_threads, threads)
            ms = forward_ms(runner, sessions, n)
            if rep:
                times[(threads, n)].append(ms)
for (threads, n), values in times.items():
    name = path.rstrip("/").split("/")[-1]
    median, least = statistics.median(values), min(values)
    print(name, dtype, "threads", threads, "tokens", n, f"median {median:.1f} ms  min {least:.1f}")
