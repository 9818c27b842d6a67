"""Teacher-forced positions/s of the served bf16 target by rows a forward (512 tokens a row), 2nd call timed."""

import sys
import time
from pathlib import Path

import torch

from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.calibrate.teacher import greedy_predictions

which = sys.argv[1] if len(sys.argv) > 1 else "target"
dtype = sys.argv[2] if len(sys.argv) > 2 else "auto"
M = Path.home() / f".cache/calispec/models/qwen-coder/{which}"
runner = ModelRunner(ModelSpec(M, dtype, "cpu"))
print(which, "dtype", dtype, runner.model.dtype, "threads", torch.get_num_threads(), flush=True)
g = torch.Generator().manual_seed(0)
rows = [torch.randint(100, 20000, (512,), generator=g).tolist() for _ in range(32)]
for n in [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "1,2,4,7,8,16").split(",")]:
    times = []
    for _ in range(2):
        t = time.perf_counter()
        greedy_predictions(runner, rows[:n], 512)
        times.append(time.perf_counter() - t)
    print(f"{n:2d} rows: {times[0]:.2f} s then {times[1]:.2f} s: {n * 512 / times[1]:.0f} positions/s", flush=True)
