"""Where teacher-forced calibration's time goes: each model's greedy_predictions over the same packed rows."""
import time, torch
from pathlib import Path
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.calibrate.teacher import greedy_predictions
M = Path.home() / ".cache/calispec/models/qwen-coder"
torch.manual_seed(0)
rows = [torch.randint(0, 30000, (n,)).tolist() for n in [512, 480, 300, 200, 512, 100, 400, 350] * 4]
print("tokens", sum(map(len, rows)))
for name, dtype in [("draft", "int8"), ("draft", "bfloat16"), ("target", "bfloat16")]:
    r = ModelRunner(ModelSpec(path=M / name, dtype=dtype, threads=2))
    greedy_predictions(r, rows[:2], 512)
    t = time.perf_counter(); greedy_predictions(r, rows, 512); dt = time.perf_counter() - t
    print(f"{name} {dtype}: {dt:.1f} s, {sum(map(len, rows)) / dt:.0f} positions/s", flush=True)
    del r
