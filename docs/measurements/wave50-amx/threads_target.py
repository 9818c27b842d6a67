"""Wave 50 scratch: the target's bf16 forward at 1 and 2 torch threads, interleaved per repetition in one process.

Usage: python threads_target.py TARGET_DIR REPS PATHS (PATHS: Linear paths of `bench.forward`, e.g. `packed`).
The thread count is set on the compute thread, where every forward runs (calispec_core/compute.py): setting it on
the main thread changes nothing (a first try of this script did, and found 1 thread as fast as 2).
"""

import statistics
import sys

import torch

from calispec_core.compute import compute_thread
from calispec_core.forward_costs import context_session, forward_ms
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.bench.forward import SWITCH

path, reps, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
runner = ModelRunner(ModelSpec(path, dtype="bfloat16", device="cpu", threads=2, fp32_linear="default"))
sessions = [context_session(runner, 200, 11)]
times: dict[tuple[str, int, int], list[float]] = {}
for rep in range(reps + 1):
    for n in (1, 7):
        for linear in paths:
            SWITCH[linear](runner.model)
            for threads in (1, 2):
                compute_thread().run(torch.set_num_threads, threads)
                ms = forward_ms(runner, sessions, n)
                if rep:  # the first pass warms up
                    times.setdefault((linear, threads, n), []).append(ms)
for key, values in sorted(times.items()):
    print(key, f"median {statistics.median(values):.1f} ms")
